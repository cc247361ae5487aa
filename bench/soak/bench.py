"""Issue 8's soak: a streamed workload under random faults, ended by the invariant check.

``fstream bench soak --minutes N [--seed S] [--loopback]``

- a producer thread writes files (64 KiB–64 MiB, log-uniform, seeded) into a source directory
  over time, each under a hidden temp name renamed into place (as instruments do), at ``--rate``;
- ``fstream send SRC --watch --interval 1s --json`` (a subprocess; inside the source namespace on
  the WAN) streams them to ``fstream receive`` (destination namespace); either side that exits on
  its own is restarted (and counted);
- a fault injector picks a fault every 20–60 s (shorter for short runs, so every kind is hit):
  sender SIGKILL + restart at once, receiver SIGKILL + restart on the same port, the path
  black-holed 5–30 s (WAN only), an already-complete source file touched (expect a clean re-send,
  never mixed content). Kinds are drawn round-robin in a seeded shuffled order;
- recovery time of a fault: from its end until the destination moves again (a new visible file,
  or part files growing);
- at the end: producing stops, the watching sender drains (until every source file is visible at
  the destination, bounded) and is stopped, then one final ``fstream send`` over the whole source
  (no ``--watch``) must exit 0; then the invariant check (DESIGN.md "Rules for never losing
  data"; the same checks as ``tests/faults/invariants.py``): every source file at the destination
  with identical content (sha256), no ``.part``/``.meta`` left, nothing visible that matches no
  source content.

Report: ``bench/results/soak-<stamp>.{json,md}``. Exit status 1 if any invariant fails.

The parts: ``soak_producer`` (the files), ``soak_agents`` (the processes), ``soak_faults`` (the injector),
``soak_monitor`` (supervision and recovery times), ``soak_check`` (the destination scan and invariants),
``soak_run`` (the sequence of one run), ``soak_report`` (the result, JSON and markdown); this module is the CLI.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from fstream_bench.core import provenance
from fstream_bench.core import RESULTS_DIR
from fstream_bench.soak.report import write_report
from fstream_bench.soak.run import Soak
from fstream_provider.model.units import parse_rate

#: what a soak result exercised (``provenance``): the agents, receivers and bus, the soak's producer, agents,
#: faults, checks and report, the WAN testbed and the peers
MODULES = (*provenance.AGENT, "fstream_bench.soak.bench", "fstream_bench.soak.run", "fstream_bench.soak.agents",
           "fstream_bench.soak.producer", "fstream_bench.soak.faults", "fstream_bench.soak.check",
           "fstream_bench.soak.monitor", "fstream_bench.soak.report", "fstream_bench.wan", "fstream_bench.peers",
           "fstream_bench.core.report", "fstream_bench.core.workload_gen")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fstream bench soak", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--loopback", action="store_true", help="run on loopback (no root, no black-holes)")
    ap.add_argument("--rate", default="64Mbit", help="average production rate (default 64Mbit)")
    ap.add_argument("--cc", type=int, default=4)
    ap.add_argument("--p", type=int, default=2)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--stall-timeout", default="20s", help="the sender's --stall-timeout (default 20s)")
    ap.add_argument("--drain-timeout", type=float, default=300.0, help="seconds the watching sender gets to catch up")
    ap.add_argument("--final-timeout", type=float, default=600.0, help="seconds the final send may take")
    ap.add_argument("--workdir", default=None, help="where source and destination go (default /var/tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the source and destination")
    ap.add_argument("--results", default=str(RESULTS_DIR))
    args = ap.parse_args(argv)
    prov = provenance.start("soak", list(sys.argv[1:] if argv is None else argv), MODULES)
    from fstream_bench.core.report import machine_info

    if not args.loopback and os.geteuid() != 0:
        print("fstream bench soak: the emulated WAN needs root (use --loopback)", file=sys.stderr)
        return 2
    base = Path(args.workdir or "/var/tmp")
    need = parse_rate(args.rate) / 8 * args.minutes * 60 * 2.2  # source + destination + slack
    free = shutil.disk_usage(base).free
    if need > free:
        print(f"fstream bench soak: {base} has {free / 1e9:.1f} GB free; --rate {args.rate} for {args.minutes} min "
              f"needs about {need / 1e9:.1f} GB (source and destination); lower --rate or use --workdir",
              file=sys.stderr)
        return 2
    work = base / f"fstream-soak-{os.getpid()}"
    work.mkdir(parents=True)
    load0 = os.getloadavg()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    path = None
    try:
        if not args.loopback:
            from fstream_bench.wan.path import WanConfig, WanPath

            path = WanPath(WanConfig(rate_bps=1e9, rtt_s=0.040, buffer_bytes=1 << 20, run_id="sk"))
            path.up()
        soak = Soak(args, work, path)
        try:
            result = soak.run()
        finally:
            soak.close()
    finally:
        if path is not None:
            path.down()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    doc = {"command": "fstream bench soak " + " ".join(argv if argv is not None else sys.argv[1:]),
           "where": "loopback" if args.loopback else "emulated WAN (1 Gbit/s, 40 ms, 1 MiB buffer)",
           "minutes": args.minutes, "seed": args.seed, "started_utc": started, "machine": machine_info(),
           "load_average_at_start": list(load0), "result": result, "provenance": provenance.finish(prov)}
    write_report(doc, Path(args.results), stamp)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
