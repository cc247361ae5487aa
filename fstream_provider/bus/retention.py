"""Retention of the bus: what finished jobs leave behind, what each key family costs, reclaiming it (``fstream gc``).

A finished job normally leaves nothing for ever: the script that writes its terminal state sets the TTL of its
hash, its events and its idempotency key (``JobStore(retention_s=...)``, ``--job-retention``), and ``submit``
drops index entries older than the retention. What is left anyway, and what ``survey`` finds:

======================  ==================================================================  ==========================
kind                    what                                                                ``reclaim``
======================  ==================================================================  ==========================
``no_ttl``              a terminal job's hash, events or idempotency key without a TTL       TTL = ``updated_at`` +
                        (written by an older version, a crash between writes, an event       retention - now; deleted
                        appended after the end)                                              if that is already past
``index_orphans``       ``jobs:index`` entries whose job hash is gone                       ``ZREM``
``event_orphans``       event streams whose job hash is gone (an unfenced append after      ``DEL``
                        the job expired creates a stream without a TTL)
``idempotency_orphans`` idempotency keys naming a job that is gone (a resubmit with the      ``DEL`` if it still names
                        key would re-attach to nothing)                                      that job
``board_orphans``       ``sched:tasks`` / ``sched:progress`` fields of jobs that ended or    ``HDEL``
                        are gone (an agent's removal lost to a Redis blip)
``old_pending``         new-files batches claimed longer ago than a bound, never            only with
                        acknowledged                                                         ``drop_pending``
======================  ==================================================================  ==========================

Reported only: seen-set sizes per scope (``fstream seen reset`` resets a scope: a set has no age per member),
pending batches per scope, the length and age of the history, audit, dead-letter and jobs streams, the jobs by
state, and ``MEMORY USAGE`` per key family (sampled beyond ``sample`` keys a family).

Bounded on any keyspace: ``SCAN``/``ZSCAN``/``HSCAN`` with ``COUNT``, never ``KEYS`` or a whole-hash read, pipelines
of at most ``BATCH`` commands, the findings kept and nothing else. Works on a Redis Cluster: ``scan_iter`` visits
every primary, and each command (each script) touches one key. Reclaiming re-checks what it acts on where the
state could have changed since the survey (a key that got a TTL, an idempotency key or pending batch rewritten);
"terminal" and "gone" never change back (job ids are random).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable
from urllib.parse import unquote

from fstream_provider.bus.job_state import TERMINAL_STATES
from fstream_provider.bus.keys import JOB_RETENTION_S, Keys

BATCH = 500  # commands per pipeline
SCAN_COUNT = 1000  # the COUNT hint of each SCAN / HSCAN / ZSCAN call
SAMPLE = 200  # keys per family measured with MEMORY USAGE (the rest extrapolated)
PENDING_OLDER_THAN_S = 7 * 24 * 3600
KINDS = ("no_ttl", "index_orphans", "event_orphans", "idempotency_orphans", "board_orphans", "old_pending")

_V = "Q9VARQ9"  # a key component no literal part of a key contains (made of characters _part keeps)

# KEYS[1]: a finished job's hash, events or idempotency key.  ARGV: seconds, kind (job|events|idem), job id.
# Only a key still without a TTL (and still terminal / still naming the job); seconds <= 0: deleted.
_EXPIRE = """
if redis.call('TTL', KEYS[1]) ~= -1 then return 0 end
if ARGV[2] == 'job' then
  local st = redis.call('HGET', KEYS[1], 'state')
  if st ~= 'succeeded' and st ~= 'failed' and st ~= 'cancelled' then return 0 end
elseif ARGV[2] == 'idem' then
  if redis.call('GET', KEYS[1]) ~= ARGV[3] then return 0 end
end
local s = tonumber(ARGV[1])
if s <= 0 then redis.call('DEL', KEYS[1]) return 2 end
redis.call('EXPIRE', KEYS[1], s)
return 1
"""
# KEYS[1]: a string (ARGV[1] = its value) or a hash (ARGV[1] = field, ARGV[2] = the SHA-1 of its value): deleted
# if unchanged
_DEL_IF = """
if #ARGV == 1 then
  if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
  return 0
