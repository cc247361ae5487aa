"""Readers for BENCHMARKS.md's goals table: from one result document to (measured, met).

Each reads the raw runs a benchmark wrote and summarises them as the median and range of every run
(``med_range``), ratios taken within a run or a repeat; ``fstream_bench.goals`` says which result
each goal reads with which reader.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from fstream_bench.tuning.pathfill import pathfill_ratios
from fstream_bench.core.runstats import med_range
from fstream_bench.datapath.readers import _cpu, _loopback_runs, _ratios, _tput, _yes


def loopback_throughput(case: str):
    def measure(doc: dict, _: Path) -> tuple[str, str]:
        fast = _ratios(doc, case, "fstream", "gridftp", _tput)
        md5 = _ratios(doc, case, "fstream", "gridftp+md5", _tput)
        return (f"{med_range(fast)}× GridFTP `-fast`; {med_range(md5)}× GridFTP with its checksum on",
                _yes(statistics.median(fast) >= 1.5))
    return measure


def loopback_cpu(cases: list[str]):
    def measure(doc: dict, _: Path) -> tuple[str, str]:
        parts, ok = [], True
        for case in cases:
            r = _ratios(doc, case, "fstream", "gridftp", _cpu)
            nv = _ratios(doc, case, "fstream-noverify", "gridftp", _cpu)
            parts.append(f"{case.split(': ', 1)[-1]}: {med_range(r)} (without the checksum {med_range(nv)})")
            ok = ok and statistics.median(r) <= 1.0
        return "; ".join(parts) + " of GridFTP's CPU-s, both sides", _yes(ok)
    return measure


def loopback_disk(doc: dict, _: Path) -> tuple[str, str]:
    ceiling = statistics.median(doc["disk_ceiling_Bps"]) * 8  # dd conv=fdatasync, once per repeat
    parts, ok = [], True
    for case in [c for c in doc["cases"] if c.startswith("d:")]:
        xs = [r["throughput_bps"] / ceiling for r in _loopback_runs(doc)[(case, "fstream")].values()]
        parts.append(f"{case.split(', disk')[0][3:]}: {med_range(xs)}")
        ok = ok and statistics.median(xs) >= 0.9
    return "; ".join(parts) + f" of `dd conv=fdatasync` ({ceiling / 1e9:.1f} Gbit/s)", _yes(ok)


def scale(doc: dict, _: Path) -> tuple[str, str]:
    """Peak RSS at the largest checkpoint; idle scans (median of 5 each) at every checkpoint: flat means
    a scan's cost follows what is new, not what was ever seen (met: the largest ≤ 2× the smallest + 1 ms)."""
    cps = doc["checkpoints"]
    last = cps[-1]
    idle = [c["scan_idle_poll_s"] * 1000 for c in cps]
    new = [c["scan_new_poll_s"] * 1000 for c in cps]
    at = " / ".join(f"{c['files'] // 1000}k" for c in cps)
    text = (f"peak RSS sender {last['sender_peak_rss'] / 2**20:.0f} MiB, receiver {last['receiver_peak_rss'] / 2**20:.0f}"
            f" MiB at {last['files']:,} files; idle scan {' / '.join(f'{x:.2f}' for x in idle)} ms and a scan "
            f"with {cps[0]['new_per_scan']:,} new files {' / '.join(f'{x:.0f}' for x in new)} ms at {at} (today's "
            f"watcher, polling)")
    ok = (all(c["landed"] >= c["files"] for c in cps)
          and max(last["sender_peak_rss"], last["receiver_peak_rss"]) < 500e6 and max(idle) <= 2 * min(idle) + 1)
    return text, _yes(ok)


def sim_oracle(doc: dict, _: Path) -> tuple[str, str]:
    """``fstream``'s throughput over the oracle's per path: mean over the workloads (the goal's measure) and
    the workloads' range; deterministic, one run."""
    parts, ok = [], True
    for path, means in doc["mean_of_oracle"].items():
        xs = [r["of_oracle"] for r in doc["throughput"] if r["path"] == path and r["tuner"] == "fstream"]
        parts.append(f"{path}: mean {means['fstream']:.2f} ({min(xs):.2f}–{max(xs):.2f} over {len(xs)} workloads)")
        ok = ok and means["fstream"] >= 0.85
    return "; ".join(parts) + " (deterministic)", _yes(ok)


BASELINES = ("basecc1", "basecc2", "basecc4", "basevary")


