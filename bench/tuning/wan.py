"""Issue #16 on the emulated WAN: backlogged workloads, static / thesis / default vs a real, sim-pruned oracle.

``python -m fstream_bench.tuning.wan [--workloads w1,w3,sra,lcls,mix] [--count-factor 0.3] [--top 3]``
(root: it builds the emulated WAN, 1 Gbit/s, 40 ms, 1 MiB buffers). Per workload, every file present at
the start (``interval 0``; ``mix`` times its own phases):

1. the simulator ranks the 200 points of ``ablation.ORACLE_GRID`` (cc 1-32, p 1-16, pp 0-32) on the
   very workload the bench stages; its best ``--top`` and, among the points within 5 % of its best, the
   best of each of the three smallest stream counts become real candidates (``candidates``);
2. one ``fstream bench run`` scenario then runs, in the same path and run, ``fstream-static``,
   ``fstream-fstream@thesis``, ``fstream-fstream`` (default variant) and each candidate as
   ``fstream-fixed:CCxPxPP``; all are timed alike (first release to last byte landed);
3. the oracle is the fastest candidate; every tuner is reported as a fraction of it.

Writes ``tuning-wan.md`` and ``tuning-wan.json`` into a results directory, plus a PNG of the mix
workload's throughput and channels over time per tuner.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import sys
import time
from pathlib import Path

from fstream_bench.core import provenance
from fstream_bench.wan.harness import Scenario, run_scenario
from fstream_bench.core.report import machine_info
from fstream_bench.core.workload_gen import build
from fstream_provider.tuning.ablation import ORACLE_GRID, SIM_KW, Setup
from fstream_provider.tuning.base import PathInfo
from fstream_provider.tuning.fixed import FixedTuner
from fstream_provider.tuning.sim import dtn_storage
from fstream_bench.core import RESULTS_DIR

#: what a tuning-wan result exercised (``provenance``): the agent and tuners, the scenario harness with its
#: peers and the WAN testbed, the workloads, and this driver (its simulator ranking too)
MODULES = (*provenance.AGENT, "fstream_bench.tuning.wan", "fstream_bench.wan.harness", "fstream_bench.peers",
           "fstream_bench.wan", "fstream_bench.core.report", "fstream_bench.core.workload_gen",
           "fstream_bench.core.cpu_meter",
           "fstream_bench.wan.oracle")

TUNERS = ("fstream-static", "fstream-fstream@thesis", "fstream-fstream")
LABELS = {"fstream-static": "static", "fstream-fstream@thesis": "thesis", "fstream-fstream": "default"}


def ranked(w, bandwidth_bps: float, rtt_s: float, tcp_buffer: int) -> list[tuple[float, tuple[int, int, int]]]:
    """Every grid point's simulated throughput on ``w``, best first."""
    setup = Setup(path=PathInfo(bandwidth_bps, rtt_s, tcp_buffer=tcp_buffer, max_cc=32, max_p=16),
                  storage=dtn_storage(bandwidth_bps))
    out = []
    for cc, p, pp in itertools.product(*ORACLE_GRID):
        r = setup.run(FixedTuner(cc=cc, p=p, pp=pp), w)
        out.append((r.throughput_bps if r.completed else 0.0, (cc, p, pp)))
    return sorted(out, key=lambda x: -x[0])


def candidates(rank: list[tuple[float, tuple[int, int, int]]], top: int = 1, tolerance: float = 0.05,
               cheapest: int = 3) -> list[tuple[int, int, int]]:
    """The grid points run for real: the simulator's best ``top``, then, among the points it puts within
    ``tolerance`` of its best, the best of each of the ``cheapest`` smallest stream counts (cc x p).

    The simulator charges nothing per stream; the real agent pays CPU for each (on this 2-core machine the
    simulator's favourite for w1, 4 channels x 16 streams, ran at 0.7 of what the tuners reached), and many
    grid points tie in the simulator, so the cheapest near-ties are the honest candidates.
    """
    best = rank[0][0]
    out = [pt for _, pt in rank[:top]]
    near = sorted((pt[0] * pt[1], -bps, pt) for bps, pt in rank if bps >= (1 - tolerance) * best)
    counts: list[int] = []
    for streams, _, pt in near:
        if streams in counts:
            continue
        if len(counts) == cheapest:
            break
        counts.append(streams)
        if pt not in out:
            out.append(pt)
    return out


