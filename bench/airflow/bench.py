"""Issue 5's Airflow benchmark: file-closed -> event/claim latency, and operator-path overhead vs ``fstream send``.

``fstream bench airflow latency|overhead`` (or ``python -m fstream_bench.airflow.bench ...``); the parts live in
``airflow_latency`` and ``airflow_overhead``, on the rig of ``airflow_rig`` with the classes of ``airflow_timed``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fstream_bench.airflow.latency import cmd_latency
from fstream_bench.airflow.overhead import cmd_overhead
from fstream_bench.airflow.results import KIB

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def _parser() -> argparse.ArgumentParser:
    from fstream_provider.model.units import parse_size

    ap = argparse.ArgumentParser(prog="fstream bench airflow", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    lat = sub.add_parser("latency", help="file closed -> FStreamNewFilesTrigger event, and -> agent claim (dag.test)")
    lat.add_argument("--samples", type=int, default=30, help="trigger samples per poll interval (default 30)")
    lat.add_argument("--polls", default="0.5,0.2", help="trigger poll intervals, seconds (default 0.5,0.2)")
    lat.add_argument("--dag-samples", type=int, default=11,
                     help="dag.test() runs per poll for file closed -> claimed, the first counted as cold (0: skip)")
    lat.add_argument("--dag-polls", default="0.5,0.2", help="the sensor's poke_interval values under dag.test()")
    lat.add_argument("--file-size", type=parse_size, default=256 * KIB)
    lat.add_argument("--sim-arrivals", type=int, default=2000, help="arrivals for the simulated pollers")
    ov = sub.add_parser("overhead", help="operator path vs fstream send (in-process and CLI), same data, rotated")
    ov.add_argument("--datasets", default="24x32MiB,2000x64KiB", help="COUNTxSIZE list (default 24x32MiB,2000x64KiB)")
    ov.add_argument("--reps", type=int, default=5, help="runs per method and dataset (default 5)")
    ov.add_argument("--tuner", default="fixed")
    ov.add_argument("--cc", type=int, default=4)
    ov.add_argument("--warmup", type=int, default=1,
                    help="unmeasured rounds of every method first (cold imports; kept in the JSON; default 1)")
    for p in (lat, ov):
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--workdir", default=None, help="parent of the scratch directory (default: $TMPDIR)")
        p.add_argument("--results", default=str(RESULTS_DIR))
        p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.raw_argv = argv
    if args.cmd == "latency":
        return cmd_latency(args)
    return cmd_overhead(args)


if __name__ == "__main__":
    sys.exit(main())
