"""``fstream bench doctor`` (issue 30): does ``fstream doctor`` name the cause on deliberately broken emulated paths?

    fstream bench doctor                        # (root) the baseline and three broken paths, one WAN at a time
    fstream bench doctor --cases buffer         # one case
    fstream bench doctor --loopback             # smoke: doctor against a loopback receiver (no WAN, no score)

Each case builds its own emulated WAN (its own run id, brought down before the next is built), selfchecks it with
iperf3 (recorded, not enforced), starts ``fstream receive`` at the destination and runs ``fstream doctor --json`` at
the source:

* ``baseline``: ``--rate`` (1 Gbit/s), ``--rtt`` (40 ms), ``--big-buffer`` (64 MiB) TCP buffers; doctor is told
  ``--bandwidth`` = the rate, so a healthy path must come out ``none found`` (a control, not scored);
* ``buffer``: the same path with ``--small-buffer`` (256 KiB) on both ends: expected ``buffer cap``;
* ``bottleneck``: half the rate with the big buffers, doctor told ``--bandwidth`` = the full rate: ``bottleneck``;
* ``disk``: the baseline path with the destination disk capped (``--disk-rate``, default a fifth of the rate; the
  testbed's ``disk_rate_bps``): expected ``destination disk``.

Score: of the three broken paths, how many verdicts name the cause (goal: 3 of 3), with the numbers doctor measured
(RTT, one and several streams, window cap, disk rate) and its advice codes. Writes ``doctor-<stamp>.json`` with
provenance under ``--results``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

from fstream_bench.core import provenance
from fstream_bench.core import RESULTS_DIR

MODULES = (*provenance.AGENT, "fstream_bench.ops.doctor", "fstream_bench.wan", "fstream_bench.peers")
CASES = ("baseline", "buffer", "bottleneck", "disk")
EXPECTED = {"baseline": "none found", "buffer": "buffer cap", "bottleneck": "bottleneck",
            "disk": "destination disk"}
SCORED = ("buffer", "bottleneck", "disk")


def case_config(case: str, args: argparse.Namespace, run_id: str):
    """The ``WanConfig`` of one case and the ``--bandwidth`` doctor is told (the healthy path's rate, or None)."""
    from fstream_bench.wan.path import WanConfig

    rate, buf = args.rate, args.big_buffer
    kw: dict = {}
    if case == "buffer":
        buf = args.small_buffer
    elif case == "bottleneck":
        rate = args.rate / 2
    elif case == "disk":
        kw = {"disk_rate_bps": args.disk_rate or args.rate / 5, "disk_size_bytes": 1 << 30}
    told = args.rate if case in ("baseline", "bottleneck") else None
    return WanConfig(rate_bps=rate, rtt_s=args.rtt, buffer_bytes=buf, run_id=run_id, **kw), told


def _sites(path):
    from fstream_bench.peers.base import Sites
    from fstream_bench.wan import netns

    dst = netns.ns_exec_argv(path.dst_ns, [])
    if path.disk_cgroup:  # a cgroup-v2 disk cap holds only what runs in its cgroup
        from fstream_bench.wan.storage import in_cgroup_argv

        dst = in_cgroup_argv(path.disk_cgroup, dst)
    return Sites(src_host=path.src_ip, dst_host=path.dst_ip, src_prefix=tuple(netns.ns_exec_argv(path.src_ns, [])),
                 dst_prefix=tuple(dst), name="wan")


def run_doctor(sites, workdir: Path, root: Path, seconds: float, bandwidth: float | None) -> dict:
    """``fstream receive`` at the destination, ``fstream doctor --json`` at the source; doctor's object and exit."""
    from fstream_bench.peers.fstream import FStreamReceiver, fstream_argv

    with FStreamReceiver(sites=sites, workdir=workdir, root=root) as rx:
        argv = [*fstream_argv(), "doctor", "--to", rx.url(""), "--secret-file", str(rx.secret), "--json",
                "--seconds", f"{seconds:g}"]
        if bandwidth:
            argv += ["--bandwidth", f"{bandwidth:.0f}bps"]
        t0 = time.monotonic()
        cp = subprocess.run(sites.argv("src", argv), capture_output=True, text=True, timeout=180,
                            env={**os.environ, "FSTREAM_STATE_DIR": str(workdir / "state-doctor")})
        wall = time.monotonic() - t0
    try:
        doc = json.loads(cp.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        doc = {}
    return {"exit": cp.returncode, "wall_s": wall, "doc": doc, "stderr": cp.stderr[-600:]}


def summarize(case: str, config: dict, told: float | None, run: dict, check: dict | None) -> dict:
    """One case's row: what was expected and said, and the numbers doctor measured."""
    doc = run["doc"]
    rate = doc.get("rate") or {}
    disk = doc.get("disk") or {}
    verdict = doc.get("verdict")
    return {"case": case, "path": config, "told_bandwidth_bps": told, "expected": EXPECTED[case],
            "verdict": verdict, "named": verdict == EXPECTED[case], "reason": doc.get("reason"),
            "exit": run["exit"], "wall_s": round(run["wall_s"], 2),
            "rtt_ms": (doc.get("rtt") or {}).get("median_s", 0) * 1e3,
            "single_bps": (rate.get("single") or {}).get("bps"),
            "parallel_bps": (rate.get("parallel") or {}).get("bps"),
            "window_bytes": doc.get("window_bytes"), "window_cap_bps": doc.get("window_cap_bps"),
            "bdp_bytes": doc.get("bdp_bytes"), "disk_bps": disk.get("bps"), "disk_error": disk.get("error"),
            "advice": [(a["code"], a["severity"]) for a in doc.get("advice", [])],
            "error": None if doc else f"no JSON from doctor (exit {run['exit']}): {run['stderr']}",
            "selfcheck": check, "doctor": doc}


def run_case(case: str, args: argparse.Namespace, work: Path) -> dict:
    from dataclasses import asdict

    from fstream_bench.wan.path import WanPath
    from fstream_bench.wan.selfcheck import selfcheck

    cfg, told = case_config(case, args, f"{args.run_id}{CASES.index(case)}")
    path = WanPath(cfg)
    try:  # one emulated WAN at a time: this one is down before the next case builds its own
        path.up()
        check = None
        if not args.no_selfcheck:
            check = selfcheck(path, duration=2.0, parallel=8, rtt_samples=10, raise_on_failure=False)
            check = {k: check.get(k) for k in ("ok", "failures", "rtt_ms", "single_stream_bps", "parallel_bps",
                                                "buffer_limit_bps", "disk_write_bps")}
        root = (path.dst_dir / "dst") if path.dst_dir else work / case / "dst"
        run = run_doctor(_sites(path), work / case / "rx", root, args.seconds, told)
    finally:
        path.down()
    return summarize(case, asdict(cfg), told, run, check)


def run_loopback(args: argparse.Namespace, work: Path) -> dict:
    from fstream_bench.peers.base import Sites

    run = run_doctor(Sites(), work / "rx", work / "dst", args.seconds, None)
    row = summarize("baseline", {"path": "loopback"}, None, run, None)
    return {**row, "case": "loopback", "expected": None, "named": None}


def table(rows: list[dict]) -> str:
    def mbit(x: float | None) -> str:
        return f"{x / 1e6:.0f}" if x else "-"

    out = ["| case | expected | verdict | named | one stream Mbit/s | parallel Mbit/s | window cap Mbit/s | "
           "disk Mbit/s | RTT ms |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['case']} | {r['expected']} | {r['verdict']} | {r['named']} | {mbit(r['single_bps'])} | "
                   f"{mbit(r['parallel_bps'])} | {mbit(r['window_cap_bps'])} | {mbit(r['disk_bps'])} | "
                   f"{r['rtt_ms']:.1f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from fstream_provider.model.units import parse_duration, parse_rate, parse_size

    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="fstream bench doctor", description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)} (default all)")
    ap.add_argument("--rate", default="1Gbit", help="the healthy path's rate (default 1Gbit)")
    ap.add_argument("--rtt", default="40ms", help="round-trip time of every case (default 40ms)")
    ap.add_argument("--big-buffer", default="64MiB", help="TCP buffer max of the healthy cases (default 64MiB)")
    ap.add_argument("--small-buffer", default="256KiB", help="TCP buffer max of the buffer case (default 256KiB)")
    ap.add_argument("--disk-rate", default=None, help="destination disk cap of the disk case (default rate/5)")
    ap.add_argument("--seconds", default="3s", help="doctor's --seconds per rate probe (default 3s)")
    ap.add_argument("--no-selfcheck", action="store_true", help="skip the iperf3 selfcheck of each path")
    ap.add_argument("--run-id", default="tb30d", help="prefix of the own WAN run ids (one per case; never shared)")
    ap.add_argument("--loopback", action="store_true", help="smoke run against a loopback receiver (no root)")
    ap.add_argument("--results", default=str(RESULTS_DIR))
    ap.add_argument("--workdir", default=None, help="scratch directory (default under /dev/shm)")
    args = ap.parse_args(argv)
    args.rate, args.rtt, args.seconds = parse_rate(args.rate), parse_duration(args.rtt), parse_duration(args.seconds)
    args.big_buffer, args.small_buffer = parse_size(args.big_buffer), parse_size(args.small_buffer)
    args.disk_rate = parse_rate(args.disk_rate) if args.disk_rate else None
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        ap.error(f"--cases: unknown {', '.join(unknown)} (known: {', '.join(CASES)})")
    if not args.loopback and os.geteuid() != 0:
        ap.error("the emulated WAN needs root (network namespaces); use --loopback for a smoke run")
    prov = provenance.start("doctor", argv, MODULES)
    base = Path(args.workdir or ("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"))
    work = base / f"fstream-doctor-bench-{secrets.token_hex(4)}"
    rows: list[dict] = []
    try:
        if args.loopback:
            rows.append(run_loopback(args, work))
        for case in ([] if args.loopback else cases):
            print(f"doctor bench: {case} ...", flush=True)
            rows.append(run_case(case, args, work))
            print(f"  {rows[-1]['verdict']!r} (expected {EXPECTED[case]!r}) in {rows[-1]['wall_s']} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    scored = [r for r in rows if r["case"] in SCORED]
    summary = {"named": sum(r["named"] for r in scored), "broken_paths": len(scored), "goal": "3 of 3",
               "met": len(scored) == 3 and all(r["named"] for r in scored),
               "baseline": next((r["verdict"] for r in rows if r["case"] == "baseline"), None)}
    doc = {"bench": "doctor", "config": {"rate_bps": args.rate, "rtt_s": args.rtt, "big_buffer": args.big_buffer,
                                         "small_buffer": args.small_buffer, "disk_rate_bps": args.disk_rate,
                                         "seconds": args.seconds, "loopback": args.loopback},
           "summary": summary, "cases": rows, "provenance": provenance.finish(prov)}
    out = Path(args.results) / f"doctor-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    print(table(rows))
    print(json.dumps(summary))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
