"""Readers of the data path room's results for the goals table: loopback against GridFTP (throughput, CPU, disk,
per file, start-up), the receiver's GIL, flow, and authorization's cost. Each turns one result into (measured, met).

Every figure is the median and range over the run's repeats, each ratio taken within one repeat (``_ratios``);
``fstream_bench.datapath.goals`` says which result each goal reads with which reader.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from fstream_bench.core.readers import yes
from fstream_bench.core.runstats import med_range
from fstream_bench.datapath.loopback import disk_goal, disk_ratios


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


def loopback_throughput(case: str):
    def measure(doc: dict, _: Path) -> tuple[str, str]:
        fast = _ratios(doc, case, "fstream", "gridftp", _tput)
        md5 = _ratios(doc, case, "fstream", "gridftp+md5", _tput)
        return (f"{med_range(fast)}× GridFTP `-fast`; {med_range(md5)}× GridFTP with its checksum on",
                yes(statistics.median(fast) >= 1.5))
    return measure


def cpu_of_gridftp(cases: list[str] | tuple[str, ...], limit: float, second: tuple[str, str], cell: str,
                   tail: str):
    """FStream's CPU-seconds (both sides) over GridFTP ``-fast``'s per case, met at a median ≤ ``limit`` on every
    case, with a second ratio of the same runs (``second``: its two tools) quoted beside it; ``cell`` formats a
    case (``{case}``, ``{first}``, ``{second}``), ``tail`` ends the text."""
    def measure(doc: dict, _: Path) -> tuple[str, str]:
        parts, ok = [], True
        for case in cases:
            r = _ratios(doc, case, "fstream", "gridftp", _cpu)
            r2 = _ratios(doc, case, *second, _cpu)
            parts.append(cell.format(case=case.split(": ", 1)[-1], first=med_range(r), second=med_range(r2)))
            ok = ok and statistics.median(r) <= limit
        return "; ".join(parts) + tail, yes(ok)
    return measure


def loopback_cpu(cases: list[str]):
    """Issue 13: ≤ GridFTP ``-fast``'s CPU, with FStream's without the checksum beside it."""
    return cpu_of_gridftp(cases, 1.0, ("fstream-noverify", "gridftp"),
                          "{case}: {first} (without the checksum {second})", " of GridFTP's CPU-s, both sides")


def _disk_parts(doc: dict, goal) -> tuple[list[str], bool, float]:
    """Each disk case's ratios to dd (``disk_ratios``) as text, whether every median meets ``goal(case)``, and the
    ceilings' median (bit/s)."""
    parts, ok, ceiling = [], True, 0.0
    for case in [c for c in doc["cases"] if c.startswith("d:")]:
        xs, ceiling = disk_ratios(doc, case)
        parts.append(f"{case.split(', disk')[0][3:]}: {med_range(xs)}")
        ok = ok and bool(xs) and statistics.median(xs) >= goal(case)
    return parts, ok, ceiling


def loopback_disk(doc: dict, _: Path) -> tuple[str, str]:
    """Issue 13: both disk cases ≥ 0.9 of ``dd conv=fdatasync``."""
    parts, ok, ceiling = _disk_parts(doc, lambda _case: 0.9)
    return "; ".join(parts) + f" of `dd conv=fdatasync` ({ceiling / 1e9:.1f} Gbit/s)", yes(ok)


def disk_files(doc: dict, _: Path) -> tuple[str, str]:
    """Issue 43: one large file ≥ 0.9 and 2000 files ≥ 0.6 of ``dd conv=fdatasync``, with the filesystem named."""
    parts, ok, ceiling = _disk_parts(doc, disk_goal)
    disk = doc.get("disk") or {}
    fs = f"{disk.get('type', '?')}{'' if disk.get('journal', True) else ' without a journal'}" if disk else "?"
    paired = "paired per repeat" if doc.get("disk_ceiling_paired") else "median of the run's"
    return (f"{'; '.join(parts)} of `dd conv=fdatasync` ({paired}, {ceiling / 1e9:.1f} Gbit/s; {fs})",
            yes(ok))


BIG = ("a: 1 GiB, p=1", "a: 1 GiB, p=4")
FILES_C = "c: 2000 files of 1 byte, cc=4, pp"
FILES_B = "b: 2000 files, cc=4, pp"
TINY = "z: 1 file of 1 byte"

#: issue 29: ≤ 1.25× GridFTP ``-fast``'s CPU, 1 GiB at p = 1 and 4, with GridFTP's own checksum beside it
cpu_vs_fast = cpu_of_gridftp(BIG, 1.25, ("fstream", "gridftp+md5"),
                             "{case}: {first}× `-fast`, {second}× with its checksum", " (CPU-s both sides)")


def receiver_core(doc: dict, _: Path) -> tuple[str, str]:
    """What the receiver's one core moves: bytes over its CPU-seconds, 1 GiB at p = 4, checksum on."""
    runs = _loopback_runs(doc)[("a: 1 GiB, p=4", "fstream")].values()
    rate = [r["bytes"] * 8 / r["cpu_dst_s"] / 1e9 for r in runs]
    tput = [_tput(r) / 1e9 for r in runs]
    return (f"{med_range(rate)} Gbit/s per receiver CPU-second (throughput {med_range(tput)} Gbit/s)",
            yes(statistics.median(rate) >= 12))


