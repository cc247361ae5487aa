"""Reader of the WAN testbed's selfcheck for the goals table: the emulated path against what it was built to be."""

from __future__ import annotations

from pathlib import Path

from fstream_bench.core.readers import yes


def selfcheck(doc: dict, _: Path) -> tuple[str, str]:
    r = doc["result"]
    return (f"iperf3 -P {r.get('parallel', 16)} at {r['rate_ratio']:.3f} of the expected goodput; "
            f"RTT {r['rtt_ms']:.1f} ms "
            f"({r['rtt_error_ms']:+.1f} ms; {len(r.get('rtt_echo_samples_ms', []))} samples, median)",
            yes(abs(r["rate_ratio"] - 1) <= 0.05 and abs(r["rtt_error_ms"]) <= 2))
