"""Readers of issue 28's results for the goals table (``bench/goals.py``): the million-file stream and the facility's
jobs. Each turns one result document into (measured, met)."""

from __future__ import annotations

from pathlib import Path

MB = 1e6


def stream_goal(doc: dict, _: Path) -> tuple[str, str]:
    """A million-file ``--watch`` stream: peak RSS of both sides, files/s, idle rescans, and the restart.

    Met: both peaks < 300 MB, ≥ 2,000 files/s overall, idle rescans list nothing (O(new files)), the restart moves
    new bytes within 60 s and lands only the new files."""
    last, r, idle = doc["checkpoints"][-1], doc["restart"], doc["idle_scans"]
    peaks = doc["peak_rss"]
    via = "`fstream agent` job" if doc.get("via") == "agent" else "`fstream send --watch`"
    redis = (f"; Redis {doc['checkpoints'][-1]['redis_bytes'] / last['files']:.0f} B per file at "
             f"{last['files']:,}" if last.get("redis_bytes") is not None else "")
    text = (f"{doc['files']:,} × {doc['size'] // 1024} KiB via {via}: peak RSS sender {peaks['sender'] / 2**20:.0f} MiB, "
            f"receiver {peaks['receiver'] / 2**20:.0f} MiB; {doc['files_per_s']:.0f} files/s overall "
            f"({doc['steady_files_per_s'] or 0:.0f} steady); idle rescans list {idle['listed_max']} entries; restart: "
            f"first new file after {r['first_new_s'] or 0:.1f} s, {r['landed_new']} new and {r['landed_old_again']} "
            f"old files landed{redis}")
    ok = (doc["landed"] >= doc["files"] and max(peaks.values()) < 300 * MB and doc["files_per_s"] >= 2000
          and idle["listed_max"] == 0 and r["first_new_s"] is not None and r["first_new_s"] <= 60
          and r["landed_new"] == r["new_files"] and r["landed_old_again"] == 0)
    return text, "yes" if ok else "no"


def facility_goal(doc: dict, _: Path) -> tuple[str, str]:
    """Submit → first byte (the file's OPEN) of small interactive jobs while the board is deep; met at p50 ≤ 0.3 s
    and p99 ≤ 1 s with every probe succeeded."""
    s = doc["to_opened"]
    text = (f"submit → first byte p50 {s['p50']:.3f} s, p99 {s['p99']:.3f} s ({s['min']:.3f}–{s['max']:.3f}, "
            f"{s['n']} probes; claimed p50 {doc['to_claimed']['p50']:.3f} s; "
            + (f"after {doc['warm']} warm-up jobs on {doc.get('warm_agents')} agents" if doc.get("warm")
               else "cold agents") + f") with {doc['live']:,} live jobs, "
            f"{doc['agents']} agents, {doc['history']:,} history rows; agents' CPU {doc['agents_cpu_per_s']:.2f} s/s, "
            f"Redis {doc['redis_cmds_per_s']:.0f} commands/s")
    ok = s["n"] == doc["probes"] and doc["succeeded"] == doc["probes"] and s["p50"] <= 0.3 and s["p99"] <= 1.0
    return text, "yes" if ok else "no"


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
    return text, "yes" if ok else "no"


def stream_redis_goal(doc: dict, _: Path) -> tuple[str, str]:
    """The stream as an agent's job: the agent's and the receiver's RSS, files/s, the restart (the agent's drain and
    a second agent taking the job back) and the bus's memory per file. Met: both peaks < 300 MB, ≥ 2,000 files/s,
    new bytes within 60 s of the restart and no landed file sent again, and the bus's memory bounded: at the last
    checkpoint at most 1.25× the memory at the one before, although it held twice the files or more."""
    cps = [c for c in doc["checkpoints"] if c.get("redis_bytes") is not None]
    r, peaks = doc["restart"], doc["peak_rss"]
    per = "; ".join(f"{c['files'] // 1000}k: {c['redis_bytes'] / 2**20:.1f} MiB ({c['redis_bytes'] / c['files']:.0f} B/file)"
                    for c in cps)
    text = (f"{doc['files']:,} × {doc['size'] // 1024} KiB as an `fstream agent` job: peak RSS agent "
            f"{peaks['sender'] / 2**20:.0f} MiB, receiver {peaks['receiver'] / 2**20:.0f} MiB; {doc['files_per_s']:.0f} "
            f"files/s; restart (drain, second agent): first new file after {r['first_new_s'] or 0:.1f} s, "
            f"{r['landed_new']} new and {r['landed_old_again']} old files landed; Redis {per}")
    bounded = len(cps) >= 2 and cps[-1]["redis_bytes"] <= 1.25 * cps[-2]["redis_bytes"]
    ok = (bounded and doc["landed"] >= doc["files"] and max(peaks.values()) < 300 * MB and doc["files_per_s"] >= 2000
          and r["first_new_s"] is not None and r["first_new_s"] <= 60 and r["landed_new"] == r["new_files"]
          and r["landed_old_again"] == 0)
    return text, "yes" if ok else "no"


def retention_goal(doc: dict, _: Path) -> tuple[str, str]:
    """Redis memory of finished jobs, and after their retention and ``fstream gc``. Met: nothing of the jobs is
    left (every job key expired, 0 bytes in the families that expire); what stays is in bounded streams."""
    a = doc["after_retention"]
    one = doc["one_job"]
    text = (f"{doc['jobs']:,} finished jobs: {doc['bytes_per_job']:.0f} B per job ({doc['expiring_bytes_per_job']:.0f} "
            f"expire with the job, {doc['bounded_bytes_per_job']:.0f} in bounded streams: history, audit, nonces); "
            f"one job's hash {one['hash']} B, events {one['events']} B ({one['events_entries']} entries); after the "
            f"retention and gc: {a['jobs_left']} jobs left, {a['not_bounded_bytes']} B in the expiring families, "
            f"{a['delta_per_job']:.0f} B per job left in the bounded ones")
    return text, "yes" if a["jobs_left"] == 0 and a["not_bounded_bytes"] == 0 else "no"


def history_cache_goal(doc: dict, _: Path) -> tuple[str, str]:
    """A job's history with a million rows: the first job's load, the incremental refresh, and the second job's
    model ready against the same jobs before the cache. Met (our goal): the second job's model ready ≤ 0.3 s."""
    j, load = doc["jobs"], doc["load"]["job_window"]
    before = j.get("before", {}).get("second", {}).get("model_ready_s")
    text = (f"{doc['rows']:,} rows: the job window ({load['entries']:,} rows) loads in {load['seconds']:.2f} s "
            f"(+{load['rss_delta_mb']:.0f} MiB); a refresh after {doc['new_rows']} new rows "
            f"{doc['refresh']['median_s'] * 1000:.1f} ms; model ready: first job {j['cached']['first']['model_ready_s']:.2f} s, "
            f"second {j['cached']['second']['model_ready_s']:.3f} s"
            + (f" (before the cache: {before:.2f} s)" if before is not None else ""))
    return text, "yes" if j["cached"]["second"]["model_ready_s"] <= 0.3 else "no"


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
    return text, "yes" if ok else "no"