def per_file(doc: dict, _: Path) -> tuple[str, str]:
    """Sender CPU per file without data (2000 one-byte files net of one), and 2000 × 256 KiB against ``-fast``."""
    runs = _loopback_runs(doc)
    c, z = runs[(FILES_C, "fstream")], runs[(TINY, "fstream")]
    us = [(c[i]["cpu_src_s"] - z[i]["cpu_src_s"]) / 1999 * 1e6 for i in sorted(c) if i in z]
    gus = [(runs[(FILES_C, "gridftp")][i]["cpu_src_s"] - runs[(TINY, "gridftp")][i]["cpu_src_s"]) / 1999 * 1e6
           for i in sorted(c) if i in runs[(FILES_C, "gridftp")] and i in runs[(TINY, "gridftp")]]
    b = _ratios(doc, FILES_B, "fstream", "gridftp", _tput)
    return (f"sender {med_range(us, '{:.0f}')} µs per file (GridFTP's client {med_range(gus, '{:.0f}')}); "
            f"2000 × 256 KiB {med_range(b)}× GridFTP `-fast`",
            yes(statistics.median(us) <= 120 and statistics.median(b) >= 1.0))


def per_file_vs_client(doc: dict, _: Path) -> tuple[str, str]:
    """Issue 43's bar: the sender's CPU per file without data over globus-url-copy's, in the same repeat."""
    runs = _loopback_runs(doc)
    ours, theirs = runs[(FILES_C, "fstream")], runs[(FILES_C, "gridftp")]
    z, gz = runs[(TINY, "fstream")], runs[(TINY, "gridftp")]
    ratios = [(ours[i]["cpu_src_s"] - z[i]["cpu_src_s"]) / (theirs[i]["cpu_src_s"] - gz[i]["cpu_src_s"])
              for i in sorted(ours) if i in z and i in theirs and i in gz]
    if not ratios:
        return "no repeat has both tools' 1-byte cases", "no"
    return (f"{med_range(ratios)}× globus-url-copy's CPU per file (2000 one-byte files net of one, paired per "
            f"repeat)", yes(statistics.median(ratios) <= 1.1))


def startup(doc: dict, _: Path) -> tuple[str, str]:
    """``fstream send`` of one 1-byte file: the sending process's CPU-seconds."""
    xs = [r["cpu_src_s"] for r in _loopback_runs(doc)[(TINY, "fstream")].values()]
    return f"{med_range(xs, '{:.3f}')} CPU-s", yes(statistics.median(xs) <= 0.12)


def gil_receiver(doc: dict, _: Path) -> tuple[str, str]:
    """The receiver's GIL-held CPU per GB, 1 GiB at p = 4: as sampled (the interpreter's share of its CPU, perf),
    and the bound (its CPU outside the timed GIL-free calls); met on the sampled figure."""
    s = doc["summary"]["big"]
    held, cpu, sampled = s["rx_held"], s["rx_cpu"], s.get("rx_held_sampled")
    if sampled is None:
        return (f"receiver ≤ {held['median']:.3f} s per GB (bound only: perf did not run)", "no")
    return (f"receiver {sampled['median']:.3f} ({sampled['min']:.3f}–{sampled['max']:.3f}) s per GB sampled "
            f"(bound {held['median']:.3f}) of {cpu['median']:.3f} CPU-s", yes(sampled["median"] <= 0.05))


