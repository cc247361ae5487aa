"""What is live on the bus, read in one snapshot: the data of "watch a transfer live" (issue 27).

One reader for every live view: the Airflow UI's overview and job view (``fstream_provider.ui``),
``fstream top`` and ``fstream status --json`` (``transfer_agent.cli``). It only reads: job hashes,
their event streams, the agents' heartbeats, the stream pools and the scheduler board; it writes
nothing and runs no script, so Redis's ``viewer`` role (``bus.acl``) is enough for it; under the
``submitter`` role (Airflow's connection) the pools and the board are left out and named ``unreadable``.

- ``job_row``: one job as a flat JSON-able dict: its spec's essentials, the Airflow task it belongs to
  (``airflow_ref``), and the agent's latest interval record (``JobState.progress``) with the rate,
  cc/p/pp, files, bytes, the tuner's reason, and the ETA, lag and deadline when the agent reports them.
- ``overview``: agents, jobs (running, then queued, then the newest finished) with a throughput
  sparkline each, pools and the board, in a handful of pipelined round trips however many jobs there are.
- ``job_detail``: one job's row with its intervals, tuning decisions and per-file table, read from its
  event stream (``after=`` continues where the last call stopped).
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Collection
from typing import Any

import redis

from fstream_provider.bus.job_state import STATES, TERMINAL_STATES, JobState, decode_event
from fstream_provider.bus.jobs import JobStore, recent_job_ids
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.pools import StreamPools
from fstream_provider.bus.sched_board import SchedBoard
from fstream_provider.model.intervals import fold_slivers

# ``dag_id/run_id/task_id/map_index`` (the operator's key), then ``#tryN`` or ``#tryN.R`` on a redo; no part
# holds a '/' (Airflow forbids it in dag, task and run ids), a run id may hold ':' and '+'
_AIRFLOW_KEY = re.compile(r"^([^/#]+)/([^/]+)/([^/#]+)/(-?\d+)(?:#try\d+(?:\.\d+)?)?$")

# the interval record's fields a row carries (absent from an older agent's record: None)
PROGRESS_FIELDS = ("throughput_bps", "cc", "p", "pp", "clusters", "files_done", "files_pending", "files_failed",
                   "files_total", "bytes_done", "bytes_total", "target_bps", "t", "dt",
                   "active_files", "bytes_left")  # in flight: opened, not landed; sent = total - left
# what the agents add for issue 27, passed through untouched: eta {s, lo, hi, rate_bps, basis},
# lag {oldest_s, p50_s, p99_s, landed}, deadline {at, target_bps, state, message}
LIVE_FIELDS = ("eta", "lag", "deadline")
INTERVAL_FIELDS = ("t", "dt", "bytes", "throughput_bps", "cc", "p", "pp", "target_bps", "reason")  # dt, bytes: to fold
FILE_FIELDS = ("path", "source", "status", "size", "checksum", "algo", "reason", "resumed", "seconds")

INDEX_SCAN = 10_000  # newest jobs of the index looked at for the overview (a job's state: one HMGET field)
SPARK_READS = (4, 16, 64)  # events read per wanted point, pass by pass (file events sit between intervals)
_ROW_HASH_FIELDS = ("job_id", "state", "attempt", "spec", "worker", "created_at", "updated_at", "error",
                    "idempotency_key", "deliveries", "cancel_requested", "progress", "preemptions",
                    "preempt_reason", "auth", "totals")  # no ``result``: a finished job's holds every interval
# record; ``totals`` (``JobStore.finish``) are its sums, the average rate among them


def airflow_ref(idempotency_key: str | None) -> dict | None:
    """The Airflow task instance a job was submitted for, from its idempotency key, or None.

    The operator's keys are ``dag_id/run_id/task_id/map_index`` with ``#tryN`` (or ``#tryN.R``) after a
    redo; a job submitted another way (``fstream submit``, a flow) has no key or another shape: None.
    """
    m = _AIRFLOW_KEY.match(idempotency_key or "")  # as given: JobState drops the submitter's prefix (issue 40)
    if m is None:
        return None
    return {"dag_id": m.group(1), "run_id": m.group(2), "task_id": m.group(3), "map_index": int(m.group(4))}


def job_row(job: JobState, now: float | None = None, spark: list[float] | None = None) -> dict:
    """One job as a flat JSON-able dict (the overview's row, ``fstream top``'s line, ``status --json``'s "live").

    The progress fields are the latest interval record's (None when the agent did not report one);
    ``eta``, ``lag`` and ``deadline`` pass through as the agent wrote them. A finished job whose record
    lacks the rate or bytes gets them from its result when the job carries one, and its rate is always the
    average over the run, never its last (often a sliver's) interval: the overview reads the job's ``totals``
    instead of its whole result.
    """
    now = time.time() if now is None else now
    prog = job.progress if isinstance(job.progress, dict) else {}
    spec = job.spec
    row: dict[str, Any] = {
        "job_id": job.job_id, "state": job.state, "label": spec.label, "submitter": job.submitter,
        "worker": job.worker, "attempt": job.attempt, "created_at": job.created_at, "updated_at": job.updated_at,
        "age_s": round(max(0.0, now - job.updated_at), 3) if job.updated_at else None,
        "interval_s": spec.sample_interval_s,  # how often a running job's numbers are renewed (the pages' staleness)
        "error": job.error, "destination": spec.destination, "sources": list(spec.sources), "tuner": spec.tuner,
        "cancel_requested": job.cancel_requested, "airflow": airflow_ref(job.idempotency_key),
    }
    for name in PROGRESS_FIELDS:
        row[name] = prog.get(name)
    row["reason"] = prog.get("reason") or None
    for name in LIVE_FIELDS:
        value = prog.get(name)
        row[name] = value if value not in ("", {}) else None
    if job.terminal and isinstance(job.result, dict):
        r = job.result
        if row["bytes_done"] is None and r.get("bytes") is not None:
            row["bytes_done"] = r.get("bytes")
        if r.get("throughput_bps") is not None:
            row["throughput_bps"] = r.get("throughput_bps")  # a finished job's rate: its average
        if row["files_done"] is None and r.get("verified_files") is not None:
            row["files_done"] = int(r.get("verified_files") or 0) + int(r.get("skipped_files") or 0)
            row["files_failed"] = r.get("failed_files")
    row["spark"] = [float(x) for x in spark] if spark else []
    return row


# ---------------------------------------------------------------------------------------------------- overview
def overview(client: Any, keys: Keys, *, limit: int = 200, now: float | None = None, spark_points: int = 30,
             trail: "SparkTrail | None" = None, owner: str | None = None) -> dict:
    """Everything live on the bus for one namespace (see the module docstring); reads only.

    ``unreadable`` names the sections (``pools``, ``board``) the client's Redis user may not read (the
    ``submitter`` role; ``viewer`` and ``agent`` read all): they are empty then, the rest is complete.
    Jobs: running first, then queued (and preempted: waiting to run again), then the newest finished;
    newest first within each group; at most ``limit``. A running job's ``spark`` is the throughput of its
    last ``spark_points`` interval events, oldest first. Round trips do not grow with the number of jobs:
    the indexes and the agents, every job's state, the chosen jobs' hashes, and the sparklines (up to
    ``len(SPARK_READS)`` passes) are each one pipeline. A caller that reads the overview again and again (the
    UI's feed, ``fstream top``) passes the same ``trail``: then only events newer than the last read are read.
    """
    now = time.time() if now is None else now
    ids = recent_job_ids(client, keys, owner=owner, limit=INDEX_SCAN)  # what this user may list (issue 40)
    agent_names = sorted(client.smembers(keys.agents()))

    pipe = client.pipeline(transaction=False)
    for name in agent_names:
        pipe.hgetall(keys.agent(name))
    beats = pipe.execute() if agent_names else []
    agents = [_agent_row(name, h, now) for name, h in zip(agent_names, beats)]

    seen = set(ids)
    ids = list(ids) + sorted({a["job_id"] for a in agents if a["job_id"] and a["job_id"] not in seen})
    chosen = _choose(client, keys, ids, limit)
    jobs = _read_jobs(client, keys, chosen)
    running = [j.job_id for j in jobs if j.state == "running"]
    if spark_points <= 0:
        sparks: dict[str, tuple[list[float], str | None]] = {}
    else:
        sparks = (trail or SparkTrail(spark_points)).read(client, keys, running)
    rows = []
    for job in jobs:
        points, reason = sparks.get(job.job_id, ([], None))
        row = job_row(job, now=now, spark=points)
        if not row["reason"] and reason:
            row["reason"] = reason
        rows.append(row)

    unreadable: list[str] = []
    pool_rows: list[dict] = []
    board: dict[str, dict] = {}
    try:
        pools = StreamPools(client, keys)
        for src, dst in pools.pairs():
            pool_rows.append({"src": src, "dst": dst, **pools.status(src, dst)})
    except redis.exceptions.NoPermissionError:  # the submitter role (Airflow's connection) may not read pools
        unreadable.append("pools")
    try:
        board = SchedBoard(client, keys).tasks()
    except redis.exceptions.NoPermissionError:
        unreadable.append("board")
    return {"generated_at": now, "agents": agents, "jobs": rows, "pools": pool_rows, "board": board,
            "unreadable": unreadable}


def _agent_row(name: str, h: dict[str, str], now: float) -> dict:
    """An agent's heartbeat hash as a row; alive while the hash (a key with a TTL) exists (``agents.live_agents``)."""
    seen = _float(h.get("seen"))
    return {"name": name, "host": h.get("host"), "pid": _int(h.get("pid")), "alive": bool(h),
            "job_id": h.get("job_id") or None, "attempt": _int(h.get("attempt")),
            "started_at": _float(h.get("started_at")),
            "heartbeat_age_s": round(max(0.0, now - seen), 3) if seen is not None else None}


def _choose(client: Any, keys: Keys, ids: list[str], limit: int) -> list[str]:
    """The ids to show: running, then waiting, then finished; each group in ``ids``' order (newest first)."""
    if not ids or limit <= 0:
        return []
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(keys.job(job_id), "state")
    states = pipe.execute()
    rank = {"running": 0, "queued": 1, "preempted": 1}
    order = sorted((rank.get(s, 2), i) for i, s in enumerate(states) if s in STATES)
    return [ids[i] for _r, i in order[:limit]]


def _read_jobs(client: Any, keys: Keys, ids: list[str]) -> list[JobState]:
    if not ids:
        return []
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(keys.job(job_id), _ROW_HASH_FIELDS)
    out = []
    for values in pipe.execute():
        h = {k: v for k, v in zip(_ROW_HASH_FIELDS, values) if v is not None}
        if h.get("totals"):  # what ``job_row`` reads of a finished job's result: its average, not its last sliver
            h["result"] = h["totals"]
        if "job_id" not in h or "spec" not in h:
            continue  # expired or deleted between the two reads
        try:
            out.append(JobState.from_hash(h))
        except (ValueError, KeyError, TypeError):
            continue  # a hash something else than JobStore wrote: not a job to show
    return out


class SparkTrail:
    """Running jobs' sparklines kept between overviews (issue 27: the UI's overview, re-read every 0.5 s for 50
    jobs, spent 9 in 10 of the plugin's CPU re-reading each job's newest 120 events; ``bench live-view``).

    A job seen for the first time is read backwards (``_sparks``); after that only its events newer than the
    last one read (``XRANGE`` from there, one pipeline for all jobs). Jobs no longer running are forgotten.
    """

    def __init__(self, points: int = 30, forward_count: int = 1000) -> None:
        self.points, self.forward_count = points, forward_count
        self._jobs: dict[str, tuple[str, deque, str | None]] = {}  # job -> (newest id read, points, reason)

    def read(self, client: Any, keys: Keys, job_ids: list[str]) -> dict[str, tuple[list[float], str | None]]:
        for gone in set(self._jobs) - set(job_ids):
            del self._jobs[gone]
        new = [j for j in job_ids if j not in self._jobs]
        for job_id, (points, reason, newest) in _sparks(client, keys, new, self.points, newest=True).items():
            self._jobs[job_id] = (newest or "0-0", deque(points, maxlen=self.points), reason)
        old = [j for j in job_ids if j not in new]
        if old:
            pipe = client.pipeline(transaction=False)
            for job_id in old:
                pipe.xrange(keys.job_events(job_id), min=_after(self._jobs[job_id][0]), max="+",
                            count=self.forward_count)
            for job_id, entries in zip(old, pipe.execute()):
                last, points, reason = self._jobs[job_id]
                for entry_id, fields in entries:
                    last = entry_id
                    kind = fields.get("kind")
                    if kind not in ("interval", "tuning"):
                        continue
                    ev = decode_event(entry_id, fields)[1]
                    reason = str(ev["reason"]) if ev.get("reason") else reason
                    if kind == "interval":
                        points.append(_float(ev.get("throughput_bps")) or 0.0)
                self._jobs[job_id] = (last, points, reason)
        return {j: (list(self._jobs[j][1]), self._jobs[j][2]) for j in job_ids}


def _after(entry_id: str) -> str:
    """The smallest stream id above ``entry_id`` (an exclusive bound that also works before Redis 6.2)."""
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


def _sparks(client: Any, keys: Keys, job_ids: list[str], points: int,
            newest: bool = False) -> dict[str, tuple]:
    """Each job's last ``points`` interval throughputs (oldest first) and the newest tuner reason seen on the way
    (and, with ``newest``, the id of the job's newest event, where a ``SparkTrail`` continues).

    Reads the newest events backwards (``XREVRANGE`` with a count), all jobs in one pipeline per pass; a job
    whose newest events are mostly per-file events is read further in the next pass, up to ``SPARK_READS``.
    """
    found: dict[str, list[float]] = {j: [] for j in job_ids}
    reasons: dict[str, str | None] = {j: None for j in job_ids}
    top: dict[str, str | None] = {j: None for j in job_ids}
    cursor: dict[str, str] = {j: "+" for j in job_ids}
    todo = list(job_ids)
    for factor in SPARK_READS:
        if not todo:
            break
        count = max(1, points * factor)
        pipe = client.pipeline(transaction=False)
        for job_id in todo:
            pipe.xrevrange(keys.job_events(job_id), max=cursor[job_id], min="-", count=count)
        nxt = []
        for job_id, entries in zip(todo, pipe.execute()):
            if entries and top[job_id] is None:
                top[job_id] = entries[0][0]
            for entry_id, fields in entries:
                kind = fields.get("kind")
                if kind not in ("interval", "tuning"):
                    continue
                _id, ev = decode_event(entry_id, fields)
                if reasons[job_id] is None and ev.get("reason"):
                    reasons[job_id] = str(ev["reason"])
                if kind == "interval" and len(found[job_id]) < points:
                    found[job_id].append(_float(ev.get("throughput_bps")) or 0.0)
            if len(entries) == count and len(found[job_id]) < points:
                before = _before(entries[-1][0])
                if before is not None:
                    cursor[job_id] = before
                    nxt.append(job_id)
        todo = nxt
    if newest:
        return {j: (list(reversed(found[j])), reasons[j], top[j]) for j in job_ids}
    return {j: (list(reversed(found[j])), reasons[j]) for j in job_ids}


def _before(entry_id: str) -> str | None:
    """The largest stream id below ``entry_id`` (an exclusive bound that also works before Redis 6.2)."""
    ms, _, seq = entry_id.partition("-")
    if int(seq or 0) > 0:
        return f"{ms}-{int(seq) - 1}"
    if int(ms) > 0:
        return f"{int(ms) - 1}-18446744073709551615"
    return None


# ---------------------------------------------------------------------------------------------------- one job
def job_detail(store: JobStore, job_id: str, *, after: str = "0-0", story: Collection[str] = (),
               recent: int = 0) -> dict | None:
    """One job's row with what its events tell: ``intervals``, ``tuning``, ``files``; None for an unknown job.

    Reads the events after ``after`` (exclusive; ``events_last_id`` says where to continue). The files
    table holds one row per path, its latest status, in the order the paths first appeared; ``retries``
    counts the file's earlier failed attempts and the retry/log messages that name it. ``done`` is the
    job's terminal state once it ended (the hash is read before the events, so the events read hold its
    ``done`` event then). A sliver (an interval under a tenth of the job's) is folded into the interval
    before it (``model.intervals.fold_slivers``), as every other view shows the timeline. With ``recent``,
    ``recent_events`` holds the newest ``recent`` events of a kind in ``story``, ``(id, event)`` oldest first,
    taken in the same pass (the job view's story: claims, retries, errors, the end).
    """
    job = store.get(job_id)
    if job is None:
        return None
    events = store.all_events(job_id, after=after)
    intervals: list[dict] = []
    tuning: list[dict] = []
    files: dict[str, dict] = {}
    messages: list[str] = []
    done: str | None = None
    reason: str | None = None
    told: deque[tuple[str, dict]] = deque(maxlen=recent)
    for entry_id, ev in events:
        kind = ev.get("kind")
        if kind in story:
            told.append((entry_id, ev))
        if kind == "interval":
            rec = {name: ev.get(name) for name in INTERVAL_FIELDS}
            rec["ts"] = ev.get("ts")
            for name in LIVE_FIELDS:
                if ev.get(name) is not None:
                    rec[name] = ev[name]
            intervals.append(rec)
            reason = ev.get("reason") or reason
        elif kind == "tuning":
            tuning.append({"t": ev.get("t"), "ts": ev.get("ts"), "reason": ev.get("reason"),
                           "layouts": ev.get("layouts") or {}})
            reason = ev.get("reason") or reason
        elif kind == "file" and ev.get("path"):
            _note_file(files, ev)
        elif kind in ("retry", "log", "error") and ev.get("message"):
            messages.append(str(ev["message"]))
        elif kind == "done":
            done = ev.get("state") or done
    _count_retries(files, messages)
    intervals = fold_slivers(intervals)  # the last sliver folded, as the task log, summary, XCom and plot show it
    spark = [_float(r.get("throughput_bps")) or 0.0 for r in intervals[-30:]]
    row = job_row(job, spark=spark)
    if not row["reason"] and reason:
        row["reason"] = reason
    if done is None and job.state in TERMINAL_STATES:
        done = job.state
    out = {**row, "intervals": intervals, "tuning": tuning, "files": list(files.values()),
           "events_last_id": events[-1][0] if events else after, "done": done}
    if recent:
        out["recent_events"] = list(told)
    return out


def _note_file(files: dict[str, dict], ev: dict) -> None:
    path = str(ev["path"])
    old = files.get(path)
    row = {name: ev.get(name) for name in FILE_FIELDS}
    row["resumed"] = ev.get("resumed") or 0
    row["ts"] = ev.get("ts")
    row["retries"] = 0
    if old is not None:  # a later attempt at the same file: its latest status, in the place it first had
        row["retries"] = old["retries"] + (1 if old["status"] == "failed" else 0)
    files[path] = row


_TOKEN_STRIP = "\"'`()[]{}<>,;"


def _count_retries(files: dict[str, dict], messages: list[str]) -> None:
    """Add to each file's ``retries`` the retry/log/error messages that name its path or source."""
    if not files or not messages:
        return
    by_name: dict[str, dict] = {}
    for row in files.values():
        for name in (row.get("path"), row.get("source")):
            if name:
                by_name[str(name)] = row
    for msg in messages:
        named = set()
        for token in msg.split():
            token = token.strip(_TOKEN_STRIP).rstrip(":.")
            row = by_name.get(token)
            if row is not None and id(row) not in named:
                named.add(id(row))
                row["retries"] += 1


def _float(value: Any) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> int | None:
    f = _float(value)
    return int(f) if f is not None else None