end
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v and redis.sha1hex(v) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
"""


def _templates(keys: Keys) -> list[tuple[str, str]]:
    """``(family, key)`` of every key ``Keys`` builds, each variable part spelled ``_V``."""
    return [("job", keys.job(_V)), ("job_events", keys.job_events(_V)), ("jobs_stream", keys.jobs_stream()),
            ("job_index", keys.job_index()), ("owner_index", keys.job_index_of(_V)), ("job_owners", keys.job_owners()),
            ("dead_letter", keys.dead_letter()),
            ("idempotency", keys.idempotency(_V)), ("audit", keys.audit()), ("nonce", keys.nonce(_V, _V)),
            ("agent", keys.agent(_V)), ("agents", keys.agents()), ("history", keys.history()),
            ("calibration", keys.calibration(_V)), ("profiling", keys.profiling(_V, _V)),
            ("pool", keys.pool(_V, _V)), ("sched_tasks", keys.sched_tasks()),
            ("sched_progress", keys.sched_progress()), ("sched_config", keys.sched_config()),
            ("sched_version", keys.sched_version()), ("sched_turn", keys.sched_turn()),
            ("seen", keys.seen(_V)), ("pending", keys.pending(_V)), ("looks", keys.looks(_V))]


def families(keys: Keys) -> list[tuple[str, re.Pattern]]:
    """``(family, pattern)`` of every key ``Keys`` builds, its variable parts as groups (escaped: no ``:``).

    Read off ``Keys`` itself, so a key moved to another hash tag or renamed there is still classified."""
    return [(name, re.compile(re.escape(text).replace(_V, "([^:]+)"))) for name, text in _templates(keys)]


def scan_pattern(keys: Keys) -> str:
    """The one ``SCAN MATCH`` glob that covers every family: their common literal prefix, glob-escaped."""
    common = os.path.commonprefix([text.split(_V)[0] for _, text in _templates(keys)])
    return re.sub(r"([*?\[\]\\])", r"\\\1", common) + "*"


def classify(key: str, fams: list[tuple[str, re.Pattern]]) -> tuple[str, tuple[str, ...]] | None:
    """``(family, its variable parts unescaped)`` of a key, or None for a key of no family (another namespace)."""
    for name, pattern in fams:
        m = pattern.fullmatch(key)
        if m:
            return name, tuple(unquote(g) for g in m.groups())
    return None


@dataclass
class Report:
    """What ``survey`` found (see the module docstring for each kind).

    :param namespace: the keys' namespace.
    :param now: the survey's clock (UNIX seconds).
    :param retention_s: the retention the TTLs of ``no_ttl`` were computed with.
    :param no_ttl: ``{"job_id", "ttl", "keys": [[key, kind], ...]}`` per terminal job with a key lacking a TTL.
    :param index_orphans: job ids.
    :param event_orphans: event stream keys.
    :param idempotency_orphans: ``[key, job id]``.
    :param board_orphans: ``[board key, job id]``.
    :param old_pending: ``[pending key, batch id, SHA-1 of its JSON, age s]``.
    :param jobs: job hashes by state (``queued``, ``running``, ..., ``unknown``) and ``with_ttl``.
    :param seen: seen-set size per scope.
    :param pending: ``{"batches", "older"}`` per scope.
    :param streams: ``{"key", "length", "oldest_age_s"}`` of the jobs, dead-letter, audit and history streams.
    :param memory: per family ``{"keys", "sampled", "bytes", "estimated"}``.
    :param used_memory: ``INFO memory`` ``used_memory`` (None where INFO is not allowed).
    :param scanned: keys of the namespace the scan returned.
    """

    namespace: str
    now: float
    retention_s: int
    no_ttl: list[dict] = field(default_factory=list)
    index_orphans: list[str] = field(default_factory=list)
    event_orphans: list[str] = field(default_factory=list)
    idempotency_orphans: list[list[str]] = field(default_factory=list)
    board_orphans: list[list[str]] = field(default_factory=list)
    old_pending: list[list[Any]] = field(default_factory=list)
    jobs: dict[str, int] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)
    pending: dict[str, dict[str, int]] = field(default_factory=dict)
    streams: dict[str, dict] = field(default_factory=dict)
    memory: dict[str, dict] = field(default_factory=dict)
    used_memory: int | None = None
    scanned: int = 0

    def counts(self) -> dict[str, int]:
        return {k: len(getattr(self, k)) for k in KINDS}

    def reclaimable(self, drop_pending: bool = False) -> int:
        """How many findings ``reclaim`` would act on."""
        return sum(n for k, n in self.counts().items() if k != "old_pending" or drop_pending)

    def to_dict(self, examples: int = 20) -> dict[str, Any]:
        """The JSON of ``fstream gc --json``: each kind's count and its first ``examples`` findings."""
        return {
            "namespace": self.namespace, "now": self.now, "retention_s": self.retention_s,
            "reclaimable": {k: {"count": len(getattr(self, k)), "examples": getattr(self, k)[:examples]}
                            for k in KINDS},
            "jobs": self.jobs, "seen": self.seen, "pending": self.pending, "streams": self.streams,
            "memory": {"families": self.memory, "total_bytes": sum(m["bytes"] for m in self.memory.values()),
                       "used_memory": self.used_memory},
            "scanned_keys": self.scanned,
        }


