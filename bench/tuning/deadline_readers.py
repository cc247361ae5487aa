"""Issue 44's deadline rows: stream-seconds against the fewest-stream fixed setting that meets the deadline, in
the simulator calibrated to the emulated WAN (issue 27's rule beside it, the ablation) and on the emulated WAN over
every run of the same code, and the live ETA's error at 25 % of each workload on the WAN."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from fstream_bench.core.readers import yes
from fstream_bench.core.runstats import med_range

FACTORS = ("1.2", "1.5", "2.0")
GOAL_RATIO = 1.15
MIN_RUNS = 3


def deadline_streams_sim(doc: dict, _: Path) -> tuple[str, str]:
    """Per factor, every workload x seed's stream ratio of the default rule (``streams``) and of issue 27's
    (``target``), from one calibrated simulator run; met when each factor's median is ≤ 1.15 and ≥ 95 % met."""
    rows = doc["rows"]
    cells, ok = [], True
    for k in FACTORS:
        new = [r["stream_ratio"] for r in rows if r.get("steer") == "streams" and r["factor"] == float(k)]
        old = [r["stream_ratio"] for r in rows if r.get("steer") == "target" and r["factor"] == float(k)]
        cells.append(f"{k}×: {med_range(new)} (issue 27's rule {med_range(old)})")
        ok = ok and bool(new) and statistics.median(new) <= GOAL_RATIO
    st = doc["summary"]["steers"]
    new_met, old_met = st["streams"], st["target"]
    ok = ok and new_met["met"] >= 0.95 * new_met["feasible"]
    return (f"stream-seconds of the fewest-stream fixed setting that meets it: {'; '.join(cells)}; met "
            f"{new_met['met']}/{new_met['feasible']} (issue 27's rule {old_met['met']}/{old_met['feasible']}); "
            f"{len(doc.get('seeds') or [])} fresh seeds × {len({r['workload'] for r in rows})} workloads, "
            f"calibration {doc.get('calibration')}", yes(ok))


def same_code_runs(doc: dict, path: Path) -> list[dict]:
    """``doc`` and every other WAN deadline result beside it measured on the same code (provenance hash) on
    fresh workloads (a recorded seed): all of them, never a chosen one."""
    want = (doc.get("provenance") or {}).get("code_hash")
    out = []
    for f in sorted(path.parent.glob("deadline-wan-*.json")):
        d = doc if f.name == path.name else json.loads(f.read_text())
        if d.get("seed") is not None and want and (d.get("provenance") or {}).get("code_hash") == want:
            out.append(d)
    return out


def wan_points(docs: list[dict]) -> list[tuple[float, float, bool]]:
    """[(factor, stream ratio, met)] for every deadline run of ``docs``, against its own result's fixed run at the
    same factor (the goals row and the figure read the same points)."""
    out = []
    for d in docs:
        fixed = {f["factor"]: f["stream_seconds"] for f in d["fixed"]}
        out += [(r["factor"], r["stream_seconds"] / fixed[r["factor"]], bool(r["met"])) for r in d["deadline"]
                if fixed.get(r["factor"])]
    return out


def deadline_streams_wan(doc: dict, path: Path) -> tuple[str, str]:
    """Every deadline run of every same-code WAN result: its stream-seconds over its own result's fixed run at the
    same factor; met when there are ≥ 3 results and each factor's median is ≤ 1.15."""
    runs = same_code_runs(doc, path)
    points = wan_points(runs)
    ratios: dict[str, list[float]] = defaultdict(list)
    for factor, ratio, _ in points:
        ratios[str(factor)].append(ratio)
    met, total = sum(bool(r["met"]) for d in runs for r in d["deadline"]), sum(len(d["deadline"]) for d in runs)
    cells = "; ".join(f"{k}×: {med_range(ratios[k])}" for k in FACTORS)
    ok = len(runs) >= MIN_RUNS and all(ratios[k] and statistics.median(ratios[k]) <= GOAL_RATIO for k in FACTORS)
    return (f"stream-seconds of the fewest-stream fixed setting that meets it: {cells}; met {met}/{total}; "
            f"{len(runs)} runs, seeds {', '.join(str(d['seed']) for d in runs)}", yes(ok))


def eta_25_wan(doc: dict, path: Path) -> tuple[str, str]:
    """The live ETA's error at 25 % of each backlogged workload, over every same-code WAN result; met when every
    workload's median is ≤ 10 % and there are ≥ 3 results."""
    runs = same_code_runs(doc, path)
    per: dict[str, list[float]] = defaultdict(list)
    for d in runs:
        for b in d["backlogged"]:
            point = (b.get("eta") or {}).get("0.25")
            if point:
                per[b["workload"]].append(point["rel_error"])
    cells = "; ".join(f"{w} {med_range(v, '{:.1%}')}" for w, v in sorted(per.items()))
    ok = len(runs) >= MIN_RUNS and bool(per) and all(statistics.median(v) <= 0.10 for v in per.values())
    return f"|error| at 25 %: {cells} ({len(runs)} runs)", yes(ok)
