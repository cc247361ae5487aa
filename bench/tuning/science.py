"""Issue #16 figures and tables by one command: thesis vs ours in the simulator, against a grid oracle.

``python -m fstream_bench.tuning.science [--out docs/figures] [--quick]`` runs
``fstream_provider.tuning.ablation`` (pure simulation of the emulated WAN's path: 1 Gbit/s, 40 ms,
1 MiB buffers) and writes, next to the CSV behind each:

- ``tuning-vs-oracle.png``: static, thesis and default as a fraction of the oracle, per workload and regime;
- ``tuning-timeline-mix.png``: throughput and channels over time on the mix-change workload;
- ``tuning-qos.png``: QoS tracking at 30/60/90 % of the path, thesis vs default;
- ``tuning-ablation.md``: the ablation table (thesis -> + each switch -> default), recovery after each
  mix change, the QoS errors, and the goals at a glance;
- ``tuning-harp.md`` / ``.csv``: HARP as the paper writes it, each departure alone and ours, from a
  simulated calibration history, against the same oracle under background traffic
  (``fstream_provider.tuning.harp_ablation``).

``--part fstream`` or ``--part harp`` runs one half. Every run also writes
``bench/results/tuning-science-<stamp>.json`` (``--results``): ``provenance``, the grid and every row
behind the tables (``throughput``, ``recovery``, ``qos``, ``harp``; the mix timeline and the QoS
traces of the figures), so a goal is read from the result, not from the Markdown.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from fstream_bench.core import provenance
from fstream_provider.tuning import ablation as A
from fstream_provider.tuning import harp_ablation as H
from fstream_bench.core import RESULTS_DIR

ROOT = Path(__file__).resolve().parents[2]
QUICK_GRID = ((2, 4, 8, 16, 32), (1, 4, 16), (0, 4, 32))
#: what a tuning-science result exercised (``provenance``): the simulator, tuners and ablation, and this driver
MODULES = ("fstream_provider.tuning", "fstream_bench.tuning.science")


def _plain(rows: list[dict]) -> list[dict]:
    """The rows without their simulation objects, NaN as None: JSON for the result file."""
    def num(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v
    return [{k: num(v) for k, v in r.items() if k != "result"} for r in rows]


def _csv(path: Path, rows: list[dict]) -> None:
    keys = [k for k in rows[0] if k != "result"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: r[k] for k in keys})


def _plot_vs_oracle(rows: list[dict], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys((r["workload"], r["regime"]) for r in rows))
    tuners = ("static", "thesis", "default")
    fig, ax = plt.subplots(figsize=(11, 4))
    width = 0.8 / len(tuners)
    for i, t in enumerate(tuners):
        ys = [next(r["of_oracle"] for r in rows if (r["workload"], r["regime"]) == c and r["tuner"] == t)
              for c in cases]
        ax.bar([k + i * width for k in range(len(cases))], ys, width, label=t)
    ax.axhline(0.9, color="grey", ls="--", lw=1, label="goal 0.9")
    ax.set_xticks([k + width for k in range(len(cases))], [f"{w}\n{g[:6]}" for w, g in cases], fontsize=8)
    ax.set_ylabel("throughput / grid oracle")
    ax.set_ylim(0, 1.1)
    ax.set_title("Simulated 1 Gbit/s, 40 ms, 1 MiB buffers: tuners vs the best static (cc, p, pp)")
    ax.legend(ncol=4, fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _plot_timeline(rows: list[dict], out: Path) -> list[dict]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
    flat = []
    for t in ("static", "thesis", "default"):
        r = next(x for x in rows if x["workload"] == A.MIX and x["tuner"] == t)["result"]
        ts = [iv["t"] for iv in r.intervals]
        a1.plot(ts, [iv["throughput_bps"] / 1e6 for iv in r.intervals], label=t, lw=1)
        a2.step(ts, [iv["cc"] for iv in r.intervals], where="post", label=t, lw=1)
        flat += [{"tuner": t, "t": iv["t"], "throughput_bps": iv["throughput_bps"], "cc": iv["cc"]}
                 for iv in r.intervals]
    w = A.Setup().workload(A.MIX, "backlogged")
    for b in w.batches[1:]:
        for ax in (a1, a2):
            ax.axvline(b.t, color="grey", ls=":", lw=1)
    a1.set_ylabel("Mbit/s")
    a2.set_ylabel("channels (cc)")
    a2.set_xlabel("seconds (dotted: the mix changes)")
    a1.legend(fontsize=8)
    a1.set_title("mix change (large -> 2000 extra small -> large), simulated")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return flat


def _plot_qos(rows: list[dict], out: Path) -> list[dict]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    flat = []
    for ax, v in zip(axes, ("thesis", "default")):
        for frac in (0.3, 0.6, 0.9):
            r = next(x for x in rows if x["variant"] == v and x["workload"] == "lcls" and x["target"] == frac)["result"]
            ts = [iv["t"] for iv in r.intervals]
            ax.plot(ts, [iv["throughput_bps"] / 1e6 for iv in r.intervals], lw=1, label=f"target {frac:.0%}")
            ax.axhline(frac * 1e3, color="grey", ls="--", lw=0.8)
            flat += [{"variant": v, "target": frac, "t": iv["t"], "throughput_bps": iv["throughput_bps"],
                      "cc": iv["cc"]} for iv in r.intervals]
        ax.set_title(f"QoS, {v} (lcls, simulated)")
        ax.set_xlabel("seconds")
    axes[0].set_ylabel("Mbit/s")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return flat


def _fmt_s(v: float | None) -> str:
    return "never" if v is None else f"{v:.0f}"


def markdown(tp: list[dict], rec: list[dict], qos: list[dict], *, grid: tuple, seconds: float) -> str:
    labels = list(dict.fromkeys(r["tuner"] for r in tp))
    cases = list(dict.fromkeys((r["workload"], r["regime"]) for r in tp))
    cell = {(r["workload"], r["regime"], r["tuner"]): r for r in tp}
    out = [f"Grid oracle: cc {grid[0]}, p {grid[1]}, pp {grid[2]} ({len(grid[0]) * len(grid[1]) * len(grid[2])} "
           f"points per workload). Computed in {seconds:.0f} s.", "",
           "**Throughput as a fraction of the oracle** (backlogged: every file present at the start; streamed: "
           "batches every 5 s):", "",
           "| variant | " + " | ".join(f"{w} {g[:4]}" for w, g in cases) + " | mean |",
           "|---" * (len(cases) + 2) + "|"]
    for t in labels:
        vals = [cell[(w, g, t)]["of_oracle"] for w, g in cases]
        out.append(f"| {t} | " + " | ".join(f"{v:.2f}" for v in vals) + f" | {statistics.mean(vals):.3f} |")
    out += ["", "**Time to 0.9 of the oracle (s) / channel churn (|Δcc| per minute), backlogged:**", "",
            "| variant | " + " | ".join(w for w, g in cases if g == "backlogged") + " |",
            "|---" * (sum(1 for _, g in cases if g == "backlogged") + 1) + "|"]
    for t in labels:
        out.append(f"| {t} | " + " | ".join(
            f"{_fmt_s(cell[(w, g, t)]['to_90pct_s'])} / {cell[(w, g, t)]['churn_per_min']:.1f}"
            for w, g in cases if g == "backlogged") + " |")
    out += ["", "**Oracle settings:** " + "; ".join(
        f"{w} {g[:4]} {cell[(w, g, 'static')]['oracle']} ({cell[(w, g, 'static')]['oracle_bps'] / 1e6:.0f} Mbit/s)"
        for w, g in cases), "",
        "**Mix change: after each change, when the throughput last sat below 0.85 of that phase's own oracle** "
        "(0: never):", "",
        "| variant | change | at (s) | last below 0.85 (s after) | decision intervals |", "|---|---|---|---|---|"]
    for r in rec:
        out.append(f"| {r['tuner']} | {r['change']} | {r['at_s']:.0f} | {r['recovered_s']:.0f} | "
                   f"{r['intervals']:.1f} (of {r['interval_s']:g} s) |")
    out += ["", "**QoS |error| after three decision windows (median / p90), per decision window:**", "",
            "| variant | " + " | ".join(f"{w} {int(f * 100)}%" for w in ("w1", "lcls", "w4") for f in (0.3, 0.6, 0.9))
            + " | median of medians | windows |", "|---" * 12 + "|"]
    for v in dict.fromkeys(r["variant"] for r in qos):
        rows = [r for r in qos if r["variant"] == v]
        out.append(f"| {v} | " + " | ".join(f"{r['median_err']:.1%} / {r['p90_err']:.1%}" for r in rows)
                   + f" | {statistics.median(r['median_err'] for r in rows):.1%} | "
                   f"{min(r['windows'] for r in rows)}-{max(r['windows'] for r in rows)} |")
    return "\n".join(out)


def harp_markdown(rows: list[dict], *, grid: tuple, seconds: float) -> str:
    cases = list(dict.fromkeys((r["workload"], r["background_bps"]) for r in rows))
    cell = {(r["workload"], r["background_bps"], r["tuner"]): r for r in rows}
    out = [f"HARP from a simulated calibration history (passes under {', '.join(f'{x / 1e6:.0f}' for x in H.LOADS)} "
           f"Mbit/s of background), backlogged, against the grid oracle ({len(grid[0]) * len(grid[1]) * len(grid[2])} "
           f"points) under the same background. Computed in {seconds:.0f} s.", "",
           "| tuner | " + " | ".join(f"{w} bg {b / 1e6:.0f}" for w, b in cases) + " | mean |",
           "|---" * (len(cases) + 2) + "|"]
    for t in dict.fromkeys(r["tuner"] for r in rows):
        vals = [cell[(w, b, t)]["of_oracle"] for w, b in cases]
        out.append(f"| {t} | " + " | ".join(f"{v:.2f}" for v in vals) + f" | {statistics.mean(vals):.3f} |")
    out += ["", "**Oracle settings:** " + "; ".join(
        f"{w} bg {b / 1e6:.0f}: {cell[(w, b, 'harp default')]['oracle']} "
        f"({cell[(w, b, 'harp default')]['oracle_bps'] / 1e6:.0f} Mbit/s)" for w, b in cases)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "figures"), help="where PNG, CSV and Markdown go")
    ap.add_argument("--quick", action="store_true", help="a 45-point oracle grid instead of 200")
    ap.add_argument("--part", choices=("all", "fstream", "harp"), default="all", help="one half only")
    ap.add_argument("--results", default=str(RESULTS_DIR),
                    help="where tuning-science-<stamp>.json goes (default bench/results)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    grid = QUICK_GRID if args.quick else A.ORACLE_GRID
    load = os.getloadavg()[0]
    prov = provenance.start("tuning-science", argv, MODULES)
    setup = A.Setup()
    doc: dict = {"bench": "tuning-science", "provenance": prov, "part": args.part,
                 "grid": {"cc": list(grid[0]), "p": list(grid[1]), "pp": list(grid[2])},
                 "path": {"bandwidth_bps": setup.path.bandwidth_bps, "rtt_s": setup.path.rtt_s,
                          "tcp_buffer": setup.path.tcp_buffer}, "seconds": {}}
    if args.part in ("all", "harp"):
        t0 = time.time()
        hr = H.harp_rows(grid=grid)
        doc["seconds"]["harp"] = time.time() - t0
        doc["harp"] = _plain(hr)
        _csv(out / "tuning-harp.csv", hr)
        md = harp_markdown(hr, grid=grid, seconds=time.time() - t0)
        (out / "tuning-harp.md").write_text(
            f"<!-- python -m fstream_bench.tuning.science --part harp{' --quick' if args.quick else ''}; "
            f"load {load:.2f} -->\n\n" + md + "\n")
        print(md)
    if args.part == "harp":
        return _write(doc, args)
    t0 = time.time()
    tp = A.throughput_rows(grid=grid)
    rec = A.recovery_rows(grid=grid)
    qos = A.qos_rows()
    seconds = time.time() - t0
    doc["seconds"]["fstream"] = seconds
    doc["throughput"], doc["recovery"], doc["qos"] = _plain(tp), _plain(rec), _plain(qos)
    _csv(out / "tuning-vs-oracle.csv", tp)
    _plot_vs_oracle(tp, out / "tuning-vs-oracle.png")
    doc["timeline_mix"] = _plot_timeline(tp, out / "tuning-timeline-mix.png")
    _csv(out / "tuning-timeline-mix.csv", doc["timeline_mix"])
    doc["qos_timeline"] = _plot_qos(qos, out / "tuning-qos.png")
    _csv(out / "tuning-qos.csv", doc["qos_timeline"])
    _csv(out / "tuning-qos-errors.csv", qos)
    _csv(out / "tuning-mix-recovery.csv", rec)
    md = markdown(tp, rec, qos, grid=grid, seconds=seconds)
    (out / "tuning-ablation.md").write_text(
        f"<!-- python -m fstream_bench.tuning.science{' --quick' if args.quick else ''}; load {load:.2f} -->\n\n"
        + md + "\n")
    print(md)
    return _write(doc, args)


def _write(doc: dict, args: argparse.Namespace) -> int:
    provenance.finish(doc["provenance"])
    res = Path(args.results)
    res.mkdir(parents=True, exist_ok=True)
    path = res / f"tuning-science-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