def _batched(client: Any, items: Iterable[Any], add: Callable[[Any, Any], None]) -> Iterable[tuple[Any, Any]]:
    """``(item, reply)`` for each item, ``add(pipe, item)`` queuing exactly one command each, ``BATCH`` a pipeline."""
    chunk: list[Any] = []

    def run() -> list[tuple[Any, Any]]:
        pipe = client.pipeline(transaction=False)
        for it in chunk:
            add(pipe, it)
        return list(zip(chunk, pipe.execute(raise_on_error=False)))

    for item in items:
        chunk.append(item)
        if len(chunk) >= BATCH:
            yield from run()
            chunk = []
    if chunk:
        yield from run()


def _ok(reply: Any) -> Any:
    """A pipeline reply, or None where the command failed (e.g. a key of another type under a family's name)."""
    return None if isinstance(reply, Exception) else reply


def _eval(pipe: Any, script: str, key: str, *args: Any) -> None:
    """Queue a one-key script (``EVAL``: a Cluster pipeline routes it by its key; it has no ``eval`` method)."""
    pipe.execute_command("EVAL", script, 1, key, *args)


def _chunks(items: Iterable[Any], n: int = BATCH) -> Iterable[list[Any]]:
    chunk: list[Any] = []
    for it in items:
        chunk.append(it)
        if len(chunk) >= n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def survey(client: Any, keys: Keys | None = None, *, now: float | None = None,
           retention_s: float = JOB_RETENTION_S, pending_older_than_s: float = PENDING_OLDER_THAN_S,
           sample: int = SAMPLE) -> Report:
    """Look at every key of the namespace once (SCAN) and report what ``reclaim`` would do and what each family costs.

    :param now: the clock the TTLs and ages are computed with (default: now).
    :param retention_s: the job retention (``--job-retention``) the missing TTLs are computed with.
    :param pending_older_than_s: a pending batch claimed longer ago than this is ``old_pending``.
    :param sample: keys per family measured with ``MEMORY USAGE`` (more are extrapolated from them).
    """
    keys = keys or Keys()
    now = time.time() if now is None else float(now)
    report = Report(keys.namespace, now, int(retention_s))
    fams = families(keys)
    measured: dict[str, list[str]] = {}
    count: dict[str, int] = {}
    singles: dict[str, str] = {}
    job_ids: list[str] = []
    events: list[str] = []
    idem: list[str] = []
    seen: list[tuple[str, str]] = []
    pending: list[tuple[str, str]] = []
    for key in client.scan_iter(match=scan_pattern(keys), count=SCAN_COUNT):
        got = classify(key, fams)
        if got is None and not key.startswith(keys.prefix):
            continue  # another namespace the glob also matches ({fstream* matches {fstream2}:...)
        report.scanned += 1
        name, parts = got if got is not None else ("other", ())  # other: a key of ours no Keys method builds
        count[name] = count.get(name, 0) + 1
        if len(measured.setdefault(name, [])) < sample:
            measured[name].append(key)
        if name == "job":
            job_ids.append(parts[0])
        elif name == "job_events":
            events.append(parts[0])
        elif name == "idempotency":
            idem.append(key)
        elif name == "seen":
            seen.append((parts[0], key))
        elif name == "pending":
            pending.append((parts[0], key))
        elif not parts:
            singles[name] = key
        if len(job_ids) >= BATCH:
            _jobs(client, keys, job_ids, report)
            job_ids = []
        if len(events) >= BATCH:
            _events(client, keys, events, report)
            events = []
        if len(idem) >= BATCH:
            _idempotency(client, keys, idem, report)
            idem = []
    _jobs(client, keys, job_ids, report)
    _events(client, keys, events, report)
    _idempotency(client, keys, idem, report)
    if "job_index" in singles:
        _index(client, keys, report)
    for name in ("sched_tasks", "sched_progress"):
        if name in singles:
            _board(client, keys, singles[name], report)
    for (scope, _), n in _batched(client, seen, lambda p, t: p.scard(t[1])):
        report.seen[scope] = int(_ok(n) or 0)
    for scope, key in pending:
        _pending(client, key, scope, pending_older_than_s, report)
    for name in ("jobs_stream", "dead_letter", "audit", "history"):
        if name in singles:
            report.streams[name] = _stream(client, singles[name], now)
    _memory(client, measured, count, report)
    return report


