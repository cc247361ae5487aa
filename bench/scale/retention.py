"""Issue 28: Redis memory of N finished jobs, per job and per key family, and what is left once their retention ends.

``python -m fstream_bench.scale.retention [--jobs 10000 --files 4 --intervals 10 --retention 180s]``

A fresh ``redis-server`` (``bus.embedded.RedisServer``: no AOF, nothing else on it). ``used_memory`` (``INFO memory``)
is read once the clients are connected and the scripts loaded (the baseline). Then ``--jobs`` signed jobs of
``--files`` source files each are submitted through ``JobStore`` with an idempotency key like the Airflow operator's,
and each is taken to its end exactly as an agent takes it, with the same calls and no agent process (the point is
the memory of finished jobs, not the transfers): read from the consumer group, ``claim`` (its ``claimed`` event),
the policy's audit ``decision`` and the nonce's ``first_use``, ``--intervals`` ``publish`` calls each carrying an
interval record as ``transfer_agent.sending.intervals`` writes them (two clusters, a tuner reason) with the
``progress`` field, a ``tuning`` event at the start, a ``file`` event per file (path, source, size, checksum),
HARP's history rows (one per cluster and interval, ``TransferHistory.append``), ``finish`` with a result holding
every interval (as ``TransferResult.to_dict()`` does), the audit ``outcome``, and the agent's housekeeping trim of
the acknowledged jobs stream.

Measured: used_memory delta / N = bytes per finished job; ``MEMORY USAGE`` of one job's hash and events stream;
``bus.retention.survey``'s bytes per key family (what expires with the job's retention and what does not: the
audit stream and the history are bounded by their MAXLEN, nonce keys by the agents' max job age). The jobs are
finished with ``--retention`` (long enough for all of them to be measured before the first expires: checked); the
bench then waits until Redis expired them, runs ``fstream gc``'s reclaim (the index entries), and reads
used_memory again: back near the baseline plus the bounded families.

Returns (and ``--json`` prints) a dict; nothing is written to ``BENCHMARKS.md`` by the bench itself.
"""

from __future__ import annotations


import argparse
import json
import secrets
import sys
import time
from typing import Any

from fstream_provider.bus.audit import AuditLog, first_use
from fstream_provider.bus.client import connect
from fstream_provider.bus.embedded import RedisServer
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import AUDIT_MAXLEN, HISTORY_MAXLEN, Keys
from fstream_provider.bus.retention import reclaim, survey
from fstream_provider.bus.transfer_history import TransferHistory
from fstream_provider.authz.signing import Signer
from fstream_provider.model.spec import TransferSpec
from fstream_provider.model.units import parse_duration
from fstream_provider.tuning.harp_history import HistoryRow

#: what a result exercised (``provenance``)
MODULES = ("fstream_provider.bus", "fstream_provider.authz", "fstream_provider.model", "fstream_bench.scale.retention")

DEST = "fstream://dtn02.slac.example.org:9000/lcls/xpp/run"
FILE_SIZE = 2_147_483_648  # 2 GiB detector files
# families that do not expire with a job (job_owners: one member per submitter the agents serve, issue 40)
BOUNDED = ("audit", "history", "nonce", "jobs_stream", "dead_letter", "job_owners")


