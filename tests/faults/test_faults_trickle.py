"""Fault row: one data stream slowed to a crawl by an in-path proxy (issue 8).

Must hold: the stall is detected by the progress floor (64 kbit/s over ``--stall-timeout``),
the session is retried within a bound, and the transfer ends verified, resuming what had
arrived (only missing ranges are sent again).
"""

from __future__ import annotations

import random
import time

from faultkit import Proxy, write_files
from invariants import check, manifest

STALL_S = 4.0


def test_one_stream_trickling_is_detected_as_a_stall_and_retried(tmp_path, agents, seed):
    rnd = random.Random(seed)
    sizes = {"data.bin": rnd.randint(6, 12) << 20}
    src = write_files(tmp_path / "src", sizes, seed)
    want = manifest(src, "out")
    rx = agents.receiver(tmp_path / "dst")
    proxy = Proxy(("127.0.0.1", rx.port))
    proxy.throttle_first_data = 2000.0  # the first data stream that carries a block: 16 kbit/s
    t0 = time.monotonic()
    try:
        rc, res, log = agents.send([src / "data.bin"], proxy.port, cc=1, p=2, pp=1,
                                   extra=("--stall-timeout", f"{STALL_S}s", "--block-size", "256KiB"),
                                   timeout=60)
    finally:
        proxy.close()
    took = time.monotonic() - t0
    assert sum(proxy.throttled_bytes.values()) > 0, "no data stream was throttled (test set-up)"
    assert rc == 0 and res and res["ok"], f"exit {rc}: {res and res['failures']}\n{log[-3000:]}"
    assert "stalled" in log and "below the progress floor" in log, log[-3000:]
    assert log.count("reconnecting") == 1, f"expected one stall and one retry:\n{log[-3000:]}"
    assert took < STALL_S + 20, f"stall retried only after {took:.1f} s"
    check(rx.root, want, results=[res], require=want).assert_ok()
    # bytes that had arrived are kept: only what the stalled session had in flight is sent again
    # (bytes_sent counts every session's blocks, including those lost in the trickling stream)
    assert res["bytes_sent"] - res["bytes"] <= res["bytes"] - res["resumed_bytes"], res
    assert res["resumed_bytes"] > 0, f"nothing that had arrived was kept: {res}"