def _jobs(client: Any, keys: Keys, job_ids: list[str], report: Report) -> None:
    """Count the jobs by state; a terminal one with a key lacking a TTL is ``no_ttl``."""
    if not job_ids:
        return
    pipe = client.pipeline(transaction=False)
    for j in job_ids:
        pipe.hmget(keys.job(j), ["state", "updated_at", "idempotency_key"])
        pipe.ttl(keys.job(j))
        pipe.ttl(keys.job_events(j))
    replies = pipe.execute(raise_on_error=False)
    idem_of: dict[str, tuple[str, str]] = {}
    found: dict[str, dict] = {}
    for i, j in enumerate(job_ids):
        fields, ttl, ev_ttl = (_ok(r) for r in replies[3 * i:3 * i + 3])
        state, updated, idem_key = fields if fields else (None, None, None)
        if ttl == -2:  # expired since the scan saw it
            continue
        report.jobs[state or "unknown"] = report.jobs.get(state or "unknown", 0) + 1
        if ttl is not None and ttl >= 0:
            report.jobs["with_ttl"] = report.jobs.get("with_ttl", 0) + 1
        if state not in TERMINAL_STATES:
            continue
        try:
            ends = float(updated) + report.retention_s
        except (TypeError, ValueError):
            ends = report.now + report.retention_s  # no time of its end: a full retention from now
        entry = {"job_id": j, "ttl": int(ends - report.now), "keys": []}
        if ttl == -1:
            entry["keys"].append([keys.job(j), "job"])
        if ev_ttl == -1:
            entry["keys"].append([keys.job_events(j), "events"])
        found[j] = entry
        if idem_key:
            idem_of[j] = (keys.idempotency(idem_key), idem_key)
    if idem_of:
        pipe = client.pipeline(transaction=False)
        for j, (k, _) in idem_of.items():
            pipe.ttl(k)
            pipe.get(k)
        replies = pipe.execute(raise_on_error=False)
        for i, (j, (k, _)) in enumerate(idem_of.items()):
            if _ok(replies[2 * i]) == -1 and _ok(replies[2 * i + 1]) == j:
                found[j]["keys"].append([k, "idem"])
    report.no_ttl.extend(e for e in found.values() if e["keys"])


def _exists(client: Any, keys: Keys, job_ids: Iterable[str]) -> dict[str, bool]:
    return {j: bool(_ok(r)) for j, r in _batched(client, job_ids, lambda p, j: p.exists(keys.job(j)))}


def _events(client: Any, keys: Keys, job_ids: list[str], report: Report) -> None:
    for j, alive in _exists(client, keys, job_ids).items():
        if not alive:
            report.event_orphans.append(keys.job_events(j))


def _idempotency(client: Any, keys: Keys, idem: list[str], report: Report) -> None:
    for chunk in _chunks(idem):
        named = [(k, _ok(v)) for k, v in _batched(client, chunk, lambda p, k: p.get(k))]
        alive = _exists(client, keys, [j for _, j in named if j])
        report.idempotency_orphans.extend([k, j] for k, j in named if j and not alive.get(j, True))


def _index(client: Any, keys: Keys, report: Report) -> None:
    ids = (j for j, _ in client.zscan_iter(keys.job_index(), count=SCAN_COUNT))
    for chunk in _chunks(ids):
        report.index_orphans.extend(j for j, alive in _exists(client, keys, chunk).items() if not alive)


def _board(client: Any, keys: Keys, board: str, report: Report) -> None:
    ids = (j for j, _ in client.hscan_iter(board, count=SCAN_COUNT))
    for chunk in _chunks(ids):
        for j, state in _batched(client, chunk, lambda p, j: p.hget(keys.job(j), "state")):
            state = _ok(state)
            if state is None or state in TERMINAL_STATES:
                report.board_orphans.append([board, j])