def _used(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def _spec(i: int, files: int) -> TransferSpec:
    run = f"/sdf/data/lcls/ds/xpp/xppx1003221/xtc/run{i // 100:04d}"
    return TransferSpec(sources=[f"{run}/xppx1003221-r{i // 100:04d}-s{f:02d}-c00.xtc2" for f in range(files)],
                        destination=f"{DEST}{i // 100:04d}", tuner="fstream", key="default",
                        label=f"xpp run {i // 100} chunk {i % 100}")


def _interval(k: int, t0: float, files: int) -> dict[str, Any]:
    """An interval record as ``sending.intervals.interval_record`` writes it (two clusters, the tuner's reason)."""
    nbytes = 1_180_000_000 + 7919 * k
    return {"t": round(k + 1.0, 3), "dt": 1.0, "bytes": nbytes, "throughput_bps": nbytes * 8.0,
            "cc": 6, "p": 4, "pp": 2,
            "clusters": {"large": {"cc": 4, "p": 4, "pp": 2, "throughput_bps": nbytes * 6.4, "pending_files": 1},
                         "small": {"cc": 2, "p": 2, "pp": 4, "throughput_bps": nbytes * 1.6, "pending_files": 0}},
            "passive": 1, "active_files": min(files, 3), "files_done": min(files, k * files // 10),
            "files_failed": 0, "files_pending": max(0, files - 3 - k), "files_total": files, "target_bps": 9.0e9,
            "reason": "fstream: within 15% of the 9.0 Gbit/s target: hold cc=6 p=4 pp=2" if k else
                      "fstream: start from the heuristic's layout for 2.0 GiB files at 10 Gbit/s, 1 ms"}


def _history_rows(job_id: str, rec: dict[str, Any], now: float, files: int) -> list[HistoryRow]:
    return [HistoryRow(source="dtn01-4242", destination="dtn02.slac.example.org:9000", bandwidth_bps=1e10,
                       rtt_s=0.001, tcp_buffer=67_108_864, chunk="large", avg_file_size=float(FILE_SIZE),
                       file_count=files, cc=c["cc"], p=c["p"], pp=c["pp"], throughput_bps=c["throughput_bps"],
                       time=now, duration_s=1.0, group=f"{job_id}:{name}", kind="interval",
                       source_limited=False, background_bps=float("nan"))
            for name, c in rec["clusters"].items()]


def _take(store: JobStore, audit: AuditLog, history: TransferHistory, job_id: str, entry_id: str,
          spec: TransferSpec, files: int, intervals: int) -> None:
    """One job from the stream to its end, with the calls an agent makes."""
    claim = store.claim(job_id, entry_id, worker="dtn01-4242", max_deliveries=5)
    auth = json.loads(store.client.hget(store.keys.job(job_id), "auth"))
    first_use(store.client, store.keys, auth["submitter"], auth["nonce"], f"{job_id} {entry_id}", 7 * 86400 + 300)
    audit.record("decision", job_id=job_id, submitter="lcls-airflow", decision="accepted",
                 reason="signed by lcls-airflow; sources under /sdf/data/lcls", sources=spec.sources,
                 destination=spec.destination, key="default", agent="dtn01-4242")
    t0 = time.time()
    store.publish(job_id, claim.attempt, [("tuning", t0, {"reason": _interval(0, t0, files)["reason"],
                                                          "layouts": {"large": [4, 4, 2], "small": [2, 2, 4]}})])
    records = []
    for k in range(intervals):
        rec = _interval(k, t0, files)
        records.append(rec)
        events: list[tuple[str, float, dict]] = [("interval", t0 + k, rec)]
        if k % max(1, intervals // files) == 0 and k // max(1, intervals // files) < files:
            f = k // max(1, intervals // files)
            events.append(("file", t0 + k, {"path": spec.sources[f].rsplit("/", 1)[1], "source": spec.sources[f],
                                            "size": FILE_SIZE, "status": "committed", "resumed": False,
                                            "seconds": 1.83, "checksum": secrets.token_hex(16),
                                            "checksum_algo": "xxh3_128"}))
        store.publish(job_id, claim.attempt, events, fields={"progress": json.dumps(rec)})
        history.append(_history_rows(job_id, rec, t0 + k, files), now=t0 + k)
    result = {"job_id": job_id, "ok": True, "files": files, "bytes": files * FILE_SIZE, "bytes_sent": files * FILE_SIZE,
              "resumed_bytes": 0, "seconds": float(intervals), "throughput_bps": 9.4e9, "verified_files": files,
              "skipped_files": 0, "failed_files": 0, "failures": [], "intervals": records,
              "tuning": [{"t": 0.0, "reason": records[0]["reason"]}], "tuner": "fstream", "checksum": "xxh3_128",
              "rtt_s": 0.001, "error": None, "retryable": False, "cancelled": False}
    assert store.finish(job_id, claim.attempt, entry_id, state="succeeded", result=result)
    audit.record("outcome", job_id=job_id, submitter="lcls-airflow", outcome="succeeded", reason=None,
                 files=files, bytes=files * FILE_SIZE, agent="dtn01-4242")


def _family_bytes(report: Any) -> dict[str, int]:
    return {name: m["bytes"] for name, m in report.memory.items()}


def run(jobs: int = 10_000, *, files: int = 4, intervals: int = 10, retention_s: float = 180.0,
        expiry_timeout_s: float | None = None, log: Any = None) -> dict[str, Any]:
    """Measure the Redis memory of ``jobs`` finished jobs and of what is left after their retention (see above)."""
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    server = RedisServer().start()
    client = connect(server.url)
    try:
        keys = Keys("fstream")
        store = JobStore(client, keys=keys, retention_s=retention_s,
                         signer=Signer.generate("lcls-airflow"))
        audit, history = AuditLog(client, keys), TransferHistory(client, keys=keys)
        store.ensure_group()
        base = _used(client)
        t0 = time.monotonic()
        for i in range(jobs):
            store.submit(_spec(i, files), idempotency_key=f"lcls_xpp/scheduled__2026-11-25T00:00:00+00:00/transfer/{i}")
        t_submit = time.monotonic() - t0
        done, first_end = 0, None
        while done < jobs:
            got = client.xreadgroup(keys.jobs_group(), "dtn01-4242", {keys.jobs_stream(): ">"}, count=500)
            for entry_id, fields in (got[0][1] if got else []):
                job_id = fields["job_id"]
                spec = store.get(job_id).spec
                _take(store, audit, history, job_id, entry_id, spec, files, intervals)
                first_end = first_end or time.monotonic()
                done += 1
            if done and done % 5000 < 500:
                say(f"retention bench: {done}/{jobs} jobs finished")
        store.trim_acked()  # the agent's housekeeping
        t_all = time.monotonic() - t0
        finished = _used(client)
        one = store.list(limit=1)[0].job_id
        report = survey(client, keys)
        alive = report.jobs.get("succeeded", 0)
        if alive < jobs:
            say(f"retention bench: {jobs - alive} jobs expired before the measurement: use a longer --retention")
        per_family = _family_bytes(report)
        out: dict[str, Any] = {
            "jobs": jobs, "files_per_job": files, "intervals_per_job": intervals, "retention_s": retention_s,
            "seconds": {"submit": round(t_submit, 2), "all": round(t_all, 2)},
            "used_memory": {"baseline": base, "finished": finished},
            "bytes_per_job": round((finished - base) / jobs, 1),
            "one_job": {"hash": client.memory_usage(keys.job(one)), "events": client.memory_usage(keys.job_events(one)),
                        "events_entries": client.xlen(keys.job_events(one))},
            "families_bytes_per_job": {k: round(v / jobs, 1) for k, v in sorted(per_family.items())},
            "measured_before_expiry": alive == jobs,
        }
        expiring = sum(v for k, v in per_family.items() if k not in BOUNDED)
        out["expiring_bytes_per_job"] = round(expiring / jobs, 1)
        out["bounded_bytes_per_job"] = round((sum(per_family.values()) - expiring) / jobs, 1)
        audit_row = per_family.get("audit", 0) / max(1, report.streams.get("audit", {}).get("length", 1))
        history_row = per_family.get("history", 0) / max(1, report.streams.get("history", {}).get("length", 1))
        out["bounds"] = {"audit_bytes_at_maxlen": int(audit_row * AUDIT_MAXLEN),
                         "history_bytes_at_maxlen": int(history_row * HISTORY_MAXLEN)}
        # the retention ends: wait (from the last job's end) until Redis expired every job, then gc's reclaim
        wait_until = time.monotonic() + (expiry_timeout_s or retention_s + 60)
        say(f"retention bench: waiting for {jobs} jobs to expire ({retention_s:.0f} s retention)")
        while time.monotonic() < wait_until:
            left = survey(client, keys, sample=1).jobs.get("succeeded", 0)  # its SCAN expires what is due
            if not left:
                break
            time.sleep(min(5.0, max(0.5, retention_s / 10)))  # a benchmark waiting on Redis's clock
        after = survey(client, keys)
        gc_done = reclaim(client, keys, after)
        expired = _used(client)
        left_families = _family_bytes(survey(client, keys))
        out["after_retention"] = {
            "jobs_left": after.jobs.get("succeeded", 0), "gc_reclaimed": gc_done, "used_memory": expired,
            "delta_from_baseline": expired - base, "delta_per_job": round((expired - base) / jobs, 1),
            "families_bytes": left_families,
            "not_bounded_bytes": sum(v for k, v in left_families.items() if k not in BOUNDED)}
        return out
    finally:
        client.close()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fstream bench retention", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--files", type=int, default=4, help="source files per job (default 4)")
    p.add_argument("--intervals", type=int, default=10, help="interval events per job (default 10)")
    p.add_argument("--retention", default="180s", help="the jobs' retention; long enough to finish them all (180s)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--results", default=None, help="directory of the result file (default bench/results)")
    args = p.parse_args(argv)
    from fstream_bench.core.saved import run_saved

    out = run_saved("retention", list(sys.argv[1:] if argv is None else argv), MODULES,
                    lambda: run(args.jobs, files=args.files, intervals=args.intervals,
                                retention_s=parse_duration(args.retention)), args.results)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{out['jobs']} finished jobs: {out['bytes_per_job']:.0f} bytes/job used_memory "
              f"({out['expiring_bytes_per_job']:.0f} expire with the job, {out['bounded_bytes_per_job']:.0f} in "
              f"bounded streams/keys); one job: hash {out['one_job']['hash']} B, events {out['one_job']['events']} B "
              f"({out['one_job']['events_entries']} entries)")
        a = out["after_retention"]
        print(f"after the retention + gc: {a['jobs_left']} jobs left, used_memory {a['delta_from_baseline']:+d} B "
              f"from the baseline ({a['delta_per_job']:.0f} B/job: the bounded families), "
              f"{a['not_bounded_bytes']} B in the families that expire")
    return 0


if __name__ == "__main__":
    sys.exit(main())