def _pct(a: float, b: float) -> str:
    return f"{(a / b - 1) * 100:+.0f} %".replace("-", "−")


def _algos(trace: dict) -> dict[str, dict]:
    return {r["algorithm"].split("(")[0]: r for r in trace["results"]}


def seal_vs_baselines(doc: dict, _: Path) -> tuple[str, str]:
    """SEAL's interactive bounded slowdown against the best baseline of each column, per trace
    (deterministic replay; goal: avg ≥ 30 % and worst ≥ 50 % lower on every trace)."""
    parts, met = [], 0
    for name, trace in doc["traces"].items():
        a = _algos(trace)
        best_avg = min(a[b]["avg_slowdown"] for b in BASELINES)
        best_worst = min(a[b]["worst_slowdown"] for b in BASELINES)
        seal = a["seal"]
        parts.append(f"{name}: {_pct(seal['avg_slowdown'], best_avg)} / {_pct(seal['worst_slowdown'], best_worst)}")
        met += seal["avg_slowdown"] <= 0.7 * best_avg and seal["worst_slowdown"] <= 0.5 * best_worst
    return "; ".join(parts) + f" (avg / worst, seed {doc['config']['seed']}, deterministic)", \
        f"{met} of {len(doc['traces'])} traces"


def steal_with_batch(doc: dict, _: Path) -> tuple[str, str]:
    """STEAL with the 50 GB batch tasks: interactive avg slowdown against BaseVary's, and the spare
    bandwidth batch used against SEAL's (goal: ≥ 65 % lower, ≥ 0.9)."""
    parts, ok = [], True
    for name, trace in doc["traces"].items():
        a = _algos(trace)
        st, bv, se = a["steal"], a["basevary"], a["seal"]
        spare = st["batch_spare_fraction"] / se["batch_spare_fraction"]
        parts.append(f"{name}: {_pct(st['avg_slowdown'], bv['avg_slowdown'])}, {spare:.3f}")
        ok = ok and st["avg_slowdown"] <= 0.35 * bv["avg_slowdown"] and spare >= 0.9
    return "; ".join(parts) + f" (vs BaseVary; spare / SEAL's; seed {doc['config']['seed']})", _yes(ok)


def pathfill_large(doc: dict, _: Path) -> tuple[str, str]:
    r = pathfill_ratios(doc["rows"], doc["config"]["link_payload_bps"])["large / iperf3"]
    return f"{med_range(r)} of `iperf3 -P 16` in the same round", _yes(statistics.median(r) >= 0.90)


def pathfill_small(doc: dict, _: Path) -> tuple[str, str]:
    r = pathfill_ratios(doc["rows"], doc["config"]["link_payload_bps"])
    link, gf = r["small / link"], r["small / gridftp-globus"]
    return (f"{med_range(link)} of the link's payload rate; {med_range(gf, '{:.1f}')}× GridFTP with Globus presets",
            _yes(statistics.median(link) >= 0.80 and statistics.median(gf) >= 2))


def selfcheck(doc: dict, _: Path) -> tuple[str, str]:
    r = doc["result"]
    return (f"iperf3 -P {r.get('parallel', 16)} at {r['rate_ratio']:.3f} of the expected goodput; RTT {r['rtt_ms']:.1f} ms "
            f"({r['rtt_error_ms']:+.1f} ms; {len(r.get('rtt_echo_samples_ms', []))} samples, median)",
            _yes(abs(r["rate_ratio"] - 1) <= 0.05 and abs(r["rtt_error_ms"]) <= 2))


def trigger_latency(doc: dict, _: Path) -> tuple[str, str]:
    """File closed → new-files event, per poll interval: median (range) of every sample."""
    parts, ok = [], True
    for poll, t in sorted(doc["trigger"].items(), key=lambda kv: -float(kv[0])):
        xs = [x["latency"] for x in t["samples"]]
        parts.append(f"{med_range(xs)} s at {float(poll):g} s poll")
        ok = ok and statistics.median(xs) <= 1.0
    return "; ".join(parts), _yes(ok)


def operator_overhead(doc: dict, _: Path) -> tuple[str, str]:
    """The operator's time over ``fstream send``'s (CLI), each rep against the same rep, per dataset."""
    parts, ok = [], True
    for name, d in doc["datasets"].items():
        r = d["ratio_per_rep"]["send_cli"]
        extra = d["extra_s_per_rep"]["send_cli"]
        parts.append(f"{name}: {med_range(r)}× (extra {med_range(extra, '{:+.2f}')} s)")
        ok = ok and statistics.median(r) <= 1.05
    return "; ".join(parts), _yes(ok)