def _q(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


def flow_latency(doc: dict, _: Path) -> tuple[str, str]:
    """File closed → landed record over every file of one run per watch mode."""
    parts, ok = [], True
    for r in doc["latency"]:
        xs = r["latencies_s"]
        parts.append(f"{r['watch']}: p50 {_q(xs, 50):.3f} s, p99 {_q(xs, 99):.3f} s ({len(xs)} files)")
        if r["watch"] == "inotify":
            ok = ok and _q(xs, 50) <= 0.1 and _q(xs, 99) <= 0.5
    return "; ".join(parts), yes(ok)


def _flow_of_send(rows: list[dict], floor: float) -> tuple[list[str], list[bool]]:
    """flow / plain ``send`` per repeat (the modes interleaved within a repeat) for each file set: its cell, and
    whether its median is ≥ ``floor``."""
    parts, met = [], []
    for r in rows:
        xs = [a / b for a, b in zip(r["runs_bps"]["flow"], r["runs_bps"]["send"])]
        parts.append(f"{r['files']:,} × {r['size'] // 1024:,} KiB: {med_range(xs)}")
        met.append(statistics.median(xs) >= floor)
    return parts, met


def flow_throughput(doc: dict, _: Path) -> tuple[str, str]:
    """flow / ``fstream send`` per repeat (issue 17: ≥ 0.95 on every file set)."""
    parts, met = _flow_of_send(doc["throughput"], 0.95)
    return "; ".join(parts) + " of `send`", "yes" if all(met) else ("no" if not any(met) else "partly")


def flow_small(doc: dict, _: Path) -> tuple[str, str]:
    """flow / plain ``send`` for the small-file set, per repeat (issue 29: ≥ 0.97)."""
    rows = [r for r in doc["throughput"] if r["size"] <= 1 << 20]
    parts, met = _flow_of_send(rows, 0.97)
    return "; ".join(parts) + " of `send`", yes(all(met) and bool(rows))


def flow_memory(doc: dict, _: Path) -> tuple[str, str]:
    m = doc["memory"]
    return (f"{m['watch_maxrss_mib']:.0f} MiB peak over {m['files']:,} files (`send`: {m['send_maxrss_mib']:.0f} MiB; "
            "1 run each)", yes(m["watch_maxrss_mib"] < 200))


def authz_cost(doc: dict, _: Path) -> tuple[str, str]:
    """Guarded / plain sender CPU per file within each ABBA pair, and the decision's p99 (issue 32)."""
    runs = doc["guard"]["runs"]
    pairs: dict[int, dict[str, float]] = defaultdict(dict)
    for r in runs:
        pairs[r["repeat"]][r["mode"]] = r["cpu_us_per_file"]
    xs = [p["guarded"] / p["plain"] for p in pairs.values() if len(p) == 2]
    d = doc["decide"]
    return (f"CPU per file {med_range(xs, '{:.3f}')}× unguarded ({doc['guard']['files']:,} × "
            f"{doc['guard']['size'] // 1024} KiB); decision p99 {d['p99_ms']:.2f} ms",
            yes(statistics.median(xs) <= 1.05 and d["p99_ms"] <= 1.0))


def fd_budget(doc: dict, _: Path) -> tuple[str, str]:
    """Issue 43: every file of a ``--watch`` stream landed, and the receiver's peak descriptors against its limit."""
    landed = doc["landed"] == doc["files"] and doc["sender_exit"] == 0
    under = doc["peak_fds"] < doc["fd_limit"]
    disk = f"disk capped at {doc['disk_bps'] / 1e6:.0f} Mbit/s" if doc.get("disk") else "disk not capped"
    return (f"{doc['landed']:,} of {doc['files']:,} landed (sender exit {doc['sender_exit']}); peak "
            f"{doc['peak_fds']} descriptors at a limit of {doc['fd_limit']}; {doc['opens_parked'] or 0:,.0f} OPENs "
            f"waited; {doc['files_per_s']:.0f} files/s ({disk}, one run)", yes(landed and under))


def receiver_vs_iperf3(doc: dict, _: Path) -> tuple[str, str]:
    """Issue 43: the receiver's CPU per GB, keyed checksum on, over iperf3's receiver's, 1 GiB at p = 4 on tmpfs
    (pinned loopback), per repeat (both ran in it)."""
    xs = _ratios(doc, "a: 1 GiB, p=4", "fstream", "iperf3", lambda r: r["cpu_dst_s"] / r["bytes"] if r["bytes"] else 0)
    return f"{med_range(xs)}× iperf3's receiver (CPU-s per GB, receivers on CPU 1)", yes(statistics.median(xs) <= 3.0)


def backlog_memory(doc: dict, _: Path) -> tuple[str, str]:
    """Issue 43: the sender's peak RSS on a ``--watch`` backlog of ``files`` files (the plain run)."""
    plain = next(r for r in doc["runs"] if not r["traced"])
    mib = plain["sender_peak_rss"] / 2**20
    return (f"{doc['files']:,} × {doc['size']} B on {doc['filesystem']}: sender peak RSS {mib:,.0f} MiB "
            f"({plain['sender_peak_rss'] / doc['files']:,.0f} B per file), {plain['landed']:,} landed, one run",
            yes(plain["sender_peak_rss"] < 300e6 and plain["landed"] == doc["files"]))


def workers_vs_one(doc: dict, _: Path) -> tuple[str, str]:
    """Issue 43: two jobs through one port, ``receive --workers 2`` over ``--workers 1``, per repeat (both ran in
    it): aggregate throughput and the receiver tree's CPU per GB."""
    parts, ok = [], True
    for case in doc["cases"]:
        pair: dict[int, dict[int, dict]] = defaultdict(dict)
        for r in doc["runs"]:
            if r["case"] == case:
                pair[r["repeat"]][r["workers"]] = r
        both = [p for p in pair.values() if 1 in p and 2 in p]
        tput = [p[2]["gbit_s"] / p[1]["gbit_s"] for p in both]
        cpu = [p[2]["receiver_cpu_s_per_gb"] / p[1]["receiver_cpu_s_per_gb"] for p in both]
        ok = ok and statistics.median(tput) >= 1.0
        parts.append(f"{case}: {med_range(tput, '{:.2f}')}× the throughput, receiver CPU per GB "
                     f"{med_range(cpu, '{:.2f}')}×")
    return "; ".join(parts) + " of one process (two jobs at once, unpinned, 2 cores)", yes(ok)
