"""Summaries and result files shared by ``fstream bench ab`` and ``fstream bench micro`` (issue 26).

Every figure is kept raw (each run's value) next to its median and range, and every result file
carries ``provenance`` (``fstream_bench.core.provenance``): a number in BENCHMARKS.md points at a file
that says what was run, on which code and machine, and what each repeat measured.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path


def summarize(values: list[float]) -> dict:
    """``{"n", "median", "min", "max"}`` of ``values`` (None for an empty list: nothing ran)."""
    xs = [float(x) for x in values]
    if not xs:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {"n": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def series(values: list[float], unit: str) -> dict:
    """One measured quantity: its unit, every run's value and their summary."""
    return {"unit": unit, "values": [float(x) for x in values], **summarize(values)}


def pair_ratios(a: list[float], b: list[float]) -> list[float]:
    """``b[i] / a[i]`` for each pair (runs i of A and B in the same round); pairs with ``a[i] == 0`` are left out."""
    if len(a) != len(b):
        raise ValueError(f"pair_ratios: {len(a)} A values against {len(b)} B values")
    return [y / x for x, y in zip(a, b) if x]


def med_range(values: list[float], fmt: str = "{:.2f}") -> str:
    """``median (min–max, n runs)`` of every run: the form BENCHMARKS.md and its goals table quote."""
    s = summarize(values)
    if not s["n"]:
        return "no runs"
    m = fmt.format(s["median"])
    if s["n"] == 1:
        return f"{m} (1 run)"
    return f"{m} ({fmt.format(s['min'])}–{fmt.format(s['max'])}, {s['n']} runs)"


def stamp() -> str:
    """``YYYYMMDD-HHMMSS`` (local time, as every other result name): what ``report --goals`` sorts by."""
    return time.strftime("%Y%m%d-%H%M%S")


def write_result(results_dir: str | Path, prefix: str, doc: dict, md: str) -> tuple[Path, Path]:
    """Write ``doc`` as ``<results_dir>/<prefix>-<stamp>.json`` and ``md`` beside it as ``.md``.

    ``doc`` must carry ``provenance``. A name already taken (two runs in one second) gets ``-2``,
    ``-3``, ... after the stamp. Returns both paths.
    """
    if not isinstance(doc.get("provenance"), dict):
        raise ValueError("write_result: the result carries no provenance")
    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = f"{prefix}-{stamp()}"
    name, k = base, 1
    while (out / f"{name}.json").exists() or (out / f"{name}.md").exists():
        k += 1
        name = f"{base}-{k}"
    jp, mp = out / f"{name}.json", out / f"{name}.md"
    jp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    mp.write_text(md if md.endswith("\n") else md + "\n")
    return jp, mp


def provenance_line(prov: dict) -> str:
    """One markdown line: commit, machine, load at start and end, when."""
    m = prov.get("machine", {})
    dirty = " (uncommitted changes)" if prov.get("dirty") else ""
    load = " ".join(f"{x:.2f}" for x in prov.get("load_start", []))
    load_end = " ".join(f"{x:.2f}" for x in prov.get("load_end", [])) or "?"
    return (f"Commit `{prov.get('commit', '?')[:12]}`{dirty}; code hash `{prov.get('code_hash', '?')[:19]}`; "
            f"{m.get('nproc', '?')} CPUs ({m.get('cpu', '?')}), kernel {m.get('kernel', '?')}, "
            f"{m.get('mem_gib', 0):.0f} GiB; {m.get('date', '?')}; load average at start {load}, at end {load_end}.")