def _harp_cases(doc: dict, ratio: str) -> list[tuple[str, list[float]]]:
    return [(c["condition"], c["ratios"][ratio]["all"]) for c in doc["cases"]]


def harp_first_window(doc: dict, _: Path) -> tuple[str, str]:
    """harp / static over the same window after each transfer's own first byte (HARP's is inside its sample)."""
    cases = _harp_cases(doc, "harp/static first_window")
    text = "; ".join(f"{c}: {med_range(xs)}×" for c, xs in cases)
    at = "; ".join(f"{c}: {med_range(xs)}×" for c, xs in _harp_cases(doc, "harp/static alloc_offset_window"))
    return (text + f" over the first {doc.get('first_window', '2s')} after each one's first byte (HARP is then in "
            f"its sample, at the heuristic's settings); at HARP's allocation offset instead: {at}"), \
        _yes(all(xs and statistics.median(xs) >= 1.2 for _, xs in cases))


def harp_total(doc: dict, _: Path) -> tuple[str, str]:
    """harp / static total time, first byte to last byte landed, HARP's sample included (< 1: HARP is faster)."""
    cases = _harp_cases(doc, "harp/static total")
    wins = sum(bool(xs) and statistics.median(xs) < 1 for _, xs in cases)
    return "; ".join(f"{c}: {med_range(xs)}× static's time" for c, xs in cases), f"{wins} of {len(cases)} conditions"


def harp_validation(doc: dict, _: Path) -> tuple[str, str]:
    accs = [o["validation"]["accuracy"] for o in doc["optimizer"] if o["validation"].get("accuracy") is not None]
    rows = sorted({o["rows"] for o in doc["optimizer"]})
    why = "; ".join(sorted({o["validation"].get("reason", "") for o in doc["optimizer"]} - {""}))
    return (f"{med_range([a * 100 for a in accs], '{:.1f}')} % over {len(accs)} chunk(s) with a test group "
            f"(history of {', '.join(map(str, rows))} rows: {why})", _yes(bool(accs) and min(accs) >= 0.85))


def harp_optimizer(doc: dict, _: Path) -> tuple[str, str]:
    secs = [o["optimizer_seconds"] for o in doc["optimizer"]]
    return f"{med_range(secs)} s per chunk ({len(secs)} chunks)", _yes(bool(secs) and max(secs) <= 2.0)


