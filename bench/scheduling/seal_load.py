"""``fstream bench seal-load``: SEAL at ordinary load, on traces generated fresh for every run (issue 44).

    fstream bench seal-load                        # 3 fresh seeds, the four Table 2 shapes, with batch
    fstream bench seal-load --seeds 0,1 --traces 25%,45% --scale 0.2 --no-batch
    fstream bench seal-load --figure bench/results/seal-load-STAMP.json docs/figures/seal-load.png

Per seed and trace shape (``tuning.trace.generate``: Table 2's counts and load, bursty arrivals) it replays the
four baselines, SEAL as written, SEAL that shares below the knee (``tuning.seal_share``, ``seal-share``), shortest
remaining first past the knee (``tuning.srpt_share``, ``srpt-share``, which the goal reads) and the ablation: each of
``seal-share``'s two changes off (``seal-share-no-admit``, ``seal-share-no-fair``), ``srpt-share`` counting starting
tasks' streams (``srpt-share-counts-starting``), walking SEAL's xfactor order (``srpt-share-xfactor-order``) or
starting without a limit (``srpt-share-no-start-limit``); and
computes the floor (``sched_sim.slowdown_floor``: every task alone, seen at the next cycle after one start-up;
no scheduler does better under the replay's charges) and what an idealized scheduler reaches under contention
(``sched_srpt.srpt_estimate``: preemptive SRPT with free preemption, exact rates and no external load). With batch
(the default) the same trace plus §6.4's 50 GB batch tasks is replayed under ``seal-share`` and ``steal-share``:
STEAL's share of the spare bandwidth against SEAL's. The seeds are drawn from the system's random source unless
``--seeds`` names them, and every seed is recorded, so any run can be replayed exactly
(``fstream bench scheduling --traces T --seed S``).

Writes ``seal-load-<stamp>.json`` (and a ``.md`` of one line per run) into ``--results`` (default bench/results):
provenance, the seeds, and per seed and trace every algorithm's summary (``sched_sim.ReplayResult.summary``), the
floor's average and worst, and the idealized SRPT's (``srpt``).
The goals table reads it (``fstream_bench.scheduling.readers.seal_at_load``, ``steal_share_at_load``).
``--figure RESULT PNG`` draws a committed result, every run a point (nothing chosen), the median a line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from fstream_bench.core import RESULTS_DIR, provenance
from fstream_bench.core.seeds import add_seed_args, seeds_from
from fstream_bench.core.runstats import write_result
from fstream_bench.scheduling.replay import DEFAULT_TRACES
from fstream_provider.tuning import sched_sim as S
from fstream_provider.tuning.sched_srpt import srpt_estimate
from fstream_provider.tuning import trace as T

COMMAND = "seal-load"
MODULES = ("fstream_provider.tuning", "fstream_bench.scheduling.seal_load", "fstream_bench.core.seeds")
ALGORITHMS = S.BASELINES + ("seal", "seal-share", "srpt-share")
#: the ablation: name -> (rule, one of its switches changed: ``SealShareScheduler``'s, ``SrptShareScheduler``'s)
ABLATIONS = {"seal-share-no-admit": ("seal-share", {"admit": False}),
             "seal-share-no-fair": ("seal-share", {"fair_small": False}),
             "srpt-share-counts-starting": ("srpt-share", {"count_starting": True}),
             "srpt-share-xfactor-order": ("srpt-share", {"order": "xfactor"}),
             "srpt-share-no-start-limit": ("srpt-share", {"start_limit": math.inf})}
BATCH_ALGORITHMS = ("seal-share", "steal-share")


def _replay(tasks: list, algorithm: str, curves: dict, window_s: float, seed: int) -> dict:
    t0 = time.process_time()
    name, switches = ABLATIONS.get(algorithm, (algorithm, {}))
    row = S.replay(tasks, S.make_scheduler(name, curves, **switches), endpoints=curves, window_s=window_s,
                   seed=seed).summary()
    row["cpu_seconds"] = round(time.process_time() - t0, 2)
    return row


def one_trace(name: str, seed: int, *, scale: float, batch: bool) -> dict:
    """Every algorithm on trace shape ``name`` generated from ``seed``, the floor, and (``batch``) the batch pair."""
    window = 900 * scale
    tasks = T.generate(name, scale=scale, seed=seed)
    curves = S.endpoints_for(tasks, window_s=window)
    floor = [f for f in S.slowdown_floor(tasks, curves, window_s=window) if f is not None]
    srpt = [f for f in srpt_estimate(tasks, curves, window_s=window) if f is not None]
    out = {"trace": name, "seed": seed, "tasks": len(tasks),
           "floor": {"avg_slowdown": statistics.fmean(floor), "worst_slowdown": max(floor)},
           "srpt": {"avg_slowdown": statistics.fmean(srpt), "worst_slowdown": max(srpt)},
           "results": {a: _replay(tasks, a, curves, window, seed) for a in (*ALGORITHMS, *ABLATIONS)}}
    if batch:
        with_batch = T.generate(name, scale=scale, seed=seed, batch=True)
        out["batch"] = {a: _replay(with_batch, a, curves, window, seed) for a in BATCH_ALGORITHMS}
    return out


def _line(row: dict) -> str:
    res = row["results"]
    best = min(S.BASELINES, key=lambda b: res[b]["avg_slowdown"])
    parts = [f"{row['trace']} seed {row['seed']}: best baseline {best} {res[best]['avg_slowdown']:.3f}",
             *(f"{a} {res[a]['avg_slowdown']:.3f}" for a in ("seal", "seal-share", "srpt-share", *ABLATIONS)),
             f"idealized SRPT {row['srpt']['avg_slowdown']:.3f}", f"floor {row['floor']['avg_slowdown']:.3f}"]
    if "batch" in row:
        b = row["batch"]
        parts.append(f"batch spare steal-share / seal-share "
                     f"{b['steal-share']['batch_spare_fraction'] / b['seal-share']['batch_spare_fraction']:.3f}")
    return ", ".join(parts)


def figure(result: Path, png: Path) -> None:
    """Average bounded slowdown against the trace shape: every run of every algorithm a point, medians joined, the
    floor and the idealized SRPT dashed; relative to each run's best baseline, so runs of one shape but different
    seeds compare."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(Path(result).read_text())
    shapes = doc["config"]["traces"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    series = {a: [] for a in ("seal", "seal-share", "srpt-share", "srpt", "floor")}  # the ablation: in the table
    for x, shape in enumerate(shapes):
        rows = [r for r in doc["rows"] if r["trace"] == shape]
        for name in series:
            ys = []
            for r in rows:
                best = min(r["results"][b]["avg_slowdown"] for b in S.BASELINES)
                ys.append((r[name] if name in ("floor", "srpt") else r["results"][name])["avg_slowdown"] / best)
            series[name].append((x, ys))
    for i, (name, points) in enumerate(series.items()):
        off = (i - len(series) / 2) * 0.06
        ax.scatter([x + off for x, ys in points for _ in ys], [y for _, ys in points for y in ys], s=14,
                   label=None, color=f"C{i}")
        ax.plot([x + off for x, _ in points], [statistics.median(ys) for _, ys in points], color=f"C{i}",
                linestyle="--" if name in ("floor", "srpt") else "-",
                label={"srpt": "idealized SRPT", "floor": "floor (alone)"}.get(name, name))
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.axhline(0.8, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xticks(range(len(shapes)), shapes)
    ax.set_yscale("log")
    ax.set_ylabel("avg bounded slowdown / best baseline's")
    ax.set_title(f"SEAL at load: {len(doc['seeds'])} seeds (every run a point); dotted: the goal, 0.8")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"fstream bench {COMMAND}", description=__doc__.splitlines()[0])
    add_seed_args(ap)
    ap.add_argument("--traces", default=DEFAULT_TRACES, help=f"trace shapes (default {DEFAULT_TRACES})".replace("%", "%%"))
    ap.add_argument("--scale", type=float, default=1.0, help="tasks, volume and duration x this (load kept)")
    ap.add_argument("--no-batch", dest="batch", action="store_false", help="skip the STEAL batch replays")
    ap.add_argument("--results", default=str(RESULTS_DIR))
    ap.add_argument("--figure", nargs=2, metavar=("RESULT", "PNG"), help="draw a result file and exit")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    if args.figure:
        figure(Path(args.figure[0]), Path(args.figure[1]))
        print(f"figure: {args.figure[1]}")
        return 0
    seeds = seeds_from(ap, args)
    traces = [t for t in args.traces.split(",") if t]
    for t in traces:
        if t not in T.TABLE2:
            ap.error(f"--traces: unknown trace shape {t!r} (known: {', '.join(T.TABLE2)})")
    if args.scale <= 0:
        ap.error("--scale must be > 0")
    prov = provenance.start(COMMAND, argv, MODULES)
    rows = []
    for seed in seeds:
        for name in traces:
            rows.append(one_trace(name, seed, scale=args.scale, batch=args.batch))
            print(_line(rows[-1]), flush=True)
    provenance.finish(prov)
    doc = {"bench": COMMAND, "provenance": prov, "seeds": seeds, "seeds_fresh": not args.seeds,
           "config": {"traces": traces, "scale": args.scale, "batch": args.batch,
                      "algorithms": [*ALGORITHMS, *ABLATIONS],
                      "load_average": os.getloadavg()}, "rows": rows}
    path, _md = write_result(args.results, COMMAND, doc, "\n".join(f"- {_line(r)}" for r in rows))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
