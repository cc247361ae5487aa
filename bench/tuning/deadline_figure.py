"""Stream-seconds against the deadline: every run of a ``fstream bench deadline sim`` result and of the WAN results
measured on the same code as the newest one.

    python -m fstream_bench.tuning.deadline_figure bench/results/deadline-sim-STAMP.json \\
        bench/results/deadline-wan-STAMP.json docs/figures/deadline-streams.png

Left: the simulator calibrated to the emulated WAN, one point per workload x seed, the default rule (``streams``)
and issue 27's (``target``); right: the WAN, one point per deadline run of every result beside the given one with
the same code hash (``deadline_readers.same_code_runs``). The y axis is the run's stream-seconds over the
fewest-stream fixed setting that meets the same deadline; hollow points missed their deadline. The dashed line is
the goal (1.15x). Nothing is chosen: every run is drawn.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fstream_bench.core.figure_io import cli, save

STEERS = (("streams", "the fewest streams, unpaced (default)"), ("target", "issue 27: a paced QoS target"))


def sim_points(doc: dict) -> dict[str, list[tuple[float, float, bool]]]:
    """steer -> [(factor, stream ratio, met)] for every feasible row."""
    out: dict[str, list[tuple[float, float, bool]]] = {}
    for r in doc["rows"]:
        if r["factor"] >= 1.0 and r.get("stream_ratio") is not None:
            out.setdefault(r.get("steer", "target"), []).append((r["factor"], r["stream_ratio"], bool(r["met"])))
    return out


def _draw(ax, pts: list[tuple[float, float, bool]], k: int, label: str) -> None:
    for met in (True, False):
        sel = [p for p in pts if p[2] == met]
        if sel:
            ax.scatter([p[0] + 0.03 * (k - 0.5) for p in sel], [p[1] for p in sel], s=24, alpha=0.75,
                       color=f"C{k}", facecolors=f"C{k}" if met else "none",
                       label=label + ("" if met else " (missed)"))


def figure(sim: Path, wan: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fstream_bench.tuning.deadline_readers import same_code_runs, wan_points

    sim_doc = json.loads(sim.read_text())
    wan_docs = same_code_runs(json.loads(wan.read_text()), wan)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    for k, (steer, label) in enumerate(STEERS):
        _draw(left, sim_points(sim_doc).get(steer, []), k, label)
    _draw(right, wan_points(wan_docs), 0, STEERS[0][1])
    workloads = len({r["workload"] for r in sim_doc["rows"] if "workload" in r})
    left.set_title(f"simulator calibrated to the WAN: {workloads} workloads x {len(sim_doc.get('seeds', []))} "
                   "fresh seeds", fontsize=8)
    right.set_title(f"emulated WAN, w1: {len(wan_docs)} runs of the same code, fresh seeds", fontsize=8)
    for ax in (left, right):
        ax.axhline(1.15, color="grey", ls="--", lw=1, label="goal 1.15x")
        ax.axhline(1.0, color="black", lw=0.6)
        ax.set_xlabel("deadline / the fastest fixed setting's time")
        ax.set_xticks([1.2, 1.5, 2.0])
        ax.legend(fontsize=7)
    left.set_ylabel("stream-seconds / fewest-stream fixed setting")
    save(fig, png)


def main(argv: list[str] | None = None) -> int:
    return cli(argv, "python -m fstream_bench.tuning.deadline_figure SIM_RESULT WAN_RESULT PNG", figure, inputs=2)


if __name__ == "__main__":
    sys.exit(main())
