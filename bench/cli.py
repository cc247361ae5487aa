"""``fstream bench ...``: workload generator, scenarios, report, loopback and scale benchmarks, WAN testbed."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from fstream_provider.model.units import parse_duration, parse_rate, parse_size

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fstream bench", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    w = sub.add_parser("workload", help="write a workload's files into a directory over time")
    w.add_argument("name", help="w1, w2, w3, w4, sra or lcls")
    w.add_argument("--dir", required=False, help="source directory to write into (omit with --list)")
    w.add_argument("--bandwidth", default="1Gbit", help="path rate the sizes are scaled for (default 1Gbit)")
    w.add_argument("--rtt", default="40ms", help="path RTT the sizes are scaled for (default 40ms)")
    w.add_argument("--scale", type=float, default=None, help="size multiplier (default: from --bandwidth/--rtt)")
    w.add_argument("--count-factor", type=float, default=1.0, help="multiply file counts (default 1)")
    w.add_argument("--interval", default="5s", help="time between batches (default 5s)")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--list", action="store_true", help="print the batches and exit without writing")

    r = sub.add_parser("run", help="run a scenario: tools x workloads on loopback or the emulated WAN")
    r.add_argument("scenario", help="loopback-smoke, wan (tools x workloads), or a JSON scenario file")
    r.add_argument("--tools", default=None, help="comma list (default: the scenario's)")
    r.add_argument("--workloads", default=None, help="comma list (default: the scenario's)")
    r.add_argument("--count-factor", type=float, default=None, help="thin file counts (default: scenario's)")
    r.add_argument("--interval", default=None, help="time between batches (default: scenario's)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--oracle", action="store_true", help="also grid-search the best fixed (cc,p,pp) per batch")
    r.add_argument("--force-path", action="store_true", help="run even if the WAN selfcheck fails (reported)")
    r.add_argument("--workdir", default=None)
    r.add_argument("--results", default=str(RESULTS_DIR))
    r.add_argument("--json", action="store_true", help="print the summary as JSON")

    rep = sub.add_parser("report", help="markdown table and PNG plots from a run's results")
    rep.add_argument("run_dir", nargs="*", default=None,
                     help="run directories (default: the latest); several are merged, later runs win per workload")
    rep.add_argument("--results", default=str(RESULTS_DIR))
    rep.add_argument("--goals", action="store_true",
                     help="rewrite BENCHMARKS.md's goals table from the result files bench/goals.py names")
    rep.add_argument("--check", action="store_true",
                     help="fail naming each goals row whose result is missing, or that BENCHMARKS.md shows "
                          "differently from its result and today's code (stale code, hand edits); runs nothing")
    rep.add_argument("--strict", action="store_true", help="with --check: also fail on rows that are not current")
    rep.add_argument("--benchmarks", default=str(RESULTS_DIR.parent.parent / "BENCHMARKS.md"),
                     help="the BENCHMARKS.md to write or check (default: the repository's)")

    lb = sub.add_parser("loopback", help="issues 2/13: fstream vs GridFTP vs iperf3 on loopback, pinned, with CPU per GB and per file")
    lb.add_argument("--repeat", type=int, default=1)
    lb.add_argument("--big-bytes", type=parse_size, default=2**30)
    lb.add_argument("--small-count", type=int, default=2000)
    lb.add_argument("--small-bytes", type=parse_size, default=256 * 2**10)
    lb.add_argument("--pp", type=int, default=16, help="pipelining depth for case (b)")
    lb.add_argument("--workdir", default=None)
    lb.add_argument("--results", default=str(RESULTS_DIR))
    lb.add_argument("--keep", action="store_true", help="keep the generated datasets")
    lb.add_argument("--no-pin", action="store_true", help="do not pin the two sides to CPU 0 and CPU 1")
    lb.add_argument("--cases", default="", help="comma-separated words; run only the cases whose name has one")
    lb.add_argument("--tools", default="", help="comma-separated tools (fstream, fstream-nofsync, gridftp, "
                    "gridftp+md5, iperf3)")

    sm = sub.add_parser("stream", help="issue 28: one --watch stream of a million files; RSS, files/s, a restart")
    sm.add_argument("--files", type=int, default=1_000_000)
    sm.add_argument("--size", type=parse_size, default=64 * 2**10)
    sm.add_argument("--checkpoints", default="100000,500000,1000000")
    sm.add_argument("--batch", type=int, default=2000, help="files added per step")
    sm.add_argument("--window", type=int, default=20_000, help="at most this many files added and not yet landed")
    sm.add_argument("--restart-new", type=int, default=10_000, help="files added while the stream is down")
    sm.add_argument("--interval", default="1s", help="the sender's --interval")
    sm.add_argument("--no-pin", action="store_true")
    sm.add_argument("--via-agent", action="store_true", help="run the stream as a job of `fstream agent` on a Redis "
                    "bus (adds the bus's memory per file; the restart is the agent's drain)")
    sm.add_argument("--workdir", default=None, help="default: under /dev/shm (tmpfs)")
    sm.add_argument("--results", default=str(RESULTS_DIR))

    sc = sub.add_parser("scale", help="issue 2 (c): --watch stream growing to many small files; RSS and scan time")
    sc.add_argument("--files", type=int, default=100_000)
    sc.add_argument("--size", type=parse_size, default=64 * 2**10)
    sc.add_argument("--checkpoints", default="10000,50000,100000")
    sc.add_argument("--batch", type=int, default=2000, help="files added per step")
    sc.add_argument("--interval", default="1s", help="the sender's --interval")
    sc.add_argument("--workdir", default=None)
    sc.add_argument("--results", default=str(RESULTS_DIR))
    sc.add_argument("--keep", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = {"airflow": "fstream_bench.airflow.bench", "qos": "fstream_bench.tuning.qos",
             "breakdown": "fstream_bench.tuning.breakdown", "pathfill": "fstream_bench.tuning.pathfill",
             "trust": "fstream_bench.ops.trust", "soak": "fstream_bench.soak.bench",
             "scheduling": "fstream_bench.scheduling.replay", "flow": "fstream_bench.datapath.flow",
             "harp": "fstream_bench.tuning.harp", "tuning-science": "fstream_bench.tuning.science",
             "tuning-wan": "fstream_bench.tuning.wan", "pools-wan": "fstream_bench.tuning.pools_wan",
             "sched-wan": "fstream_bench.scheduling.wan", "ab": "fstream_bench.datapath.ab", "micro": "fstream_bench.datapath.micro",
             "authz": "fstream_bench.datapath.authz", "deadline": "fstream_bench.tuning.deadline",
             "live-view": "fstream_bench.airflow.live_view", "drain": "fstream_bench.ops.drain",
             "metrics": "fstream_bench.ops.metrics", "doctor": "fstream_bench.ops.doctor",
             "rotation": "fstream_bench.ops.rotation", "retention": "fstream_bench.scale.retention",
             "history-cache": "fstream_bench.scale.history_cache", "triggerer": "fstream_bench.airflow.triggerer",
             "sched-cycle": "fstream_bench.scheduling.cycle", "facility": "fstream_bench.scale.facility",
             "sched-compute": "fstream_bench.scheduling.compute", "gil": "fstream_bench.datapath.gil",
             "hundred-g": "fstream_bench.datapath.hundred_g", "airflow-soak": "fstream_bench.airflow.soak",
             "quota-first-file": "fstream_bench.datapath.quota_first_file",
             "carry": "fstream_bench.carry_cmd", "refresh": "fstream_bench.refresh"}
    if argv and argv[0] in extra:  # benchmarks with their own parsers
        import importlib

        return int(importlib.import_module(extra[argv[0]]).main(argv[1:]) or 0)
    found = _by_name(argv[0]) if argv else None
    if found is not None:  # a newer benchmark, found by its module's name: adding one leaves this file alone
        return int(found.main(argv[1:]) or 0)
    if argv and argv[0] == "sim":  # issue 4's simulator tables as a result file (its own parser)
        from fstream_bench.tuning.sim import main as sim_main

        return int(sim_main(argv[1:]) or 0)
    if argv and argv[0] == "wan":
        try:
            from fstream_bench.wan.cli import main as wan_main
        except ImportError as e:
            print(f"fstream bench wan: the WAN testbed is not available ({e})", file=sys.stderr)
            return 2
        return int(wan_main(argv[1:]) or 0)
    args = _parser().parse_args(argv)
    args.raw_argv = argv[1:]
    if args.cmd == "workload":
        return _workload(args)
    if args.cmd == "loopback":
        from fstream_bench.datapath.loopback import main as loopback_main
        return loopback_main(args)
    if args.cmd == "run":
        from fstream_bench.wan.harness import main as run_main
        return run_main(args)
    if args.cmd == "report" and (args.goals or args.check):
        from fstream_bench.goals import GOALS
        from fstream_bench.core.goals_table import main as goals_main
        return goals_main(args, GOALS)
    if args.cmd == "report":
        from fstream_bench.core.report import main as report_main
        return report_main(args)
    if args.cmd == "stream":
        from fstream_bench.scale.stream_million import main as stream_main
        return stream_main(args)
    if args.cmd == "scale":
        from fstream_bench.scale.growth import main as scale_main
        return scale_main(args)
    return 2


ROOMS = ("datapath", "tuning", "scheduling", "airflow", "ops", "scale", "soak")


def _by_name(command: str):  # noqa: ANN202 - a module
    """The module of ``fstream bench COMMAND`` by convention: ``fstream_bench.<room>.<command, - as _>`` that says
    ``COMMAND = "<command>"`` (issue 43: every benchmark's provenance covers this file, so a list here that grows
    with each new benchmark staled every result); None when no room has it."""
    import importlib
    import importlib.util

    name = command.replace("-", "_")
    if not name.isidentifier():
        return None
    for room in ROOMS:
        if importlib.util.find_spec(f"fstream_bench.{room}.{name}") is not None:
            module = importlib.import_module(f"fstream_bench.{room}.{name}")
            if getattr(module, "COMMAND", None) == command:
                return module
    return None


def _workload(args) -> int:
    from fstream_bench.core.workload_gen import build, describe, generate

    w = build(args.name, bandwidth_bps=parse_rate(args.bandwidth), rtt_s=parse_duration(args.rtt),
              scale=args.scale, seed=args.seed, interval_s=parse_duration(args.interval),
              count_factor=args.count_factor)
    print(describe(w), flush=True)
    if args.list:
        return 0
    if not args.dir:
        print("fstream bench workload: --dir is required unless --list is given", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_batch(k, batch, t) -> None:
        print(f"batch {k + 1}: {len(batch.files)} files, {batch.bytes / 1e6:.0f} MB written at t={t:.1f}s",
              flush=True)

    try:
        generate(w, Path(args.dir), seed=args.seed, stop=stop, on_batch=on_batch)
    except KeyboardInterrupt:
        stop.set()
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())


def register(subparsers) -> None:  # noqa: ANN001 - argparse's private subparsers type
    """Add ``fstream bench`` to the agent's CLI (entry point ``fstream.commands``; the agent never imports this)."""
    import argparse as _argparse

    b = subparsers.add_parser("bench", help="benchmarks and the emulated WAN testbed", add_help=False)
    b.add_argument("passthrough_args", nargs=_argparse.REMAINDER)
    b.set_defaults(func=lambda args: int(main(args.passthrough_args) or 0))


register.passthrough = True  # type: ignore[attr-defined]
