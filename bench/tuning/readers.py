"""Readers of the tuning room's results for the goals table: the simulator and its oracle, path filling, QoS, HARP,
the tuning-science grid, two agents with pools, the ETA and deadlines. Each turns one result document into
(measured, met); ``fstream_bench.tuning.goals`` says which result each goal reads with which reader."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from fstream_bench.core.readers import yes
from fstream_bench.core.runstats import med_range
from fstream_bench.tuning.pathfill import pathfill_ratios


def sim_oracle(doc: dict, _: Path) -> tuple[str, str]:
    """``fstream``'s throughput over the oracle's per path: mean over the workloads (the goal's measure) and
    the workloads' range; deterministic, one run."""
    parts, ok = [], True
    for path, means in doc["mean_of_oracle"].items():
        xs = [r["of_oracle"] for r in doc["throughput"] if r["path"] == path and r["tuner"] == "fstream"]
        parts.append(f"{path}: mean {means['fstream']:.2f} ({min(xs):.2f}–{max(xs):.2f} over {len(xs)} workloads)")
        ok = ok and means["fstream"] >= 0.85
    return "; ".join(parts) + " (deterministic)", yes(ok)


def pathfill_large(doc: dict, _: Path) -> tuple[str, str]:
    r = pathfill_ratios(doc["rows"], doc["config"]["link_payload_bps"])["large / iperf3"]
    return f"{med_range(r)} of `iperf3 -P 16` in the same round", yes(statistics.median(r) >= 0.90)


def pathfill_small(doc: dict, _: Path) -> tuple[str, str]:
    r = pathfill_ratios(doc["rows"], doc["config"]["link_payload_bps"])
    link, gf = r["small / link"], r["small / gridftp-globus"]
    return (f"{med_range(link)} of the link's payload rate; {med_range(gf, '{:.1f}')}× GridFTP with Globus presets",
            yes(statistics.median(link) >= 0.80 and statistics.median(gf) >= 2))


def _harp_cases(doc: dict, ratio: str) -> list[tuple[str, list[float]]]:
    return [(c["condition"], c["ratios"][ratio]["all"]) for c in doc["cases"]]


def harp_first_window(doc: dict, _: Path) -> tuple[str, str]:
    """harp / static over the same window after each transfer's own first byte (HARP's is inside its sample)."""
    cases = _harp_cases(doc, "harp/static first_window")
    text = "; ".join(f"{c}: {med_range(xs)}×" for c, xs in cases)
    at = "; ".join(f"{c}: {med_range(xs)}×" for c, xs in _harp_cases(doc, "harp/static alloc_offset_window"))
    return (text + f" over the first {doc.get('first_window', '2s')} after each one's first byte (HARP is then in "
            f"its sample, at the heuristic's settings); at HARP's allocation offset instead: {at}"), \
        yes(all(xs and statistics.median(xs) >= 1.2 for _, xs in cases))


def harp_total(doc: dict, _: Path) -> tuple[str, str]:
    """harp / static total time, first byte to last byte landed, HARP's sample included (< 1: HARP is faster)."""
    cases = _harp_cases(doc, "harp/static total")
    wins = sum(bool(xs) and statistics.median(xs) < 1 for _, xs in cases)
    return "; ".join(f"{c}: {med_range(xs)}× static's time" for c, xs in cases), f"{wins} of {len(cases)} conditions"


def harp_heldout(doc: dict, _: Path) -> tuple[str, str]:
    """``fstream bench harp --generated``: per held-out workload and condition, static's time / HARP's (HARP's
    throughput over static's, sample included), every repeat; met when every case's median is ≥ 1.2. The
    ablations beside it: the paper's sample on every chunk, and HARP's chunks at the heuristic without history; and
    the ceiling, the link over static's rate (no tuner moves more than the link), and in how many cases 1.2× is above
    it."""
    parts, low, capped = [], 0, 0
    for c in doc["cases"]:
        xs = [1 / x for x in c["ratios"]["harp/static total"]["all"] if x]
        ab = [1 / x for x in c["ratios"].get("harp@default-sample-pays/static total", {}).get("all", []) if x]
        nh = [1 / x for x in c["ratios"].get("harp-no-history/static total", {}).get("all", []) if x]
        gb = doc.get("dataset_shapes", {}).get(c["dataset"], {}).get("bytes", 0) / 1e9
        low += not xs or statistics.median(xs) < 1.2
        aside = [f"paper's sample {med_range(ab)}×"] if ab else []
        aside += [f"no history {med_range(nh)}×"] if nh else []
        static_bps = c["tuners"].get("static", {}).get("total_bps", {}).get("median")
        if static_bps:  # the most any tuner can reach: the link over static's rate
            ceiling = doc.get("bandwidth_bps", 1e9) / static_bps
            aside.append(f"ceiling {ceiling:.2f}×")
            capped += ceiling < 1.2
        parts.append(f"{c['dataset']} ({gb:.2f} GB) {c['condition']}: {med_range(xs)}×"
                     + (f" ({'; '.join(aside)})" if aside else ""))
    seeds = ", ".join(map(str, doc.get("seeds", [])))
    text = "; ".join(parts) + f" static's throughput; seeds {seeds}{', fresh' if doc.get('seeds_fresh') else ''}"
    if capped:  # static already moves more than 1/1.2 of the link: 1.2x would be more than the link carries
        text += f"; 1.2× is above the link's rate in {capped} of {len(parts)} cases"
    return text, (f"yes ({len(parts)} of {len(parts)} cases)" if parts and not low
                  else f"no (below 1.2× in {low} of {len(parts)} cases)")


def harp_validation(doc: dict, _: Path) -> tuple[str, str]:
    accs = [o["validation"]["accuracy"] for o in doc["optimizer"] if o["validation"].get("accuracy") is not None]
    rows = sorted({o["rows"] for o in doc["optimizer"]})
    why = "; ".join(sorted({o["validation"].get("reason", "") for o in doc["optimizer"]} - {""}))
    return (f"{med_range([a * 100 for a in accs], '{:.1f}')} % over {len(accs)} chunk(s) with a test group "
            f"(history of {', '.join(map(str, rows))} rows: {why})", yes(bool(accs) and min(accs) >= 0.85))


def harp_optimizer(doc: dict, _: Path) -> tuple[str, str]:
    secs = [o["optimizer_seconds"] for o in doc["optimizer"]]
    return f"{med_range(secs)} s per chunk ({len(secs)} chunks)", yes(bool(secs) and max(secs) <= 2.0)


def sim_default_vs_oracle(doc: dict, _: Path) -> tuple[str, str]:
    """The default variant's throughput over the grid oracle, every backlogged workload (deterministic)."""
    xs = {r["workload"]: r["of_oracle"] for r in doc["throughput"]
          if r["tuner"] == "default" and r["regime"] == "backlogged"}
    lo = min(xs, key=xs.get)
    return (f"{statistics.median(xs.values()):.2f} median, {min(xs.values()):.2f}–{max(xs.values()):.2f} over "
            f"{len(xs)} workloads (lowest: {lo}; deterministic)", yes(min(xs.values()) >= 0.90))


def _wan_runs(doc: dict) -> dict[str, dict]:
    """``fstream bench tuning-wan``: each workload's runs by tool (one run each), those that finished."""
    return {w: {t: r for t, r in v["runs"].items() if r.get("ok")} for w, v in doc["workloads"].items()}


def wan_default_vs_oracle(doc: dict, _: Path) -> tuple[str, str]:
    """The default tuner's throughput over the best fixed setting measured beside it (the grid oracle the simulator
    picked, run on the WAN), per workload; met when every workload is ≥ 0.90."""
    vals = {w: r["fstream-fstream"]["of_oracle"] for w, r in _wan_runs(doc).items() if "fstream-fstream" in r}
    lowest = min(vals, key=vals.get)
    return (f"{med_range(list(vals.values()))} of the oracle over {len(vals)} workloads (lowest: {lowest}; "
            f"one run per tool and workload)", yes(len(vals) == len(doc["workloads"]) and vals[lowest] >= 0.9))


def wan_default_vs_static(doc: dict, _: Path) -> tuple[str, str]:
    """The default tuner's throughput over ``static``'s, per workload (one run each); met when every one is ≥ 1.5."""
    ratios = {w: r["fstream-fstream"]["throughput_bps"] / r["fstream-static"]["throughput_bps"]
              for w, r in _wan_runs(doc).items() if "fstream-fstream" in r and "fstream-static" in r}
    met = sum(x >= 1.5 for x in ratios.values())
    return (", ".join(f"{w} {x:.2f}×" for w, x in ratios.items()) + " (WAN, one run each)",
            f"{'yes' if met == len(ratios) else 'no'} ({met} of {len(ratios)} on the WAN)")


def sim_mix_recovery(doc: dict, _: Path) -> tuple[str, str]:
    """``mix``: decision intervals after each change until throughput last sat below 0.85 of the phase's oracle."""
    rows = [r for r in doc["recovery"] if r["tuner"] == "default"]
    return ("; ".join(f"change {r['change']}: {r['intervals']:.1f} intervals ({r['recovered_s']:.1f} s)" for r in rows)
            + " (default, deterministic)", yes(all(r["intervals"] <= 3 for r in rows)))


def _qos(doc: dict, med_max: float, p90_max: float) -> tuple[str, str]:
    """Per case (kind × target fraction, one run each): median and p90 error after convergence, convergence
    window; counts of cases meeting each part of the goal."""
    ms = [c["metrics"] for c in doc["cases"] if c.get("ok") and "median_err" in c.get("metrics", {})]
    n = len(doc["cases"])
    med = [m["median_err"] * 100 for m in ms]
    p90 = [m["p90_err"] * 100 for m in ms]
    conv = [m["converged_at"] for m in ms]
    a = sum(x <= med_max * 100 for x in med)
    b = sum(x <= p90_max * 100 for x in p90)
    c_ = sum(x is not None and x <= 3 for x in conv)
    text = (f"median error ≤ {med_max:.0%}: {a}/{n}, p90 ≤ {p90_max:.0%}: {b}/{n}, "
            f"converged ≤ 3 windows: {c_}/{n} "
            f"(case medians {min(med):.1f}–{max(med):.1f} %, p90s {min(p90):.1f}–{max(p90):.1f} %; "
            f"variant {doc.get('variant', 'default')})")
    met = "yes" if a == b == c_ == n else ("no" if not (a or b or c_) else "partly")
    return text, met


def qos_issue4(doc: dict, _: Path) -> tuple[str, str]:
    return _qos(doc, 0.05, 0.10)


def qos_default(doc: dict, _: Path) -> tuple[str, str]:
    return _qos(doc, 0.03, 0.05)


def pools_two_agents(doc: dict, _: Path) -> tuple[str, str]:
    """Two agents on one path, each mode one run: aggregate over the link and Jain's index while both run."""
    parts = [f"{mode}: aggregate {m['aggregate_of_link']:.2f}, Jain {m['jain']:.3f}"
             for mode, m in doc["modes"].items()]
    pooled = [m for mode, m in doc["modes"].items() if "pool" in mode and "no" not in mode]
    ok = bool(pooled) and all(m["aggregate_of_link"] >= 0.9 and m["jain"] >= 0.9 for m in pooled)
    return "; ".join(parts) + " (one run per mode)", yes(ok)


def qos_thesis(doc: dict, _: Path) -> tuple[str, str]:
    """The thesis' own QoS mode: the median of the nine cases' median errors, against the thesis' 4–19 %."""
    med = [c["metrics"]["median_err"] * 100 for c in doc["cases"]
           if c.get("ok") and "median_err" in c.get("metrics", {})
           and c["metrics"]["median_err"] == c["metrics"]["median_err"]]  # NaN: no full window to judge
    if not med:
        raise ValueError("no case has a full decision window after convergence (a run too short for 10 s windows?)")
    m = statistics.median(med)
    return (f"median of the case medians {m:.1f} %; per case {min(med):.1f}–{max(med):.1f} % ({len(med)} of "
            f"{len(doc['cases'])} cases judged, "
            f"one run each, variant {doc.get('variant')})", "as a median" if 4 <= m <= 19 else "no")


def eta_error(doc: dict, _: Path) -> tuple[str, str]:
    """The ETA's error at 25/50/75 % of backlogged workloads (``fstream bench deadline``): the median over
    workloads, and the goal read per workload (each workload's median ≤ 10 % at every point, ≤ 5 % at 75 %)."""
    runs = doc.get("eta") or doc.get("backlogged") or []
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        for k, v in (r.get("eta") or {}).items():
            if v:
                per[r["workload"]][k].append(v["rel_error"])
    cells, ok = [], bool(per)
    for k in ("0.25", "0.5", "0.75"):
        meds = {w: statistics.median(v[k]) for w, v in per.items() if v.get(k)}
        if not meds:
            ok = False
            continue
        worst = max(meds, key=meds.get)
        cells.append(f"{int(float(k) * 100)} %: {statistics.median(meds.values()):.1%} (worst {worst} "
                     f"{meds[worst]:.1%})")
        ok = ok and meds[worst] <= (0.05 if k == "0.75" else 0.10)
    return f"median |error| over {len(per)} workloads ({len(runs)} runs): " + ", ".join(cells), yes(ok)


def deadline_sim(doc: dict, _: Path) -> tuple[str, str]:
    """Deadlines met, stream-seconds against the fewest-stream fixed setting, infeasible reported (simulator)."""
    s = doc["summary"]
    ratios = {k: v for k, v in s["stream_ratio"].items() if v.get("n")}
    worst = max(v["median"] for v in ratios.values())
    cells = ", ".join(f"{k}×: {v['median']:.2f}×" for k, v in ratios.items())
    rep = s["infeasible_reported_s"]
    return (f"met {s['met']}/{s['feasible']}; stream-seconds {cells} of the fewest-stream setting that meets it; "
            f"infeasible said at {rep['median']:.0f} s ({s['infeasible_reported']}/{s['infeasible_runs']})",
            yes(s["met"] >= 0.95 * s["feasible"] and worst <= 1.15 and rep.get("max", 99) <= 10
                 and s["infeasible_reported"] == s["infeasible_runs"]))


def deadline_wan(doc: dict, _: Path) -> tuple[str, str]:
    """Deadline runs met on the emulated WAN, their stream-seconds, when infeasible was said."""
    s = doc["summary"]
    ratios = {k: v for k, v in s["stream_ratio"].items() if v.get("n")}
    cells = ", ".join(f"{k}×: {v['median']:.2f}× ({v['min']:.2f}–{v['max']:.2f})" for k, v in ratios.items())
    at = s.get("infeasible_reported_at_s")
    return (f"met {s['met']}/{s['runs']}; stream-seconds {cells}; infeasible said at "
            f"{'never' if at is None else f'{at:.1f} s'}",
            yes(s["met"] >= 9 and all(v["median"] <= 1.15 for v in ratios.values()) and at is not None and at <= 10))


def wan_no_regression(doc: dict, _: Path) -> tuple[str, str]:
    """Emulated WAN: large files over ``iperf3 -P 16`` in the same round, 1000 × 1 MiB over the link's payload rate."""
    r = pathfill_ratios(doc["rows"], doc["config"]["link_payload_bps"])
    large, small = r["large / iperf3"], r["small / link"]
    return (f"large {med_range(large)} of `iperf3 -P 16`; 1000 × 1 MiB {med_range(small)} of the link",
            yes(statistics.median(large) >= 0.95 and statistics.median(small) >= 0.85))


def tails_default_vs_fixed(doc: dict, _: Path) -> tuple[str, str]:
    """``fstream bench tails`` on the WAN: per round (seed x repeat), the default tuner and the ablation without the
    tail floor as fractions of that round's best fixed setting (``static`` or the simulator's two best points of
    at most 32 streams). Met when the default is ≥ 0.95 in every round, not on the median."""
    default, ablation, static = [], [], []
    for row in doc["rows"]:
        for rd in row.get("wan", []):
            runs = rd["runs"]
            default.append(runs["fstream-fstream"]["of_best"])
            ablation.append(runs["fstream-fstream@default-tail-floor"]["of_best"])
            static.append(runs["fstream-static"]["of_best"])
    if not default:
        return "no WAN rounds in this result", "no"
    low = sum(x < 0.95 for x in default)
    text = (f"default {med_range(default, '{:.3f}')} of the best fixed setting over {len(default)} rounds "
            f"(without the tail floor {med_range(ablation, '{:.3f}')}; static {med_range(static, '{:.3f}')}); seeds "
            f"{', '.join(map(str, doc['seeds']))}{', fresh' if doc.get('seeds_fresh') else ''}")
    return text, (f"yes ({len(default)} of {len(default)} rounds)" if not low
                  else f"no (below 0.95 in {low} of {len(default)} rounds)")
