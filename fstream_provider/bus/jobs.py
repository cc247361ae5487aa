"""The job model on Redis: idempotent submit, state, event streams, cancel, wait, and writes fenced by attempt."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis

from fstream_provider.bus.client import MAX_BLOCK_MS
from fstream_provider.bus.keys import DEAD_LETTER_MAXLEN, EVENTS_MAXLEN, JOB_RETENTION_S, Keys
from fstream_provider.model.spec import TransferSpec

TERMINAL_STATES = ("succeeded", "failed", "cancelled")
STATES = ("queued", "running") + TERMINAL_STATES
EVENT_KINDS = ("queued", "claimed", "interval", "tuning", "file", "log", "error", "retry", "cancel",
               "released", "requeued", "done")

# Lua helper shared by the scripts: move the job (KEYS[1]) to a terminal state, emit "done" on
# KEYS[2], expire job + events + idempotency key. result_json is already JSON (or "").
_FINISH_LUA = """
local function finish(state, err, result_json, now, retention, maxlen, idem)
  redis.call('HSET', KEYS[1], 'state', state, 'updated_at', now, 'error', err, 'result', result_json)
  local rj = result_json
  if rj == '' then rj = 'null' end
  local ej = 'null'
  if err ~= '' then ej = cjson.encode(err) end
  local data = '{"state":' .. cjson.encode(state) .. ',"error":' .. ej .. ',"result":' .. rj .. '}'
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'kind', 'done', 'ts', now, 'data', data)
  redis.call('EXPIRE', KEYS[1], retention)
  redis.call('EXPIRE', KEYS[2], retention)
  if idem then redis.call('EXPIRE', idem, retention) end
end
local function terminal(st)
  return st == 'succeeded' or st == 'failed' or st == 'cancelled'
end
"""

# KEYS: job, events, jobs stream, index, [idem]
# ARGV: job_id, spec_json, now, idem_key, maxlen, index_cutoff, queued_data
_SUBMIT = """
if KEYS[5] then
  local existing = redis.call('GET', KEYS[5])
  if existing then return {existing, 0} end
end
redis.call('HSET', KEYS[1], 'job_id', ARGV[1], 'state', 'queued', 'attempt', 0, 'deliveries', 0,
  'spec', ARGV[2], 'created_at', ARGV[3], 'updated_at', ARGV[3],
  'idempotency_key', ARGV[4], 'cancel_requested', 0, 'worker', '', 'error', '', 'result', '')
local sid = redis.call('XADD', KEYS[3], '*', 'job_id', ARGV[1])
redis.call('HSET', KEYS[1], 'stream_id', sid)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'kind', 'queued', 'ts', ARGV[3], 'data', ARGV[7])
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. ARGV[6])
if KEYS[5] then redis.call('SET', KEYS[5], ARGV[1]) end
return {ARGV[1], 1}
"""

# KEYS: job, events, jobs stream, dead letter, [idem]
# ARGV: worker, now, max_deliveries, maxlen, group, entry_id, retention, dead_maxlen
_CLAIM = _FINISH_LUA + """
local idem = KEYS[5]
local st = redis.call('HGET', KEYS[1], 'state')
if not st then
  redis.call('XACK', KEYS[3], ARGV[5], ARGV[6])
  return {'missing'}
end
if terminal(st) then
  redis.call('XACK', KEYS[3], ARGV[5], ARGV[6])
  return {'terminal', st}
end
local d = redis.call('HINCRBY', KEYS[1], 'deliveries', 1)
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then
  local reason = redis.call('HGET', KEYS[1], 'cancel_reason') or 'cancelled'
  finish('cancelled', reason, '', ARGV[2], ARGV[7], ARGV[4], idem)
  redis.call('XACK', KEYS[3], ARGV[5], ARGV[6])
  return {'cancelled', reason}