def _plot_mix(samples_csv: Path, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(open(samples_csv)))
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
    for tool in TUNERS:
        mine = [r for r in rows if r["tool"] == tool]
        if not mine:
            continue
        ts = [float(r["t"]) for r in mine]
        a1.plot(ts, [float(r["throughput_bps"] or 0) / 1e6 for r in mine], lw=1, label=LABELS[tool])
        a2.step(ts, [float(r["cc"] or 0) for r in mine], where="post", lw=1, label=LABELS[tool])
    a1.set_ylabel("Mbit/s (landed)")
    a2.set_ylabel("channels")
    a2.set_xlabel("seconds")
    a1.legend(fontsize=8)
    a1.set_title("mix change on the emulated WAN (1 Gbit/s, 40 ms, 1 MiB buffers)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="w1,w3,sra,lcls,mix")
    ap.add_argument("--count-factor", type=float, default=0.3)
    ap.add_argument("--top", type=int, default=1, help="simulated best grid points confirmed for real")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", default=str(RESULTS_DIR))
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args(argv)
    prov = provenance.start("tuning-wan", list(sys.argv[1:] if argv is None else argv), MODULES)
    bw, rtt, buf = 1e9, 0.040, 2**20
    out = Path(args.results) / f"tuning-wan-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.workdir or f"/tmp/fstream-tuning-wan-{os.getpid()}")
    summary = {"machine": machine_info(), "load_start": os.getloadavg(), "count_factor": args.count_factor,
               "grid": ORACLE_GRID, "sim": SIM_KW, "workloads": {}, "provenance": prov}
    for name in args.workloads.split(","):
        w = build(name, bandwidth_bps=bw, rtt_s=rtt, seed=args.seed, interval_s=0.0, count_factor=args.count_factor)
        rank = ranked(w, bw, rtt, buf)
        cands = candidates(rank, args.top)
        tools = list(TUNERS) + [f"fstream-fixed:{cc}x{p}x{pp}" for cc, p, pp in cands]
        sc = Scenario(f"tuning-wan-{name}", "wan", [name], tools, bandwidth_bps=bw, rtt_s=rtt, tcp_buffer=buf,
                      count_factor=args.count_factor, interval_s=0.0, seed=args.seed, timeout_s=900.0)
        run_dir = run_scenario(sc, out, workdir / name, log=lambda m: print(m, flush=True))
        s = json.loads((run_dir / "summary.json").read_text())
        got = {r["tool"]: r for r in s["runs"]}
        fixed = {t: r for t, r in got.items() if t.startswith("fstream-fixed") and r.get("ok")}
        best_tool = max(fixed, key=lambda t: fixed[t]["throughput_bps"]) if fixed else None
        best = fixed[best_tool]["throughput_bps"] if best_tool else 0.0
        sim_of = {f"fstream-fixed:{cc}x{p}x{pp}": bps for bps, (cc, p, pp) in rank if (cc, p, pp) in cands}
        summary["workloads"][name] = {
            "files": len(w.files), "bytes": w.total_bytes, "run_dir": str(run_dir), "oracle_tool": best_tool,
            "oracle_bps": best, "sim_best": {t: v for t, v in sim_of.items()},
            "runs": {t: {"ok": r.get("ok"), "throughput_bps": r.get("throughput_bps"), "seconds": r.get("seconds"),
                         "of_oracle": (r.get("throughput_bps") or 0) / best if best else None} for t, r in got.items()}}
        if name == "mix":
            _plot_mix(run_dir / "samples.csv", out / "tuning-wan-mix.png")
        (out / "tuning-wan.json").write_text(json.dumps(summary, indent=1, default=str))
    summary["load_end"] = os.getloadavg()
    provenance.finish(prov)
    (out / "tuning-wan.json").write_text(json.dumps(summary, indent=1, default=str))
    lines = [f"Emulated WAN 1 Gbit/s, 40 ms, 1 MiB buffers; backlogged; count factor {args.count_factor}; "
             f"load {summary['load_start'][0]:.2f} -> {summary['load_end'][0]:.2f}.", "",
             "| workload | files / GB | static | thesis | default | oracle (real: best of the simulator's top %d and "
             "its fewest-stream near-ties) |" % args.top,
             "|---|---|---|---|---|---|"]
    for name, d in summary["workloads"].items():
        cells = []
        for t in TUNERS:
            r = d["runs"].get(t, {})
            cells.append(f"{(r.get('throughput_bps') or 0) / 1e6:.0f} ({r['of_oracle']:.2f})" if r.get("of_oracle")
                         else "failed")
        o = d["oracle_tool"] or "-"
        lines.append(f"| {name} | {d['files']} / {d['bytes'] / 1e9:.2f} | " + " | ".join(cells)
                     + f" | {d['oracle_bps'] / 1e6:.0f} Mbit/s, {o.replace('fstream-fixed:', 'cc x p x pp ')} |")
    lines += ["", "Candidates confirmed (simulated -> measured Mbit/s):", ""]
    for name, d in summary["workloads"].items():
        lines.append(f"- {name}: " + "; ".join(
            f"{t.replace('fstream-fixed:', '')} {sim / 1e6:.0f} -> "
            f"{(d['runs'].get(t, {}).get('throughput_bps') or 0) / 1e6:.0f}"
            for t, sim in d["sim_best"].items()))
    (out / "tuning-wan.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
