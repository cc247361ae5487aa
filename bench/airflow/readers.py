"""Readers of the Airflow room's results for the goals table: trigger latency, the operator's overhead, the live
view's freshness and CPU, the triggerer at scale. Each turns one result document into (measured, met);
``fstream_bench.airflow.goals`` says which result each goal reads with which reader (the Airflow soak's reader
sits beside the soak, ``fstream_bench.airflow.soak.soak_goal``)."""

from __future__ import annotations

import statistics
from pathlib import Path

from fstream_bench.core.readers import yes
from fstream_bench.core.runstats import med_range


def trigger_latency(doc: dict, _: Path) -> tuple[str, str]:
    """File closed → new-files event, per poll interval: median (range) of every sample."""
    parts, ok = [], True
    for poll, t in sorted(doc["trigger"].items(), key=lambda kv: -float(kv[0])):
        xs = [x["latency"] for x in t["samples"]]
        parts.append(f"{med_range(xs)} s at {float(poll):g} s poll")
        ok = ok and statistics.median(xs) <= 1.0
    return "; ".join(parts), yes(ok)


def operator_overhead(doc: dict, _: Path) -> tuple[str, str]:
    """The operator's time over ``fstream send``'s (CLI), each rep against the same rep, per dataset."""
    parts, ok = [], True
    for name, d in doc["datasets"].items():
        r = d["ratio_per_rep"]["send_cli"]
        extra = d["extra_s_per_rep"]["send_cli"]
        parts.append(f"{name}: {med_range(r)}× (extra {med_range(extra, '{:+.2f}')} s)")
        ok = ok and statistics.median(r) <= 1.05
    return "; ".join(parts), yes(ok)


def view_freshness(doc: dict, _: Path) -> tuple[str, str]:
    """Agent interval -> value in the page's DOM, per view, measured in the browser (``bench live-view``)."""
    f = doc["freshness"]
    cells = [f"{name} p50 {v['summary']['p50_ms'] / 1e3:.2f} s, p99 {v['summary']['p99_ms'] / 1e3:.2f} s "
             f"({v['summary']['n']} values, {v['summary']['missed']} missed)" for name, v in f.items()]
    ok = all(v["summary"]["p50_ms"] <= 1000 and v["summary"]["p99_ms"] <= 2000 and v["summary"]["n"]
             for v in f.values())
    return "; ".join(cells), yes(ok)


def plugin_cpu(doc: dict, _: Path) -> tuple[str, str]:
    """What the plugin adds to the api-server's CPU with the pages open, in one run (b − mean(a, c))."""
    c, cfg = doc["cpu"], doc["config"]
    return (f"+{c['added_pct_core']:.1f} % of a core ({cfg['jobs']} jobs, {cfg['pages']} pages; api-server "
            f"{c['api_total_pct_core']:.1f} % with them open)", yes(c["added_pct_core"] <= 5.0))


def triggerer_goal(doc: dict, _: Path) -> tuple[str, str]:
    """200 deferred transfer tasks on one triggerer: its Redis connections at peak and CPU, shared follower against
    one client per trigger, in one run. Met (our bound): ≤ 5 connections at peak in every window with the mux."""
    modes = doc["modes"]
    mux = modes.get("mux", {})
    parts = []
    for mode, m in modes.items():
        parts.append(f"{mode}: " + ", ".join(f"{w} {m[w]['conn_peak']} conn / {m[w]['cpu_per_wall']} CPU-s/s"
                                              for w in ("queued", "running", "finish") if w in m))
    text = f"{doc['tasks']} deferred tasks: " + "; ".join(parts)
    ok = bool(mux) and all(mux[w]["conn_peak"] <= 5 for w in ("queued", "running", "finish") if w in mux)
    return text, yes(ok)