def _pending(client: Any, key: str, scope: str, older_than_s: float, report: Report) -> None:
    batches = older = 0
    for batch_id, raw in client.hscan_iter(key, count=SCAN_COUNT):
        batches += 1
        try:
            age = report.now - float(json.loads(raw)["claimed_at"])
        except (ValueError, KeyError, TypeError):
            continue
        if age > older_than_s:
            older += 1
            report.old_pending.append([key, batch_id, hashlib.sha1(raw.encode()).hexdigest(), round(age, 1)])
    report.pending[scope] = {"batches": batches, "older": older}


def _stream(client: Any, key: str, now: float) -> dict[str, Any]:
    length = _ok(client.xlen(key)) or 0
    first = client.xrange(key, count=1) if length else []
    age = now - int(first[0][0].split("-")[0]) / 1000 if first else None
    return {"key": key, "length": int(length), "oldest_age_s": round(age, 1) if age is not None else None}


def _memory(client: Any, measured: dict[str, list[str]], count: dict[str, int], report: Report) -> None:
    for name, sampled in sorted(measured.items()):
        size = sum(int(_ok(r) or 0) for _, r in _batched(client, sampled, lambda p, k: p.memory_usage(k)))
        n = count[name]
        report.memory[name] = {"keys": n, "sampled": len(sampled), "bytes": int(size * n / len(sampled)),
                               "estimated": n > len(sampled)}
    try:
        info = client.info("memory")
    except Exception:  # noqa: BLE001 - INFO is an administrative command the FStream ACL roles do not have
        return
    if "used_memory" in info:
        report.used_memory = int(info["used_memory"])
    else:  # a cluster: one dict per node
        report.used_memory = sum(int(v.get("used_memory", 0)) for v in info.values() if isinstance(v, dict))


def reclaim(client: Any, keys: Keys | None, report: Report, *, drop_pending: bool = False) -> dict[str, int]:
    """Act on ``report``'s findings (see the module docstring); returns how many of each were reclaimed.

    ``no_ttl`` gives ``ttl_set`` and ``expired`` (already past its retention: deleted, and its index entry with it,
    counted in ``index_orphans``); a finding that changed since the survey (a TTL set meanwhile, a key rewritten)
    is left alone and not counted.
    """
    keys = keys or Keys()
    done = {"ttl_set": 0, "expired": 0, "index_orphans": 0, "event_orphans": 0, "idempotency_orphans": 0,
            "board_orphans": 0, "old_pending": 0}
    todo = [(k, kind, e["job_id"], e["ttl"]) for e in report.no_ttl for k, kind in e["keys"]]
    deleted: list[str] = []  # jobs past their retention: their index entries go too
    for t, r in _batched(client, todo, lambda p, t: _eval(p, _EXPIRE, t[0], t[3], t[1], t[2])):
        r = _ok(r)
        done["ttl_set"] += r == 1
        done["expired"] += r == 2
        if r == 2 and t[1] == "job":
            deleted.append(t[2])
    for chunk in _chunks([*report.index_orphans, *deleted]):
        done["index_orphans"] += int(client.zrem(keys.job_index(), *chunk))
    for _, r in _batched(client, report.event_orphans, lambda p, k: p.delete(k)):
        done["event_orphans"] += int(_ok(r) or 0)
    for _, r in _batched(client, report.idempotency_orphans, lambda p, t: _eval(p, _DEL_IF, t[0], t[1])):
        done["idempotency_orphans"] += int(_ok(r) or 0)
    board_removed = []
    for t, r in _batched(client, report.board_orphans, lambda p, t: p.hdel(t[0], t[1])):
        done["board_orphans"] += int(_ok(r) or 0)
        if _ok(r):
            board_removed.append(t)
    if board_removed:  # the agents' board views learn of it at their next cycle, not at their next resync
        from fstream_provider.bus.sched_view import bump

        pipe = client.pipeline(transaction=False)
        for hkey, kind in ((keys.sched_tasks(), "t"), (keys.sched_progress(), "p")):
            for chunk in _chunks([f for h, f in board_removed if h == hkey]):
                bump(pipe, keys, kind, chunk)
        pipe.execute()
    if drop_pending:
        for _, r in _batched(client, report.old_pending, lambda p, t: _eval(p, _DEL_IF, t[0], t[1], t[2])):
            done["old_pending"] += int(_ok(r) or 0)
    return done