end
local maxd = tonumber(ARGV[3])
if d > maxd then
  local last = redis.call('HGET', KEYS[1], 'worker') or ''
  local msg = 'dead-lettered: job delivered ' .. d .. ' times (max_deliveries ' .. maxd ..
    ') without finishing; last worker ' .. (last ~= '' and last or 'unknown')
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[8], '*', 'job_id', redis.call('HGET', KEYS[1], 'job_id'),
    'stream_id', ARGV[6], 'deliveries', d, 'reason', msg, 'ts', ARGV[2])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'kind', 'error', 'ts', ARGV[2],
    'data', cjson.encode({message = msg, retryable = false}))
  finish('failed', msg, '', ARGV[2], ARGV[7], ARGV[4], idem)
  redis.call('XACK', KEYS[3], ARGV[5], ARGV[6])
  return {'dead', msg}
end
local a = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
redis.call('HSET', KEYS[1], 'state', 'running', 'worker', ARGV[1], 'updated_at', ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'kind', 'claimed', 'ts', ARGV[2],
  'data', cjson.encode({worker = ARGV[1], attempt = a, deliveries = d}))
return {'claimed', tostring(a), redis.call('HGET', KEYS[1], 'spec')}
"""

_FENCE = """
local function fenced(attempt)
  return redis.call('HGET', KEYS[1], 'attempt') == attempt and redis.call('HGET', KEYS[1], 'state') == 'running'
end
"""

# KEYS: job, events.  ARGV: attempt, maxlen, now, nfields, f1, v1, ..., then (kind, ts, data) triples
_PUBLISH = _FENCE + """
if not fenced(ARGV[1]) then return {0, 0} end
local n = tonumber(ARGV[4])
local i = 5
if n > 0 then
  local hs = {}
  for j = 0, 2 * n - 1 do hs[#hs + 1] = ARGV[i + j] end
  redis.call('HSET', KEYS[1], unpack(hs))
  i = i + 2 * n
end
redis.call('HSET', KEYS[1], 'updated_at', ARGV[3])
while i + 2 <= #ARGV do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'kind', ARGV[i], 'ts', ARGV[i + 1], 'data', ARGV[i + 2])
  i = i + 3
end
return {1, tonumber(redis.call('HGET', KEYS[1], 'cancel_requested') or '0')}
"""

# KEYS: job, jobs stream.  ARGV: attempt, group, consumer, entry_id
_TOUCH = _FENCE + """
if not fenced(ARGV[1]) then return {0, 0} end
redis.call('XCLAIM', KEYS[2], ARGV[2], ARGV[3], 0, ARGV[4], 'JUSTID')
return {1, tonumber(redis.call('HGET', KEYS[1], 'cancel_requested') or '0')}
"""

# KEYS: job, events, jobs stream, [idem]
# ARGV: attempt, state, error, result_json, now, group, entry_id, retention, maxlen
_FINISH = _FINISH_LUA + _FENCE + """
if not fenced(ARGV[1]) then return 0 end
finish(ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[8], ARGV[9], KEYS[4])
redis.call('XACK', KEYS[3], ARGV[6], ARGV[7])
return 1
"""

# KEYS: job, events.  ARGV: attempt, reason, now, maxlen
_RELEASE = _FENCE + """
if not fenced(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'state', 'queued', 'worker', '', 'updated_at', ARGV[3])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'kind', 'released', 'ts', ARGV[3],
  'data', cjson.encode({reason = ARGV[2], attempt = tonumber(ARGV[1])}))
return 1
"""

# KEYS: job, events, [idem].  ARGV: reason, now, retention, maxlen
_CANCEL = _FINISH_LUA + """
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 'missing' end
if terminal(st) then return 'terminal' end
redis.call('HSET', KEYS[1], 'cancel_requested', 1, 'cancel_reason', ARGV[1])
if st == 'queued' then
  finish('cancelled', ARGV[1], '', ARGV[2], ARGV[3], ARGV[4], KEYS[3])
  return 'cancelled'
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'kind', 'cancel', 'ts', ARGV[2],
  'data', cjson.encode({reason = ARGV[1]}))
