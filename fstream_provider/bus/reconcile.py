"""Reconcile the job bus: find jobs that would otherwise vanish silently, and (``repair``) re-enqueue them.

DESIGN.md "Rules for never losing data": a job is done (verified), failed with a reason, or
resumable — never silently gone. Redis can lose or drop parts of the bus behind FStream's back: the
jobs stream trimmed by hand (``XTRIM MAXLEN 0``), keys deleted, ``FLUSHALL``, a restart without
persistence. ``reconcile`` compares what is left and reports each inconsistency as a ``Finding``:

=========================  ==========================================================  ===============================
kind                       meaning                                                     ``repair``
=========================  ==========================================================  ===============================
``no-stream-entry``        a queued/running job whose stream entry is gone: no agent   re-enqueued (new entry, state
                           will ever take it                                            queued, ``requeued`` event)
``owner-gone``             a running job whose agent's heartbeat expired               nothing while its entry is
                                                                                       pending (agents reclaim it);
                                                                                       re-enqueued if the entry is gone
``no-state``               a stream entry (or index entry) whose job hash is gone:     entry acknowledged, deleted and
                           the spec is lost, the job cannot run again                   copied to the dead-letter stream
``dangling-idempotency``   an idempotency key naming a job that no longer exists:      key deleted (a resubmit makes a
                           a resubmit would re-attach to nothing                        new job)
``changed-after-end``      a queued/running job whose nonce an agent marked ended with  nothing: never re-run (only an
                           its outcome (``bus.audit.mark_ended``): its state was        agent ends a job; issue 40)
                           changed afterwards, not by an agent
``parts-without-state``    (with ``dest_root``) part files at the destination written  nothing (the parts stay; a
                           by a job Redis no longer knows                               resubmit resumes them)
=========================  ==========================================================  ===============================

Only ``JobStore``'s key schema is used (``fstream_provider.bus.keys``); the re-enqueue is one Lua
script that re-checks everything it decided on, so it is safe while agents run.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from fstream_provider.bus.audit import ENDED, ended, job_nonce
from fstream_provider.bus.job_state import TERMINAL_STATES, now_text
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import DEAD_LETTER_MAXLEN

# KEYS: job, events, jobs stream, owner's heartbeat key.  ARGV: job_id, now, maxlen, reason
_REQUEUE = """
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return {'missing'} end
if st == 'succeeded' or st == 'failed' or st == 'cancelled' then return {'terminal'} end
if st == 'running' and redis.call('EXISTS', KEYS[4]) == 1 then return {'owned'} end
local sid = redis.call('HGET', KEYS[1], 'stream_id')
if sid and sid ~= '' and #redis.call('XRANGE', KEYS[3], sid, sid) > 0 then return {'present'} end
local new = redis.call('XADD', KEYS[3], '*', 'job_id', ARGV[1])
redis.call('HSET', KEYS[1], 'state', 'queued', 'worker', '', 'stream_id', new, 'updated_at', ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'kind', 'requeued', 'ts', ARGV[2],
  'data', cjson.encode({reason = ARGV[4], stream_id = new, previous_state = st}))
