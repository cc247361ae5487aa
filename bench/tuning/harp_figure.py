"""HARP against ``static`` by transfer size and load: every run of a ``fstream bench harp --generated`` result.

    python -m fstream_bench.tuning.harp_figure bench/results/harp-STAMP docs/figures/harp-heldout.png

One point per repeat: ``static``'s time over the tool's (its throughput over static's, HARP's sample included), at
the held-out transfer's size, quiet and under background load; ``harp`` (default), the paper's sample on every chunk
(``harp@default-sample-pays``) and HARP's chunks at the heuristic without history (``harp-no-history``). The dashed
line is the goal (1.2x). Nothing is chosen: every repeat of every case is drawn.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fstream_bench.core.figure_io import cli, save

TOOLS = (("harp", "harp (default)"), ("harp@default-sample-pays", "paper's sample on every chunk"),
         ("harp-no-history", "HARP's chunks, no history"))
MARKERS = {"quiet": "o", "background": "^"}


def points(summary: dict) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(tool, condition) -> [(GB, static time / tool time)] for every repeat that both finished."""
    shapes = summary.get("dataset_shapes", {})
    out: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for c in summary["cases"]:
        gb = shapes.get(c["dataset"], {}).get("bytes", 0) / 1e9
        for tool, _ in TOOLS:
            for x in c["ratios"].get(f"{tool}/static total", {}).get("all", []):
                if x:
                    out.setdefault((tool, c["condition"]), []).append((gb, 1 / x))
    return out


def figure(result: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = json.loads((result / "summary.json" if result.is_dir() else result).read_text())
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k, (tool, label) in enumerate(TOOLS):
        for cond, marker in MARKERS.items():
            pts = points(summary).get((tool, cond), [])
            if pts:
                ax.scatter([p[0] + 0.006 * (k - 1) for p in pts], [p[1] for p in pts], marker=marker, s=26,
                           color=f"C{k}", alpha=0.8, label=f"{label}, {cond}")
    ax.axhline(1.2, color="grey", ls="--", lw=1, label="goal 1.2x")
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_xlabel("held-out transfer (GB)")
    ax.set_ylabel("throughput / static's (sample included)")
    seeds = ", ".join(str(s) for s in summary.get("seeds", []))
    ax.set_title(f"HARP on held-out transfers after a 120 s calibration, every run (seeds {seeds})", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    save(fig, png)


def main(argv: list[str] | None = None) -> int:
    return cli(argv, "python -m fstream_bench.tuning.harp_figure RESULT_DIR_OR_SUMMARY PNG", figure, inputs=1)


if __name__ == "__main__":
    sys.exit(main())