def _q(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


def flow_latency(doc: dict, _: Path) -> tuple[str, str]:
    """File closed → landed record over every file of one run per watch mode."""
    parts, ok = [], True
    for r in doc["latency"]:
        xs = r["latencies_s"]
        parts.append(f"{r['watch']}: p50 {_q(xs, 50):.3f} s, p99 {_q(xs, 99):.3f} s ({len(xs)} files)")
        if r["watch"] == "inotify":
            ok = ok and _q(xs, 50) <= 0.1 and _q(xs, 99) <= 0.5
    return "; ".join(parts), _yes(ok)


def flow_throughput(doc: dict, _: Path) -> tuple[str, str]:
    """flow / ``fstream send`` per repeat (the modes interleaved within a repeat)."""
    parts, met = [], []
    for r in doc["throughput"]:
        f, s_ = r["runs_bps"]["flow"], r["runs_bps"]["send"]
        xs = [a / b for a, b in zip(f, s_)]
        parts.append(f"{r['files']:,} × {r['size'] // 1024:,} KiB: {med_range(xs)}")
        met.append(statistics.median(xs) >= 0.95)
    return "; ".join(parts) + " of `send`", "yes" if all(met) else ("no" if not any(met) else "partly")


def flow_memory(doc: dict, _: Path) -> tuple[str, str]:
    m = doc["memory"]
    return (f"{m['watch_maxrss_mib']:.0f} MiB peak over {m['files']:,} files (`send`: {m['send_maxrss_mib']:.0f} MiB; "
            "1 run each)", _yes(m["watch_maxrss_mib"] < 200))


def sim_default_vs_oracle(doc: dict, _: Path) -> tuple[str, str]:
    """The default variant's throughput over the grid oracle, every backlogged workload (deterministic)."""
    xs = {r["workload"]: r["of_oracle"] for r in doc["throughput"]
          if r["tuner"] == "default" and r["regime"] == "backlogged"}
    lo = min(xs, key=xs.get)
    return (f"{statistics.median(xs.values()):.2f} median, {min(xs.values()):.2f}–{max(xs.values()):.2f} over "
            f"{len(xs)} workloads (lowest: {lo}; deterministic)", _yes(min(xs.values()) >= 0.90))


def sim_mix_recovery(doc: dict, _: Path) -> tuple[str, str]:
    """``mix``: decision intervals after each change until throughput last sat below 0.85 of the phase's oracle."""
    rows = [r for r in doc["recovery"] if r["tuner"] == "default"]
    return ("; ".join(f"change {r['change']}: {r['intervals']:.1f} intervals ({r['recovered_s']:.1f} s)" for r in rows)
            + " (default, deterministic)", _yes(all(r["intervals"] <= 3 for r in rows)))


def trust_modes(doc: dict, _: Path) -> tuple[str, str]:
    """Each mode against ``hmac`` in the same round: both sides' CPU per GB and Gbit/s, loopback and WAN."""
    def mr(st: dict) -> str:
        return f"{st['median']:.2f} ({st['min']:.2f}–{st['max']:.2f})"
    parts = []
    for where in ("loopback", "wan"):
        cells = []
        for c in doc["summary"]:
            vs = c.get("vs_hmac")
            if c["where"] == where and vs and c["mode"] in ("hmac+encrypt", "tls"):
                cells.append(f"{c['mode']} on {c['case'].split(',')[0]}: CPU {mr(vs['cpu_per_gb'])}×, "
                             f"Gbit/s {mr(vs['bps'])}×")
        if cells:
            parts.append(f"{where}: " + "; ".join(cells))
    wan = doc.get("sites", {}).get("wan") or {}
    if wan.get("single_stream_of_path") is not None:
        parts.append(f"WAN buffer {wan['buffer_bytes'] / 2**20:.0f} MiB, one stream at "
                     f"{wan['single_stream_of_path']:.2f} of the path")
    n = {c["runs"] for c in doc["summary"]}
    return "; ".join(parts) + f" (against `hmac` per round; {min(n)}–{max(n)} rounds)", "measured"


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
    text = (f"median error ≤ {med_max:.0%}: {a}/{n}, p90 ≤ {p90_max:.0%}: {b}/{n}, converged ≤ 3 windows: {c_}/{n} "
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
    parts = [f"{mode}: aggregate {m['aggregate_of_link']:.2f}, Jain {m['jain']:.3f}" for mode, m in doc["modes"].items()]
    pooled = [m for mode, m in doc["modes"].items() if "pool" in mode and "no" not in mode]
    ok = bool(pooled) and all(m["aggregate_of_link"] >= 0.9 and m["jain"] >= 0.9 for m in pooled)
    return "; ".join(parts) + " (one run per mode)", _yes(ok)


def sched_burst(doc: dict, _: Path) -> tuple[str, str]:
    """The burst through the agents, one run per scheduler: STEAL's aggregate, Jain over the two equal
    interactive jobs, and whether every preempted job resent nothing; interactive slowdown against fifo."""
    st, ff = doc["modes"]["steal"], doc["modes"]["fifo"]
    pre = [j for j in st["jobs"].values() if j.get("preemptions")]
    clean = sum(bool(j.get("resent_nothing")) for j in pre)
    parts = [f"STEAL aggregate {st['aggregate_of_link']:.2f} (fifo {ff['aggregate_of_link']:.2f})",
             f"Jain {st['jain_interactive']:.3f}", f"preempted jobs that resent nothing {clean} / {len(pre)}",
             f"interactive avg slowdown {_pct(st['avg_slowdown_interactive'], ff['avg_slowdown_interactive'])} "
             f"vs fifo (one run each)"]
    met = sum([st["aggregate_of_link"] >= 0.9, st["jain_interactive"] >= 0.9, clean == len(pre)])
    return "; ".join(parts), f"{met} of 3"


def qos_thesis(doc: dict, _: Path) -> tuple[str, str]:
    """The thesis' own QoS mode: the median of the nine cases' median errors, against the thesis' 4–19 %."""
    med = [c["metrics"]["median_err"] * 100 for c in doc["cases"] if c.get("ok") and "median_err" in c.get("metrics", {})
           and c["metrics"]["median_err"] == c["metrics"]["median_err"]]  # NaN: no full window to judge
    if not med:
        raise ValueError("no case has a full decision window after convergence (a run too short for 10 s windows?)")
    m = statistics.median(med)
    return (f"median of the case medians {m:.1f} %; per case {min(med):.1f}–{max(med):.1f} % ({len(med)} of "
            f"{len(doc['cases'])} cases judged, "
            f"one run each, variant {doc.get('variant')})", "as a median" if 4 <= m <= 19 else "no")


def authz_cost(doc: dict, _: Path) -> tuple[str, str]:
    """Guarded / plain sender CPU per file within each ABBA pair, and the decision's p99 (issue 32)."""
    runs = doc["guard"]["runs"]
    pairs: dict[int, dict[str, float]] = defaultdict(dict)
    for r in runs:
        pairs[r["repeat"]][r["mode"]] = r["cpu_us_per_file"]
    xs = [p["guarded"] / p["plain"] for p in pairs.values() if len(p) == 2]
    d = doc["decide"]
    return (f"CPU per file {med_range(xs, '{:.3f}')}× unguarded ({doc['guard']['files']:,} × "
            f"{doc['guard']['size'] // 1024} KiB); decision p99 {d['p99_ms']:.2f} ms",
            _yes(statistics.median(xs) <= 1.05 and d["p99_ms"] <= 1.0))


# ---- issue 27: ETA, deadlines, the live view ----------------------------------------------------------------------

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
    return f"median |error| over {len(per)} workloads ({len(runs)} runs): " + ", ".join(cells), _yes(ok)


def deadline_sim(doc: dict, _: Path) -> tuple[str, str]:
    """Deadlines met, stream-seconds against the fewest-stream fixed setting, infeasible reported (simulator)."""
    s = doc["summary"]
    ratios = {k: v for k, v in s["stream_ratio"].items() if v.get("n")}
    worst = max(v["median"] for v in ratios.values())
    cells = ", ".join(f"{k}×: {v['median']:.2f}×" for k, v in ratios.items())
    rep = s["infeasible_reported_s"]
    return (f"met {s['met']}/{s['feasible']}; stream-seconds {cells} of the fewest-stream setting that meets it; "
            f"infeasible said at {rep['median']:.0f} s ({s['infeasible_reported']}/{s['infeasible_runs']})",
            _yes(s["met"] >= 0.95 * s["feasible"] and worst <= 1.15 and rep.get("max", 99) <= 10
                 and s["infeasible_reported"] == s["infeasible_runs"]))


def deadline_wan(doc: dict, _: Path) -> tuple[str, str]:
    """Deadline runs met on the emulated WAN, their stream-seconds, when infeasible was said."""
    s = doc["summary"]
    ratios = {k: v for k, v in s["stream_ratio"].items() if v.get("n")}
    cells = ", ".join(f"{k}×: {v['median']:.2f}× ({v['min']:.2f}–{v['max']:.2f})" for k, v in ratios.items())
    at = s.get("infeasible_reported_at_s")
    return (f"met {s['met']}/{s['runs']}; stream-seconds {cells}; infeasible said at "
            f"{'never' if at is None else f'{at:.1f} s'}",
            _yes(s["met"] >= 9 and all(v["median"] <= 1.15 for v in ratios.values()) and at is not None and at <= 10))


def view_freshness(doc: dict, _: Path) -> tuple[str, str]:
    """Agent interval -> value in the page's DOM, per view, measured in the browser (``bench live-view``)."""
    f = doc["freshness"]
    cells = [f"{name} p50 {v['summary']['p50_ms'] / 1e3:.2f} s, p99 {v['summary']['p99_ms'] / 1e3:.2f} s "
             f"({v['summary']['n']} values, {v['summary']['missed']} missed)" for name, v in f.items()]
    ok = all(v["summary"]["p50_ms"] <= 1000 and v["summary"]["p99_ms"] <= 2000 and v["summary"]["n"] for v in f.values())
    return "; ".join(cells), _yes(ok)


def plugin_cpu(doc: dict, _: Path) -> tuple[str, str]:
    """What the plugin adds to the api-server's CPU with the pages open, in one run (b − mean(a, c))."""
    c, cfg = doc["cpu"], doc["config"]
    return (f"+{c['added_pct_core']:.1f} % of a core ({cfg['jobs']} jobs, {cfg['pages']} pages; api-server "
            f"{c['api_total_pct_core']:.1f} % with them open)", _yes(c["added_pct_core"] <= 5.0))
