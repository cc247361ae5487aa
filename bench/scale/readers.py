"""Readers of the scale room's results for the goals table (``fstream_bench.scale.goals``): growth to 100k files,
the million-file stream, the facility's jobs, the history cache and retention. Each turns one result document into
(measured, met)."""

from __future__ import annotations

from pathlib import Path

from fstream_bench.core.readers import yes

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
    text = (f"{doc['files']:,} × {doc['size'] // 1024} KiB via {via}: "
            f"peak RSS sender {peaks['sender'] / 2**20:.0f} MiB, receiver {peaks['receiver'] / 2**20:.0f} MiB; "
            f"{doc['files_per_s']:.0f} files/s overall "
            f"({doc['steady_files_per_s'] or 0:.0f} steady); idle rescans list {idle['listed_max']} entries; restart: "
            f"first new file after {r['first_new_s'] or 0:.1f} s, {r['landed_new']} new and {r['landed_old_again']} "
            f"old files landed{redis}")
    ok = (doc["landed"] >= doc["files"] and max(peaks.values()) < 300 * MB and doc["files_per_s"] >= 2000
          and idle["listed_max"] == 0 and r["first_new_s"] is not None and r["first_new_s"] <= 60
          and r["landed_new"] == r["new_files"] and r["landed_old_again"] == 0)
    return text, yes(ok)


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
    return text, yes(ok)


def stream_redis_goal(doc: dict, _: Path) -> tuple[str, str]:
    """The stream as an agent's job: the agent's and the receiver's RSS, files/s, the restart (the agent's drain and
    a second agent taking the job back) and the bus's memory per file. Met: both peaks < 300 MB, ≥ 2,000 files/s,
    new bytes within 60 s of the restart and no landed file sent again, and the bus's memory bounded: at the last
    checkpoint at most 1.25× the memory at the one before, although it held twice the files or more."""
    cps = [c for c in doc["checkpoints"] if c.get("redis_bytes") is not None]
    r, peaks = doc["restart"], doc["peak_rss"]
    per = "; ".join(f"{c['files'] // 1000}k: {c['redis_bytes'] / 2**20:.1f} MiB "
                    f"({c['redis_bytes'] / c['files']:.0f} B/file)" for c in cps)
    text = (f"{doc['files']:,} × {doc['size'] // 1024} KiB as an `fstream agent` job: peak RSS agent "
            f"{peaks['sender'] / 2**20:.0f} MiB, receiver {peaks['receiver'] / 2**20:.0f} MiB; "
            f"{doc['files_per_s']:.0f} files/s; restart (drain, second agent): "
            f"first new file after {r['first_new_s'] or 0:.1f} s, "
            f"{r['landed_new']} new and {r['landed_old_again']} old files landed; Redis {per}")
    bounded = len(cps) >= 2 and cps[-1]["redis_bytes"] <= 1.25 * cps[-2]["redis_bytes"]
    ok = (bounded and doc["landed"] >= doc["files"] and max(peaks.values()) < 300 * MB and doc["files_per_s"] >= 2000
          and r["first_new_s"] is not None and r["first_new_s"] <= 60 and r["landed_new"] == r["new_files"]
          and r["landed_old_again"] == 0)
    return text, yes(ok)


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
    return text, yes(a["jobs_left"] == 0 and a["not_bounded_bytes"] == 0)


def history_cache_goal(doc: dict, _: Path) -> tuple[str, str]:
    """A job's history with a million rows: the first job's load, the incremental refresh, and the second job's
    model ready against the same jobs before the cache. Met (our goal): the second job's model ready ≤ 0.3 s."""
    j, load = doc["jobs"], doc["load"]["job_window"]
    before = j.get("before", {}).get("second", {}).get("model_ready_s")
    text = (f"{doc['rows']:,} rows: the job window ({load['entries']:,} rows) loads in {load['seconds']:.2f} s "
            f"(+{load['rss_delta_mb']:.0f} MiB); a refresh after {doc['new_rows']} new rows "
            f"{doc['refresh']['median_s'] * 1000:.1f} ms; model ready: first job "
            f"{j['cached']['first']['model_ready_s']:.2f} s, "
            f"second {j['cached']['second']['model_ready_s']:.3f} s"
            + (f" (before the cache: {before:.2f} s)" if before is not None else ""))
    return text, yes(j["cached"]["second"]["model_ready_s"] <= 0.3)


def scale(doc: dict, _: Path) -> tuple[str, str]:
    """Peak RSS at the largest checkpoint; idle scans (median of 5 each) at every checkpoint: flat means
    a scan's cost follows what is new, not what was ever seen (met: the largest ≤ 2× the smallest + 1 ms)."""
    cps = doc["checkpoints"]
    last = cps[-1]
    idle = [c["scan_idle_poll_s"] * 1000 for c in cps]
    new = [c["scan_new_poll_s"] * 1000 for c in cps]
    at = " / ".join(f"{c['files'] // 1000}k" for c in cps)
    text = (f"peak RSS sender {last['sender_peak_rss'] / 2**20:.0f} MiB, "
            f"receiver {last['receiver_peak_rss'] / 2**20:.0f} MiB at {last['files']:,} files; "
            f"idle scan {' / '.join(f'{x:.2f}' for x in idle)} ms and a scan "
            f"with {cps[0]['new_per_scan']:,} new files {' / '.join(f'{x:.0f}' for x in new)} ms at {at} (today's "
            f"watcher, polling)")
    ok = (all(c["landed"] >= c["files"] for c in cps)
          and max(last["sender_peak_rss"], last["receiver_peak_rss"]) < 500e6 and max(idle) <= 2 * min(idle) + 1)
    return text, yes(ok)