return 'requested'
"""


class JobLostError(LookupError):
    """A job's state vanished from Redis while someone waited for it (Redis flushed, or restarted without
    its data): the wait ends at once with this reason instead of waiting for ever. ``fstream reconcile``
    reports what is left of it (stream entries without state, destination part files)."""

    def __init__(self, job_id: str, detail: str = "") -> None:
        self.job_id = job_id
        msg = (f"job {job_id}: its state vanished from Redis while waiting for it"
               f"{' (' + detail + ')' if detail else ''}; Redis was flushed or restarted without its data "
               "(not a normal expiry: a running job has no TTL); run `fstream reconcile` to see orphans, "
               "resubmit to finish it (files already committed are skipped)")
        super().__init__(msg)

    def __str__(self) -> str:
        return str(self.args[0])


def _now() -> str:
    return repr(time.time())


def _num(value: str | None, kind: type = float, default: Any = 0) -> Any:
    if value in (None, ""):
        return default
    try:
        return kind(value)
    except ValueError:
        return default


@dataclass
class JobState:
    """A job as stored in its Redis hash.

    :param job_id: the job id (16 hex digits).
    :param state: queued, running, succeeded, failed or cancelled.
    :param attempt: the fencing number: incremented on every claim by a worker.
    :param spec: the transfer specification.
    :param worker: the agent that holds (or last held) the job.
    :param created_at: UNIX time of submission.
    :param updated_at: UNIX time of the last write.
    :param error: the failure or cancellation reason, naming the file/peer and the cause.
    :param result: the transfer result (``TransferResult.to_dict()``) once finished.
    :param idempotency_key: the key given at submission, if any.
    :param deliveries: how many times an agent took the job off the stream.
    :param cancel_requested: a cancel was asked for (the running worker stops).
    :param progress: the latest interval record, while running.
    """

    job_id: str
    state: str
    attempt: int
    spec: TransferSpec
    worker: str | None
    created_at: float
    updated_at: float
    error: str | None
    result: dict | None
    idempotency_key: str | None
    deliveries: int
    cancel_requested: bool = False
    progress: dict | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @classmethod
    def from_hash(cls, h: dict[str, str]) -> "JobState":
        def js(name: str) -> Any:
            raw = h.get(name)
            return json.loads(raw) if raw else None

        return cls(
            job_id=h["job_id"],
            state=h.get("state", "queued"),
            attempt=_num(h.get("attempt"), int),
            spec=TransferSpec.from_json(h["spec"]),
            worker=h.get("worker") or None,
            created_at=_num(h.get("created_at")),
            updated_at=_num(h.get("updated_at")),
            error=h.get("error") or None,
            result=js("result"),
            idempotency_key=h.get("idempotency_key") or None,
            deliveries=_num(h.get("deliveries"), int),
            cancel_requested=h.get("cancel_requested") == "1",
            progress=js("progress"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "state": self.state, "attempt": self.attempt, "spec": self.spec.to_dict(),
            "worker": self.worker, "created_at": self.created_at, "updated_at": self.updated_at,
            "error": self.error, "result": self.result, "idempotency_key": self.idempotency_key,
            "deliveries": self.deliveries,
            "cancel_requested": self.cancel_requested, "progress": self.progress,
        }


@dataclass
class Claim:
    """What a worker learns when it takes a stream entry.

    :param outcome: ``claimed`` (run it), ``terminal``/``missing`` (acked, nothing to do),
        ``cancelled`` (cancel was requested before it ran; acked), ``dead`` (dead-lettered; acked).
    :param attempt: the fencing number to pass to every later write (``claimed`` only).
    :param spec: the transfer spec (``claimed`` only).
    :param message: reason for the other outcomes.
    """

    outcome: str
    attempt: int = 0
    spec: TransferSpec | None = None
    message: str = ""


def decode_event(entry_id: str, fields: dict[str, str]) -> tuple[str, dict]:
    """``(id, {"kind", "ts", **data})`` from a raw event-stream entry."""
    data: dict[str, Any] = {}
    raw = fields.get("data")
    if raw:
        try:
            loaded = json.loads(raw)
        except ValueError:
            loaded = {"raw": raw}
        data = loaded if isinstance(loaded, dict) else {"value": loaded}
    return entry_id, {**data, "kind": fields.get("kind", ""), "ts": _num(fields.get("ts"))}


class JobStore:
    """Jobs on Redis: the client side (submit, get, events, cancel, wait, list) and the worker side.

    Every state change is one Lua script, atomic with the event it emits. Worker-side writes
    (``publish``, ``touch``, ``finish``, ``release``) carry the attempt number the claim returned
    and do nothing when the job's current attempt differs: a stale worker (whose job another
    agent reclaimed) can neither write state nor ``XACK``. Keys: ``fstream_provider.bus.keys``
    and ``docs/redis-keys.md``.

    :param client: a ``redis.Redis`` with ``decode_responses=True`` (``fstream_provider.bus.client.connect``).
    :param keys: the key schema (default namespace ``fstream``).
    :param retention_s: how long a finished job's hash, events and idempotency key are kept.
    :param events_maxlen: approximate cap of each job's event stream.
    """

    def __init__(self, client: redis.Redis, *, keys: Keys | None = None, retention_s: int = JOB_RETENTION_S,
                 events_maxlen: int = EVENTS_MAXLEN) -> None:
        self.client = client
        self.keys = keys or Keys()
        self.retention_s = int(retention_s)
        self.events_maxlen = int(events_maxlen)
        self._group_ready = False
        self._submit = client.register_script(_SUBMIT)
        self._claim = client.register_script(_CLAIM)
        self._publish = client.register_script(_PUBLISH)
        self._touch = client.register_script(_TOUCH)
        self._finish = client.register_script(_FINISH)
        self._release = client.register_script(_RELEASE)
        self._cancel = client.register_script(_CANCEL)

    # ------------------------------------------------------------------ client side
    def ensure_group(self) -> None:
        """Create the ``agents`` consumer group (from the stream's start) if it does not exist."""
        if self._group_ready:
            return
        try:
            self.client.xgroup_create(self.keys.jobs_stream(), self.keys.jobs_group(), id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def submit(self, spec: TransferSpec, *, idempotency_key: str | None = None) -> tuple[str, bool]:
        """Queue a job; returns ``(job_id, created)``. The same idempotency key returns the same job (created False)."""
        self.ensure_group()
        job_id = uuid.uuid4().hex[:16]
        now = time.time()
        k = self.keys
        keys = [k.job(job_id), k.job_events(job_id), k.jobs_stream(), k.job_index()]
        if idempotency_key:
            keys.append(k.idempotency(idempotency_key))
        queued = json.dumps({"label": spec.label, "idempotency_key": idempotency_key})
        out = self._submit(keys=keys, args=[job_id, spec.to_json(), repr(now), idempotency_key or "",
                                            self.events_maxlen, repr(now - self.retention_s), queued])
        return str(out[0]), bool(int(out[1]))

    def get(self, job_id: str) -> JobState | None:
        """The job's state, or None if unknown (or expired)."""
        h = self.client.hgetall(self.keys.job(job_id))
        if not h or "job_id" not in h:
            return None
        return JobState.from_hash(h)

    def events(self, job_id: str, after: str = "0-0", block_ms: int | None = None,
               count: int = 100) -> list[tuple[str, dict]]:
        """Events after ``after`` (exclusive), oldest first; waits up to ``block_ms`` (capped at 5 s) for new ones."""
        kwargs: dict[str, Any] = {"count": count}
        if block_ms is not None:
            kwargs["block"] = max(1, min(int(block_ms), MAX_BLOCK_MS))
        resp = self.client.xread({self.keys.job_events(job_id): after}, **kwargs)
        out: list[tuple[str, dict]] = []
        for _stream, entries in resp or []:
            for entry_id, fields in entries:
                out.append(decode_event(entry_id, fields))
        return out

    def append_event(self, job_id: str, kind: str, data: dict) -> str:
        """Append an event (unfenced: for clients and tools; workers use ``publish``)."""
        return self.client.xadd(self.keys.job_events(job_id),
                                {"kind": kind, "ts": _now(), "data": json.dumps(data, default=str)},
                                maxlen=self.events_maxlen, approximate=True)

    def cancel(self, job_id: str, reason: str = "cancelled by user") -> bool:
        """Request cancellation: a queued job is cancelled at once, a running one when its worker sees the flag.

        Returns False if the job is unknown or already finished.
        """
        idem = self.client.hget(self.keys.job(job_id), "idempotency_key")
        keys = _cancel_keys(self.keys, job_id, idem)
        out = self._cancel(keys=keys, args=[reason, _now(), self.retention_s, self.events_maxlen])
        if out == "requested":
            self.client.publish(self.keys.cancel_channel(job_id), "cancel")
        return out in ("cancelled", "requested")

    def wait(self, job_id: str, timeout: float) -> JobState:
        """Follow the job's events until its ``done`` event; returns its state (non-terminal if ``timeout`` passed).

        Raises ``KeyError`` if the job does not exist, ``JobLostError`` if its state vanishes while waiting
        (Redis flushed or restarted without persistence): never waits for ever on a job nobody can finish.
        """
        deadline = time.monotonic() + timeout
        state = self.get(job_id)
        if state is None:
            raise KeyError(f"job {job_id}: not found (unknown id, or expired after its retention)")
        last = "0-0"
        while not state.terminal:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return state
            evs = self.events(job_id, after=last, block_ms=max(1, int(min(remaining, 1.0) * 1000)))
            if evs:
                last = evs[-1][0]
            if not evs or any(e["kind"] == "done" for _, e in evs):
                now = self.get(job_id)
                if now is None:
                    raise JobLostError(job_id, f"last seen {state.state}, attempt {state.attempt}")
                state = now
        return state

    def list(self, limit: int = 50) -> list[JobState]:
        """The newest ``limit`` jobs, newest first."""
        ids = self.client.zrevrange(self.keys.job_index(), 0, max(0, limit - 1))
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.keys.job(job_id))
        out = []
        for h in pipe.execute():
            if h and "job_id" in h:
                out.append(JobState.from_hash(h))
        return out

    def dead_letters(self, count: int = 100) -> list[tuple[str, dict]]:
        """The newest dead-letter entries, newest first."""
        return list(self.client.xrevrange(self.keys.dead_letter(), count=count))

    # ------------------------------------------------------------------ worker side (fenced by attempt)
    def _idem_key(self, job_id: str) -> list[str]:
        idem = self.client.hget(self.keys.job(job_id), "idempotency_key")
        return [self.keys.idempotency(idem)] if idem else []

    def claim(self, job_id: str, entry_id: str, *, worker: str, max_deliveries: int) -> Claim:
        """Take a job a worker read (or reclaimed) from the stream: counts the delivery, increments the attempt.

        Acks by itself when there is nothing to run (finished, unknown, cancelled, dead-lettered).
        """
        k = self.keys
        keys = [k.job(job_id), k.job_events(job_id), k.jobs_stream(), k.dead_letter()] + self._idem_key(job_id)
        out = self._claim(keys=keys, args=[worker, _now(), int(max_deliveries), self.events_maxlen,
                                           k.jobs_group(), entry_id, self.retention_s, DEAD_LETTER_MAXLEN])
        outcome = str(out[0])
        if outcome == "claimed":
            return Claim("claimed", attempt=int(out[1]), spec=TransferSpec.from_json(out[2]))
        return Claim(outcome, message=str(out[1]) if len(out) > 1 else "")

    def publish(self, job_id: str, attempt: int, events: list[tuple[str, float, dict]],
                fields: dict[str, str] | None = None) -> tuple[bool, bool]:
        """Append events ``(kind, ts, data)`` and set hash ``fields`` if ``attempt`` is still current.

        Returns ``(still_owner, cancel_requested)``.
        """
        args: list[Any] = [attempt, self.events_maxlen, _now(), len(fields or {})]
        for name, value in (fields or {}).items():
            args += [name, value]
        for kind, ts, data in events:
            args += [kind, repr(float(ts)), json.dumps(data, default=str)]
        out = self._publish(keys=[self.keys.job(job_id), self.keys.job_events(job_id)], args=args)
        return bool(int(out[0])), bool(int(out[1]))

    def touch(self, job_id: str, attempt: int, entry_id: str, consumer: str) -> tuple[bool, bool]:
        """Reset the idle time of the job's pending entry (so it is not reclaimed) if ``attempt`` is current.

        Returns ``(still_owner, cancel_requested)``.
        """
        k = self.keys
        out = self._touch(keys=[k.job(job_id), k.jobs_stream()], args=[attempt, k.jobs_group(), consumer, entry_id])
        return bool(int(out[0])), bool(int(out[1]))

    def finish(self, job_id: str, attempt: int, entry_id: str, *, state: str, error: str | None = None,
               result: dict | None = None) -> bool:
        """Record a terminal state, emit ``done`` and ``XACK`` the entry, atomically, if ``attempt`` is current."""
        if state not in TERMINAL_STATES:
            raise ValueError(f"finish job {job_id}: state {state!r} is not terminal ({', '.join(TERMINAL_STATES)})")
        k = self.keys
        keys = [k.job(job_id), k.job_events(job_id), k.jobs_stream()] + self._idem_key(job_id)
        out = self._finish(keys=keys, args=[attempt, state, error or "",
                                            json.dumps(result, default=str) if result is not None else "",
                                            _now(), k.jobs_group(), entry_id, self.retention_s, self.events_maxlen])
        return bool(int(out))

    def release(self, job_id: str, attempt: int, reason: str) -> bool:
        """Give a running job back (agent stopping): state queued, entry left pending for another agent."""
        k = self.keys
        out = self._release(keys=[k.job(job_id), k.job_events(job_id)], args=[attempt, reason, _now(),
                                                                              self.events_maxlen])
        return bool(int(out))

    def trim_acked(self) -> int:
        """Trim the jobs stream below its oldest pending or undelivered entry (never an unacknowledged one).

        Returns how many entries were removed.
        """
        stream = self.keys.jobs_stream()
        try:
            groups = self.client.xinfo_groups(stream)
        except redis.ResponseError:
            return 0
        if not groups:
            return 0  # no group: nothing is known to be delivered
        bound: tuple[int, int] | None = None
        for g in groups:
            pending = self.client.xpending(stream, g["name"])
            if pending.get("pending"):
                ms, seq = pending["min"].split("-")
                b = (int(ms), int(seq))
            else:
                ms, seq = str(g["last-delivered-id"]).split("-")
                b = (int(ms), int(seq) + 1)
            bound = b if bound is None or b < bound else bound
        if bound is None or bound <= (0, 1):
            return 0
        return int(self.client.xtrim(stream, minid=f"{bound[0]}-{bound[1]}", approximate=False))


def _cancel_keys(keys: Keys, job_id: str, idempotency_key: str | None) -> list[str]:
    out = [keys.job(job_id), keys.job_events(job_id)]
    if idempotency_key:
        out.append(keys.idempotency(idempotency_key))
    return out


async def acancel(client: Any, job_id: str, reason: str = "cancelled by user", *, keys: Keys | None = None,
                  retention_s: int = JOB_RETENTION_S, events_maxlen: int = EVENTS_MAXLEN) -> bool:
    """``JobStore.cancel`` on a ``redis.asyncio`` client (triggers and async hooks); same script, same result."""
    keys = keys or Keys()
    idem = await client.hget(keys.job(job_id), "idempotency_key")
    redis_keys = _cancel_keys(keys, job_id, idem)
    out = await client.register_script(_CANCEL)(keys=redis_keys, args=[reason, _now(), retention_s, events_maxlen])
    if out == "requested":
        await client.publish(keys.cancel_channel(job_id), "cancel")
    return out in ("cancelled", "requested")
