"""Readers for issue 29's goals (the data path, round two): from a loopback, gil or flow result to (measured, met).

Every figure is the median and range over the run's repeats, each ratio taken within one repeat
(``goal_readers._ratios``); ``fstream_bench.goals`` says which result each goal reads.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from fstream_bench.tuning.pathfill import pathfill_ratios
from fstream_bench.core.runstats import med_range


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def _loopback_runs(doc: dict) -> dict[tuple[str, str], dict[int, dict]]:
    runs: dict[tuple[str, str], dict[int, dict]] = defaultdict(dict)
    for r in doc["results"]:
        if r.get("ok"):
            runs[(r["case"], r["tool"])][r["repeat"]] = r
    return runs


def _ratios(doc: dict, case: str, a: str, b: str, key) -> list[float]:
    """``key(run a) / key(run b)`` for every repeat where both ran: ratios within one repeat."""
    runs = _loopback_runs(doc)
    ra, rb = runs[(case, a)], runs[(case, b)]
    out = [key(ra[i]) / key(rb[i]) for i in sorted(ra) if i in rb and key(rb[i])]
    if not out:
        raise ValueError(f"no repeat of {case!r} has both {a} and {b}")
    return out


def _tput(r: dict) -> float:
    return r["throughput_bps"]


def _cpu(r: dict) -> float:
    return r["cpu_src_s"] + r["cpu_dst_s"]

BIG = ("a: 1 GiB, p=1", "a: 1 GiB, p=4")
FILES_C = "c: 2000 files of 1 byte, cc=4, pp"
FILES_B = "b: 2000 files, cc=4, pp"
TINY = "z: 1 file of 1 byte"


def cpu_vs_fast(doc: dict, _: Path) -> tuple[str, str]:
    """FStream's CPU (both sides) over GridFTP ``-fast``'s and over GridFTP with its checksum, 1 GiB at p = 1, 4."""
    parts, ok = [], True
    for case in BIG:
        fast = _ratios(doc, case, "fstream", "gridftp", _cpu)
        md5 = _ratios(doc, case, "fstream", "gridftp+md5", _cpu)
        parts.append(f"{case.split(': ', 1)[-1]}: {med_range(fast)}× `-fast`, {med_range(md5)}× with its checksum")
        ok = ok and statistics.median(fast) <= 1.25
    return "; ".join(parts) + " (CPU-s both sides)", _yes(ok)


def receiver_core(doc: dict, _: Path) -> tuple[str, str]:
    """What the receiver's one core moves: bytes over its CPU-seconds, 1 GiB at p = 4, checksum on."""
    runs = _loopback_runs(doc)[("a: 1 GiB, p=4", "fstream")].values()
    rate = [r["bytes"] * 8 / r["cpu_dst_s"] / 1e9 for r in runs]
    tput = [_tput(r) / 1e9 for r in runs]
    return (f"{med_range(rate)} Gbit/s per receiver CPU-second (throughput {med_range(tput)} Gbit/s)",
            _yes(statistics.median(rate) >= 12))


def per_file(doc: dict, _: Path) -> tuple[str, str]:
    """Sender CPU per file without data (2000 one-byte files net of one), and 2000 × 256 KiB against ``-fast``."""
    runs = _loopback_runs(doc)
    c, z = runs[(FILES_C, "fstream")], runs[(TINY, "fstream")]
    us = [(c[i]["cpu_src_s"] - z[i]["cpu_src_s"]) / 1999 * 1e6 for i in sorted(c) if i in z]
    gus = [(runs[(FILES_C, "gridftp")][i]["cpu_src_s"] - runs[(TINY, "gridftp")][i]["cpu_src_s"]) / 1999 * 1e6
           for i in sorted(c) if i in runs[(FILES_C, "gridftp")] and i in runs[(TINY, "gridftp")]]
    b = _ratios(doc, FILES_B, "fstream", "gridftp", _tput)
    return (f"sender {med_range(us, '{:.0f}')} µs per file (GridFTP's client {med_range(gus, '{:.0f}')}); 2000 × 256 KiB "
            f"{med_range(b)}× GridFTP `-fast`", _yes(statistics.median(us) <= 120 and statistics.median(b) >= 1.0))


def startup(doc: dict, _: Path) -> tuple[str, str]:
    """``fstream send`` of one 1-byte file: the sending process's CPU-seconds."""
    xs = [r["cpu_src_s"] for r in _loopback_runs(doc)[(TINY, "fstream")].values()]
    return f"{med_range(xs, '{:.3f}')} CPU-s", _yes(statistics.median(xs) <= 0.12)


def gil_receiver(doc: dict, _: Path) -> tuple[str, str]:
    """The receiver's GIL-held CPU per GB, 1 GiB at p = 4: as sampled (the interpreter's share of its CPU, perf),
    and the bound (its CPU outside the timed GIL-free calls); met on the sampled figure."""
    s = doc["summary"]["big"]
    held, cpu, sampled = s["rx_held"], s["rx_cpu"], s.get("rx_held_sampled")
    if sampled is None:
        return (f"receiver ≤ {held['median']:.3f} s per GB (bound only: perf did not run)", "no")
    return (f"receiver {sampled['median']:.3f} ({sampled['min']:.3f}–{sampled['max']:.3f}) s per GB sampled "
            f"(bound {held['median']:.3f}) of {cpu['median']:.3f} CPU-s", _yes(sampled["median"] <= 0.05))


def flow_small(doc: dict, _: Path) -> tuple[str, str]:
    """flow / plain ``send`` for the small-file set, per repeat."""
    rows = [r for r in doc["throughput"] if r["size"] <= 1 << 20]
    parts, ok = [], True
    for r in rows:
        xs = [a / b for a, b in zip(r["runs_bps"]["flow"], r["runs_bps"]["send"])]
        parts.append(f"{r['files']:,} × {r['size'] // 1024:,} KiB: {med_range(xs)}")
        ok = ok and statistics.median(xs) >= 0.97
    return "; ".join(parts) + " of `send`", _yes(ok and bool(rows))


def wan_no_regression(doc: dict, _: Path) -> tuple[str, str]:
    """Emulated WAN: large files over ``iperf3 -P 16`` in the same round, 1000 × 1 MiB over the link's payload rate."""
    r = pathfill_ratios(doc["rows"], doc["config"]["link_payload_bps"])
    large, small = r["large / iperf3"], r["small / link"]
    return (f"large {med_range(large)} of `iperf3 -P 16`; 1000 × 1 MiB {med_range(small)} of the link",
            _yes(statistics.median(large) >= 0.95 and statistics.median(small) >= 0.85))
