"""Readers of the scheduling room's results for the goals table: SEAL and STEAL on the replayed traces, the burst
through agents with pools on the WAN, the scheduling cycle's Redis cost. Each turns one result document into
(measured, met); ``fstream_bench.scheduling.goals`` says which result each goal reads with which reader."""

from __future__ import annotations

import statistics
from pathlib import Path

from fstream_bench.core.readers import yes
from fstream_bench.core.runstats import med_range


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
    return "; ".join(parts) + f" (vs BaseVary; spare / SEAL's; seed {doc['config']['seed']})", yes(ok)


def _by_trace(doc: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in doc["rows"]:
        out.setdefault(row["trace"], []).append(row)
    return out


def seal_at_load(doc: dict, _: Path) -> tuple[str, str]:
    """``fstream bench seal-load``: the rule for ordinary load against the best baseline of each run, per trace shape
    over the fresh seeds (median and range of the reduction in average bounded slowdown). The rule is shortest
    remaining first past the knee (``srpt-share``) where the result has it, else SEAL that shares below the knee
    (``seal-share``, older results), beside seal-share, what the idealized SRPT reaches (``sched_srpt``: free
    preemption, exact rates, no external load; absent in older results) and the floor (every task alone), and in how
    many runs the goal lies below the floor (where no scheduler can reach it under the replay's charges). Met: a
    median reduction ≥ 20 % at 25 %, 45 % and 60 %, and never worse than the best baseline in any run of any trace."""
    rule = "srpt-share" if all("srpt-share" in r["results"] for r in doc["rows"]) else "seal-share"
    parts, loads_met, worse = [], 0, 0
    for name, rows in _by_trace(doc).items():
        gains, share, floors, ideal = [], [], [], []
        for row in rows:
            res = row["results"]
            best = min(res[b]["avg_slowdown"] for b in BASELINES)
            gains.append(100 * (1 - res[rule]["avg_slowdown"] / best))
            share.append(100 * (1 - res["seal-share"]["avg_slowdown"] / best))
            floors.append(100 * (1 - row["floor"]["avg_slowdown"] / best))
            if "srpt" in row:
                ideal.append(100 * (1 - row["srpt"]["avg_slowdown"] / best))
            worse += res[rule]["avg_slowdown"] > best
        beside = [f"seal-share {med_range(share, '{:.0f} %')}"] if rule != "seal-share" else []
        beside += [f"idealized SRPT {med_range(ideal, '{:.0f} %')}"] if ideal else []
        beside += [f"floor {med_range(floors, '{:.0f} %')}"]
        under = sum(f < 20 for f in floors)  # 20 % lower would be below every task alone: no scheduler gets there
        beside += [f"20 % lower is below the floor in {under} of {len(floors)} runs"] if under else []
        parts.append(f"{name}: {med_range(gains, '{:.0f} %')} lower ({', '.join(beside)})")
        loads_met += name in ("25%", "45%", "60%") and statistics.median(gains) >= 20
    runs = len(doc["rows"])
    return f"{rule}: " + "; ".join(parts) + f"; worse than the best baseline in {worse} of {runs} runs (seeds " \
        f"{', '.join(map(str, doc['seeds']))}{', fresh' if doc.get('seeds_fresh') else ''})", \
        f"{loads_met} of 3 loads; {'never worse' if not worse else 'worse in ' + str(worse)}"


def steal_share_at_load(doc: dict, _: Path) -> tuple[str, str]:
    """``fstream bench seal-load`` with batch: the spare bandwidth batch tasks used under STEAL (with the sharing
    admission) against SEAL's, per trace shape over the seeds. Met: the median ≥ 0.9 on every trace."""
    parts, ok = [], True
    for name, rows in _by_trace(doc).items():
        shares = [r["batch"]["steal-share"]["batch_spare_fraction"] / r["batch"]["seal-share"]["batch_spare_fraction"]
                  for r in rows if "batch" in r]
        if not shares:
            return "no batch replays in this result", "no"
        parts.append(f"{name}: {med_range(shares, '{:.3f}')}")
        ok = ok and statistics.median(shares) >= 0.9
    return "; ".join(parts) + " of SEAL's spare (both sharing below the knee)", yes(ok)


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


def sched_cycle_goal(doc: dict, _: Path) -> tuple[str, str]:
    """An idle agent's scheduling cycle at the largest live count, with and without finished jobs: wall time,
    Redis commands, and the idle agents' Redis operations per second. Met: the steady cycle ≤ 10 ms, its commands
    the same with 0 and with the most finished jobs, and every idle agent's ops/s the same at every size (±20 %)."""
    rows = doc["rows"]
    top = max(r["live"] for r in rows)
    at = {r["finished"]: r for r in rows if r["live"] == top}
    lo, hi = at[min(at)], at[max(at)]
    steady = [r["cycle"]["steady"] for r in (lo, hi)]
    ops = {m: [r["idle"][m]["ops_per_agent_s"] for r in rows] for m in rows[0]["idle"]}
    text = (f"at {top:,} live jobs: steady cycle {steady[0]['wall_ms']:.2f} ms with {int(steady[0]['commands'])} "
            f"commands ({min(at):,} finished) and {steady[1]['wall_ms']:.2f} ms with {int(steady[1]['commands'])} "
            f"({max(at):,} finished); a cold cycle {lo['cycle']['cold']['wall_ms']:.1f} ms; idle agents' Redis ops/s "
            + ", ".join(f"{m} {min(v):.1f}–{max(v):.1f}" for m, v in ops.items())
            + f" over {len(rows)} sizes ({doc['agents']} agents)")
    ok = (max(s["wall_ms"] for s in steady) <= 10 and steady[0]["commands"] == steady[1]["commands"]
          and all(max(v) <= 1.2 * min(v) for v in ops.values()))
    return text, yes(ok)