return {'requeued', new}
"""


# KEYS[1] the nonce; ARGV[1] the new binding, ARGV[2] the ended marker: rebinds a recorded, not ended binding
_REBIND = """
local v = redis.call('GET', KEYS[1])
if v and not string.find(v, ARGV[2], 1, true) then redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL') end
"""


def _rebind_nonce(client: Any, keys: Any, job_id: str, entry_id: str) -> None:
    """A signed job re-enqueued under a new entry is the same job, not a replay: move its nonce's binding
    (``bus.audit.first_use``) to the new entry, if an agent recorded one (``XX``), keeping its expiry."""
    found = job_nonce(client.hget(keys.job(job_id), "auth"))
    if found is not None:  # never over an ended binding (``mark_ended``): that job is not re-run
        client.eval(_REBIND, 1, keys.nonce(*found), f"{job_id} {entry_id}", ENDED)


@dataclass
class Finding:
    """One inconsistency on the bus.

    :param kind: see the module docstring.
    :param job_id: the job concerned.
    :param state: its state, or None when the state is gone.
    :param detail: what was found, in words.
    :param resumable: the job can still run to completion (its spec is known).
    :param entry_id: the jobs-stream entry concerned, if any.
    :param repaired: what ``repair`` did, or None.
    """

    kind: str
    job_id: str
    state: str | None
    detail: str
    resumable: bool
    entry_id: str | None = None
    repaired: str | None = None


@dataclass
class ReconcileReport:
    """What ``reconcile`` saw and found."""

    jobs: int = 0
    live_jobs: int = 0
    stream_entries: int = 0
    pending_entries: int = 0
    agents: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def unresolved(self) -> list[Finding]:
        """Findings that still need someone (not repaired, and not something the agents resolve themselves)."""
        return [f for f in self.findings if f.repaired is None]

    def to_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "findings"},
                "findings": [asdict(f) for f in self.findings]}

    def lines(self) -> list[str]:
        out = [f"{self.jobs} job states ({self.live_jobs} queued/running), {self.stream_entries} stream entries "
               f"({self.pending_entries} pending), live agents: {', '.join(self.agents) or 'none'}"]
        if not self.findings:
            out.append("no orphans: every live job has a stream entry and every entry a job state")
        for f in self.findings:
            state = f.state or "state gone"
            tail = f" -> {f.repaired}" if f.repaired else ""
            out.append(f"{f.kind}: job {f.job_id} ({state}){' entry ' + f.entry_id if f.entry_id else ''}: "
                       f"{f.detail}{' [resumable]' if f.resumable else ''}{tail}")
        return out


def _stream_entries(store: JobStore, page: int = 1000) -> dict[str, list[str]]:
    """job id -> its entry ids in the jobs stream (oldest first)."""
    stream = store.keys.jobs_stream()
    out: dict[str, list[str]] = {}
    start = "-"
    while True:
        batch = store.client.xrange(stream, min=start, max="+", count=page)
        for eid, fields in batch:
            out.setdefault((fields or {}).get("job_id", ""), []).append(eid)
        if len(batch) < page:
            return out
        start = "(" + batch[-1][0]


def _pending(store: JobStore) -> dict[str, dict]:
    """entry id -> XPENDING record (consumer, idle) for the agents group; empty if there is no group."""
    import redis

    out: dict[str, dict] = {}
    try:
        start = "-"
        while True:
            batch = store.client.xpending_range(store.keys.jobs_stream(), store.keys.jobs_group(), min=start,
                                                max="+", count=1000)
            for p in batch:
                out[p["message_id"]] = p
            if len(batch) < 1000:
                return out
            start = "(" + batch[-1]["message_id"]
    except redis.ResponseError:  # no stream or no group
        return out


def _job_hashes(store: JobStore) -> dict[str, dict[str, str]]:
    prefix = store.keys.job("x")[:-1]
    out: dict[str, dict[str, str]] = {}
    for key in store.client.scan_iter(match=prefix.replace("{", "\\{").replace("}", "\\}") + "*", count=1000,
                                      _type="hash"):
        h = store.client.hgetall(key)
        if h and h.get("job_id"):
            out[h["job_id"]] = h
    return out


def destination_parts(dest_root: str) -> dict[str, list[dict[str, Any]]]:
    """job id -> part files under ``dest_root`` (``.NAME.<job>.<attempt>.part``): path, attempt, bytes held.

    The bytes held come from the ``.meta`` sidecar's received ranges (0 if it has none yet).
    """
    out: dict[str, list[dict[str, Any]]] = {}
    for d, _dirs, files in os.walk(dest_root):
        for name in files:
            if not (name.startswith(".") and name.endswith(".part")):
                continue
            parts = name[:-len(".part")].rsplit(".", 2)
            if len(parts) != 3 or not parts[2].isdigit():
                continue
            held = 0
            try:
                with open(os.path.join(d, name + ".meta")) as f:
                    meta = json.load(f)
                held = sum(int(b) - int(a) for a, b in meta.get("ranges", []))
            except (OSError, ValueError, TypeError):
                pass
            out.setdefault(parts[1], []).append({"path": os.path.relpath(os.path.join(d, name), dest_root),
                                                 "attempt": int(parts[2]), "bytes": held})
    return out


def reconcile(store: JobStore, *, repair: bool = False, dest_root: str | None = None,
              now: float | None = None) -> ReconcileReport:
    """Compare job states, the jobs stream, heartbeats and idempotency keys (and part files under
    ``dest_root``); report every job that would vanish silently; with ``repair``, fix what can be fixed.

    :param store: the job store (its key schema / namespace is the one examined).
    :param repair: re-enqueue resumable orphans, dead-letter entries without state, drop dangling
        idempotency keys.
    :param dest_root: a destination root on this host to look for part files of jobs Redis forgot.
    :param now: current UNIX time (tests).
    """
    now = time.time() if now is None else now
    client, keys = store.client, store.keys
    report = ReconcileReport()
    states = _job_hashes(store)
    entries = _stream_entries(store)
    pending = _pending(store)
    report.jobs = len(states)
    report.stream_entries = sum(len(v) for v in entries.values())
    report.pending_entries = len(pending)
    report.agents = sorted(a for a in client.smembers(keys.agents()) if client.exists(keys.agent(a)))
    alive = set(report.agents)
    requeue = client.register_script(_REQUEUE) if repair else None
    if repair:
        store._group_ready = False
        store.ensure_group()

    def do_requeue(f: Finding, worker: str | None) -> None:
        if requeue is None:
            return
        out = requeue(keys=[keys.job(f.job_id), keys.job_events(f.job_id), keys.jobs_stream(),
                            keys.agent(worker or "-")],
                      args=[f.job_id, now_text(), store.events_maxlen, f"reconcile: {f.kind}: {f.detail}"])
        f.repaired = f"re-enqueued as entry {out[1]}" if out[0] == "requeued" else None
        if out[0] == "requeued":
            _rebind_nonce(client, keys, f.job_id, str(out[1]))
        else:
            f.detail += f" (not re-enqueued: {out[0]} now)"

    on_board = set(client.hkeys(keys.sched_tasks()))  # admitted to the agents' scheduler: entry acknowledged
    for job_id, h in sorted(states.items()):
        state = h.get("state", "")
        if state in TERMINAL_STATES:
            continue
        report.live_jobs += 1
        if job_id in on_board:
            continue  # the scheduler's board holds it (its agents requeue a dead agent's task themselves)
        ids = entries.get(job_id, [])
        worker = h.get("worker") or None
        owner_alive = worker in alive if worker else False
        if state == "running" and worker and not owner_alive:
            held = [e for e in ids if e in pending]
            if held:
                p = pending[held[0]]
                report.findings.append(Finding(
                    "owner-gone", job_id, state, f"agent {worker}'s heartbeat is gone; its entry is pending with "
                    f"{p['consumer']} (idle {p['time_since_delivered'] / 1000:.0f} s): a live agent reclaims it "
                    "after its claim idle time" + ("" if alive else "; but no agent is alive now"), True,
                    entry_id=held[0], repaired="left to the agents' reclaim" if alive else None))
                continue
        if not ids:
            if state == "running" and owner_alive:
                report.findings.append(Finding(
                    "no-stream-entry", job_id, state, f"its stream entry is gone but agent {worker} is alive and "
                    "running it: it records the outcome without the entry", True,
                    repaired="left to its live agent"))
                continue
            who = f"; agent {worker}'s heartbeat is gone" if worker else ""
            outcome = ended(client, keys, h.get("auth"))
            if outcome is not None:  # issue 40: its hash was changed after an agent ended it; never run it again
                report.findings.append(Finding(
                    "changed-after-end", job_id, state, f"an agent recorded this job's outcome ({outcome}) and its "
                    f"nonce as ended, but its state reads {state}: changed since by someone other than an agent; "
                    "not re-run (check who wrote it: the Redis ACL log, `ACL LOG`)", False))
                continue
            f = Finding("no-stream-entry", job_id, state, f"{state} job has no entry in {keys.jobs_stream()} "
                        f"(trimmed or lost){who}: no agent would ever take it", True)
            do_requeue(f, worker)
            report.findings.append(f)

    dead_letter = keys.dead_letter()
    for job_id, ids in sorted(entries.items()):
        if job_id in states:
            continue
        for eid in ids:
            f = Finding("no-state", job_id or "?", None, "stream entry whose job state is gone (Redis lost or "
                        "expired it): its spec is lost, it cannot run again", False, entry_id=eid)
            if repair:
                pipe = client.pipeline(transaction=True)
                pipe.xadd(dead_letter, {"job_id": job_id or "?", "stream_id": eid, "deliveries": 0,
                                        "reason": "reconcile: job state missing", "ts": repr(now)},
                          maxlen=DEAD_LETTER_MAXLEN, approximate=True)
                pipe.xack(keys.jobs_stream(), keys.jobs_group(), eid)
                pipe.xdel(keys.jobs_stream(), eid)
                pipe.execute()
                f.repaired = f"acknowledged, deleted, copied to {dead_letter}"
            report.findings.append(f)

    cutoff = now - store.retention_s
    for job_id, created in client.zrangebyscore(keys.job_index(), cutoff, "+inf", withscores=True):
        if job_id in states:
            continue
        if job_id in entries:  # already reported (and, with repair, dead-lettered) through its stream entry
            if repair:
                client.zrem(keys.job_index(), job_id)
            continue
        f = Finding("no-state", job_id, None, f"listed in {keys.job_index()} (created {now - created:.0f} s ago, "
                    "within retention) but its state is gone", False)
        if repair:
            pipe = client.pipeline(transaction=True)
            pipe.xadd(dead_letter, {"job_id": job_id, "stream_id": "", "deliveries": 0,
                                    "reason": "reconcile: job state missing (index entry)", "ts": repr(now)},
                      maxlen=DEAD_LETTER_MAXLEN, approximate=True)
            pipe.zrem(keys.job_index(), job_id)
            pipe.execute()
            f.repaired = f"removed from {keys.job_index()}, copied to {dead_letter}"
        report.findings.append(f)

    idem_prefix = keys.idempotency("x")[:-1]
    for key in client.scan_iter(match=idem_prefix.replace("{", "\\{").replace("}", "\\}") + "*", count=1000):
        job_id = client.get(key)
        if job_id and job_id not in states:
            f = Finding("dangling-idempotency", job_id, None, f"idempotency key {key} names a job whose state is "
                        "gone: a resubmit with this key would re-attach to nothing", False)
            if repair and client.delete(key):
                f.repaired = "key deleted (a resubmit creates a new job)"
            report.findings.append(f)

    if dest_root:
        for job_id, parts in sorted(destination_parts(dest_root).items()):
            if any(job_id == j[:64] for j in states):
                continue
            held = sum(p["bytes"] for p in parts)
            names = ", ".join(p["path"] for p in parts[:5]) + (" ..." if len(parts) > 5 else "")
            report.findings.append(Finding(
                "parts-without-state", job_id, None, f"{len(parts)} part file(s) under {dest_root} holding {held} "
                f"bytes ({names}) from a job Redis no longer knows: resubmitting the transfer resumes them", False))
    return report
