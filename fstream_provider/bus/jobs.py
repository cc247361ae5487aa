"""``JobStore``: jobs on Redis — idempotent submit, get, events, cancel, wait, list; the worker side fenced by attempt."""

from __future__ import annotations

import collections
import json
import time
import uuid
from typing import Any

import redis

from fstream_provider.bus import job_scripts as lua
from fstream_provider.bus.client import MAX_BLOCK_MS, WriteInDoubt, run_replicated
from fstream_provider.bus.follow import follow_job
from fstream_provider.bus.job_state import TERMINAL_STATES, Claim, JobState, decode_event, now_text
from fstream_provider.bus.keys import DEAD_LETTER_MAXLEN, EVENTS_MAXLEN, JOB_RETENTION_S, Keys
from fstream_provider.authz.outcome import OutcomeSigner, TrustedAgents, trusted_view
from fstream_provider.authz.signing import Signer
from fstream_provider.model.spec import TransferSpec
from fstream_provider.model.validation import SpecError

# a finished job's sums the hash keeps beside its result (``finish``): what a row of it shows
RESULT_TOTALS = ("bytes", "files", "seconds", "throughput_bps", "verified_files", "skipped_files", "failed_files")
# how long the agent's job writes stay in doubt while too few replicas acknowledge them (``JobStore._replicated``):
# longer than a sentinel takes to demote a master it failed over (seconds), shorter than a replica being gone
IN_DOUBT_S = 30.0


class JobStore:
    """Jobs on Redis: the client side (submit, get, events, cancel, wait, list) and the worker side.

    Every state change is one Lua script, atomic with the event it emits. Worker-side writes
    (``publish``, ``touch``, ``finish``, ``release``) carry the attempt number the claim returned
    and do nothing when the job's current attempt differs: a stale worker (whose job another
    agent reclaimed) can neither write state nor ``XACK``. The scripts: ``fstream_provider.bus.job_scripts``;
    keys: ``fstream_provider.bus.keys`` and ``docs/redis-keys.md``.

    :param client: a ``redis.Redis`` with ``decode_responses=True`` (``fstream_provider.bus.client.connect``).
    :param keys: the key schema (default namespace ``fstream``).
    :param retention_s: how long a finished job's hash, events and idempotency key are kept (seconds, at least 1):
        the scripts that write a terminal state set it as their TTL, and ``submit`` drops index entries older
        than it (``fstream agent/submit/cancel --job-retention``; default 7 days).
    :param events_maxlen: approximate cap of each job's event stream.
    :param signer: the submitter whose key signs every job this store submits (``authz.signing``); agents
        refuse jobs no configured submitter signed. None: jobs are submitted unsigned (agents refuse them).
    :param outcome_signer: the agent's key (``authz.outcome.OutcomeSigner``): ``finish`` and ``reject`` sign the
        outcome they write (issue 40). None: written unsigned (clients do not believe such a success).
    :param in_doubt_s: with ``?wait_replicas=N``, how long the worker's event and outcome writes that fewer than N
        replicas acknowledged are sent again (``WriteInDoubt``) before they are taken as they stand.
    :param trust: the agents a client believes (``authz.outcome.TrustedAgents``): ``get`` (so ``wait`` and
        ``follow_job``) shows a success no trusted agent signed as ``unverified``. None: as stored (agents' reads).
    """

    def __init__(self, client: redis.Redis, *, keys: Keys | None = None, retention_s: int = JOB_RETENTION_S,
                 events_maxlen: int = EVENTS_MAXLEN, signer: Signer | None = None,
                 outcome_signer: OutcomeSigner | None = None, trust: TrustedAgents | None = None,
                 in_doubt_s: float = IN_DOUBT_S) -> None:
        self.client = client
        self.in_doubt_s = float(in_doubt_s)
        self._short_since: float | None = None  # when the writes' replicas first fell short (None: they keep up)
        self.signer = signer
        self.outcome_signer = outcome_signer
        self.trust = trust
        self.keys = keys or Keys()
        self.retention_s = check_retention(retention_s)
        self.events_maxlen = int(events_maxlen)
        self._group_ready = False
        self._owner_listed = False
        # writes waited for by the client's replicas (``?wait_replicas=N``): acknowledged by N, or fewer in time
        self.replication: collections.Counter[str] = collections.Counter()
        self._submit = client.register_script(lua.SUBMIT)
        self._claim = client.register_script(lua.CLAIM)
        self._publish = client.register_script(lua.PUBLISH)
        self._touch = client.register_script(lua.TOUCH)
        self._finish = client.register_script(lua.FINISH)
        self._release = client.register_script(lua.RELEASE)
        self._cancel = client.register_script(lua.CANCEL)
        self._preempt = client.register_script(lua.PREEMPT)
        self._reject = client.register_script(lua.REJECT)

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
        owner = self.signer.submitter if self.signer is not None else None
        hex_id = uuid.uuid4().hex[:16]
        job_id = Keys.owned(owner, hex_id) if owner else hex_id  # <submitter>:<hex>; bare for an unsigned job
        idempotency_key = self.scoped_idempotency(idempotency_key)
        now = time.time()
        k = self.keys
        # the submitter's own index (its ACL user may write no other); agents add the job to the facility's at claim.
        # An unsigned job (no owner; agents refuse it) goes to the facility's index, as before issue 40
        keys = [k.job(job_id), k.job_events(job_id), k.jobs_stream(), k.job_index_of(owner) if owner else k.job_index()]
        if idempotency_key:
            keys.append(k.idempotency(idempotency_key))
        spec_json = spec.to_json()
        auth = self.signer.sign(k.namespace, job_id, spec_json, now=now) if self.signer is not None else None
        queued = json.dumps({"label": spec.label, "idempotency_key": idempotency_key,
                             "submitter": auth.submitter if auth else None})
        if owner and not self._owner_listed:
            self._list_owner(owner)
        out = self._replicated(self._submit, keys, [job_id, spec_json, repr(now), idempotency_key or "",
                                                    self.events_maxlen, repr(now - self.retention_s), queued,
                                                    auth.to_json() if auth else "", self.retention_s if owner else ""])
        return str(out[0]), bool(int(out[1]))

    def _list_owner(self, owner: str) -> None:
        """Name this submitter in ``Keys.job_owners`` (once per store), so viewers list its jobs before an agent
        claims them. A submitter's ACL user may not write it (issue 40): the agents serving it do, with each
        heartbeat."""
        try:
            self.client.sadd(self.keys.job_owners(), owner)
        except redis.exceptions.NoPermissionError:
            pass
        self._owner_listed = True

    def scoped_idempotency(self, idempotency_key: str | None) -> str | None:
        """The idempotency key as stored: ``<submitter>:<key>`` for a signing store (issue 40: a key no other
        submitter's user can write, so nobody can point another's next run at a job of theirs), else as given."""
        if not idempotency_key or self.signer is None:
            return idempotency_key or None
        return Keys.owned(self.signer.submitter, idempotency_key)

    def get(self, job_id: str) -> JobState | None:
        """The job's state, or None if unknown (or expired)."""
        h = self.client.hgetall(self.keys.job(job_id))
        if not h or "job_id" not in h:
            return None
        return trusted_view(JobState.from_hash(h), self.keys.namespace, self.trust)

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

    def all_events(self, job_id: str, *, after: str = "0-0", page: int = 1000) -> list[tuple[str, dict]]:
        """Every event of a job from ``after`` on, oldest first (pages through the stream; a short page is the
        last, so a job with fewer than ``page`` events costs one read)."""
        out: list[tuple[str, dict]] = []
        while True:
            batch = self.events(job_id, after=after, count=page)
            out.extend(batch)
            if len(batch) < page:
                return out
            after = batch[-1][0]

    def append_event(self, job_id: str, kind: str, data: dict) -> str:
        """Append an event (unfenced: for clients and tools; workers use ``publish``)."""
        return self.client.xadd(self.keys.job_events(job_id),
                                {"kind": kind, "ts": now_text(), "data": json.dumps(data, default=str)},
                                maxlen=self.events_maxlen, approximate=True)

    def cancel(self, job_id: str, reason: str = "cancelled by user") -> bool:
        """Request cancellation: a queued job is cancelled at once, a running one when its worker sees the flag.

        Returns False if the job is unknown or already finished.
        """
        idem = self.client.hget(self.keys.job(job_id), "idempotency_key")
        keys = _cancel_keys(self.keys, job_id, idem)
        out = self._cancel(keys=keys, args=[reason, now_text(), self.retention_s, self.events_maxlen])
        if out == "requested":
            self.client.publish(self.keys.cancel_channel(job_id), "cancel")
        return out in ("cancelled", "requested")

    def wait(self, job_id: str, timeout: float) -> JobState:
        """Follow the job's events until its ``done`` event; returns its state (non-terminal if ``timeout`` passed).

        Raises ``KeyError`` (``JobNotFoundError``) if the job does not exist, ``JobLostError`` if its state
        vanishes while waiting (Redis flushed or restarted without persistence): never waits for ever on a
        job nobody can finish. ``fstream_provider.bus.follow.follow_job`` is the loop.
        """
        return follow_job(self, job_id, timeout=timeout)

    def list(self, limit: int = 50) -> list[JobState]:
        """The newest ``limit`` jobs, newest first, as far as this store's Redis user may read them (issue 40): the
        facility's index (jobs agents claimed) and the own index (jobs from their submission on) of every submitter
        the agents serve (``Keys.job_owners``) for an agent's or a viewer's user; a submitter's user reads only its
        own index."""
        owner = self.signer.submitter if self.signer is not None else None
        ids = recent_job_ids(self.client, self.keys, owner=owner, limit=limit)
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
        """The newest dead-letter entries, newest first; none for a submitter's Redis user, which may not read them
        (they name every tenant's jobs, issue 40)."""
        try:
            return list(self.client.xrevrange(self.keys.dead_letter(), count=count))
        except redis.exceptions.NoPermissionError:
            return []

    def dead_letter_count(self) -> int | None:
        """How many entries the dead-letter stream holds; None when this Redis user may not read it."""
        try:
            return int(self.client.xlen(self.keys.dead_letter()))
        except redis.exceptions.NoPermissionError:
            return None

    def _replicated(self, script: Any, keys: list[str], args: list[Any], *, again: bool = False) -> Any:
        """A job write that must survive a failover: with ``?wait_replicas=N`` it waits for the replicas
        (``bus.client.run_replicated``; a connection lost meanwhile raises, so the caller's retry makes sure).

        ``again``: a write that is safe to run twice (numbered events, a fenced outcome) and that fewer than N
        replicas acknowledged raises ``WriteInDoubt`` for the caller to send again, until they acknowledge one
        or for ``in_doubt_s`` since they first fell short; then it stands as written, with the risk. A master the
        sentinel failed over while it still answered (on a loaded host, a PING late) takes writes no replica
        gets and drops them when it is made a replica: sent again, they land on the new master. Other writes
        (submit, claim) stand as written."""
        out, acked = run_replicated(self.client, script, keys, args)
        if acked is None:
            return out
        wanted = self.client.fstream_wait[0]
        if acked >= wanted:
            self._short_since = None
            self.replication["acknowledged"] += 1
            return out
        now = time.monotonic()
        if self._short_since is None:
            self._short_since = now
        if again and now - self._short_since < self.in_doubt_s:
            self.replication["in_doubt"] += 1
            raise WriteInDoubt(f"{acked} of {wanted} replica(s) acknowledged the write to {keys[0]!r}: in doubt, "
                               f"sent again until a replica acknowledges it (up to {self.in_doubt_s:.0f} s)")
        self.replication["short"] += 1
        return out

    # ------------------------------------------------------------------ worker side (fenced by attempt)
    def _idem_key(self, job_id: str) -> list[str]:
        idem = self.client.hget(self.keys.job(job_id), "idempotency_key")
        return [self.keys.idempotency(idem)] if idem else []

    def claim(self, job_id: str, entry_id: str, *, worker: str, max_deliveries: int) -> Claim:
        """Take a job a worker read (or reclaimed) from the stream: counts the delivery, increments the attempt.

        Acks by itself when there is nothing to run (finished, unknown, cancelled, dead-lettered).
        """
        k = self.keys
        keys = [k.job(job_id), k.job_events(job_id), k.jobs_stream(), k.dead_letter(),
                k.job_index()] + self._idem_key(job_id)
        out = self._replicated(self._claim, keys, [worker, now_text(), int(max_deliveries), self.events_maxlen,
                                                   k.jobs_group(), entry_id, self.retention_s, DEAD_LETTER_MAXLEN,
                                                   repr(time.time() - self.retention_s)])
        outcome = str(out[0])
        if outcome == "claimed":
            spec_json, auth = str(out[2]), str(out[3]) if len(out) > 3 else ""
            try:
                spec = TransferSpec.from_json(spec_json)
            except (SpecError, ValueError, TypeError) as exc:  # written by something else than JobStore.submit
                return Claim("claimed", attempt=int(out[1]), spec_json=spec_json, auth=auth,
                             message=f"the job's spec is not a valid transfer spec: {exc}")
            return Claim("claimed", attempt=int(out[1]), spec=spec, spec_json=spec_json, auth=auth)
        return Claim(outcome, message=str(out[1]) if len(out) > 1 else "")

    def reject(self, job_id: str, attempt: int, entry_id: str, reason: str) -> bool:
        """Refuse a claimed job before anything of it is read (the agent's policy): dead-letter it with
        ``reason``, mark it failed, acknowledge its entry; atomically, if ``attempt`` is current."""
        k = self.keys
        keys = [k.job(job_id), k.job_events(job_id), k.jobs_stream(), k.dead_letter()] + self._idem_key(job_id)
        sig = self._sign_outcome(job_id, attempt, "failed", reason, "")
        out = self._reject(keys=keys, args=[attempt, reason, now_text(), k.jobs_group(), entry_id, self.retention_s,
                                            self.events_maxlen, DEAD_LETTER_MAXLEN, sig])
        return bool(int(out))

    def _sign_outcome(self, job_id: str, attempt: int, state: str, error: str, result_json: str) -> str:
        """The ``outcome_sig`` the terminal write stores (``authz.outcome``): over the fields as they will be stored
        and the submitter's signature envelope as stored; "" without a signing key."""
        if self.outcome_signer is None:
            return ""
        auth = self.client.hget(self.keys.job(job_id), "auth") or ""
        return self.outcome_signer.sign(self.keys.namespace, job_id, attempt, state, error, result_json, auth)

    def publish(self, job_id: str, attempt: int, events: list[tuple[str, float, dict]],
                fields: dict[str, str] | None = None, *, first: int = 0) -> tuple[bool, bool]:
        """Append events ``(kind, ts, data)`` and set hash ``fields`` if ``attempt`` is still current.

        ``first``: the number of ``events[0]`` among the attempt's events (1, 2, ...; 0: unnumbered). Numbered
        events the job already holds are not appended again, so a batch in doubt (``WriteInDoubt``) is sent
        again whole. Returns ``(still_owner, cancel_requested)``.
        """
        if first < 0:
            raise ValueError(f"publish job {job_id}: first event number {first} is negative")
        args: list[Any] = [attempt, self.events_maxlen, now_text(), int(first), len(fields or {})]
        for name, value in (fields or {}).items():
            args += [name, value]
        for kind, ts, data in events:
            args += [kind, repr(float(ts)), json.dumps(data, default=str)]
        out = self._replicated(self._publish, [self.keys.job(job_id), self.keys.job_events(job_id)], args,
                               again=first > 0)
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
        """Record a terminal state, emit ``done`` and ``XACK`` the entry, atomically, if ``attempt`` is current.

        The hash keeps ``result`` and, beside it, its ``totals`` (``RESULT_TOTALS``: bytes, files, seconds, the
        average rate): the overview reads those, not a result that holds every interval record.
        """
        if state not in TERMINAL_STATES:
            raise ValueError(f"finish job {job_id}: state {state!r} is not terminal ({', '.join(TERMINAL_STATES)})")
        k = self.keys
        keys = [k.job(job_id), k.job_events(job_id), k.jobs_stream()] + self._idem_key(job_id)
        totals = {name: result[name] for name in RESULT_TOTALS if name in result} if isinstance(result, dict) else {}
        result_json = json.dumps(result, default=str) if result is not None else ""
        sig = self._sign_outcome(job_id, attempt, state, error or "", result_json)
        out = self._replicated(self._finish, keys, [attempt, state, error or "", result_json,
                                                    now_text(), k.jobs_group(), entry_id, self.retention_s,
                                                    self.events_maxlen, json.dumps(totals) if totals else "", sig],
                               again=True)  # run twice, the second finds the job finished and returns 0
        return bool(int(out))

    def release(self, job_id: str, attempt: int, reason: str) -> bool:
        """Give a running job back (agent stopping): state queued, entry left pending for another agent."""
        k = self.keys
        out = self._release(keys=[k.job(job_id), k.job_events(job_id)], args=[attempt, reason, now_text(),
                                                                              self.events_maxlen])
        return bool(int(out))

    def preempt(self, job_id: str, attempt: int, reason: str, data: dict | None = None) -> bool:
        """Record that the running job stopped at its checkpoint for a job the scheduler ranks higher: state
        ``preempted`` with ``reason`` and a ``preempted`` event (``data``: who preempted it, committed bytes),
        if ``attempt`` is current. Its delivery is given back: preemptions never dead-letter a job."""
        k = self.keys
        payload = json.dumps({"reason": reason, "attempt": attempt, **(data or {})}, default=str)
        out = self._preempt(keys=[k.job(job_id), k.job_events(job_id)], args=[attempt, reason, now_text(),
                                                                               self.events_maxlen, payload])
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


def recent_job_ids(client: Any, keys: Keys, *, owner: str | None = None, limit: int = 50) -> list[str]:
    """The ids of the newest ``limit`` jobs the client's Redis user may list, newest first (``JobStore.list``): the
    facility's index, the own index of every submitter the agents serve (``Keys.job_owners``) and ``owner``'s own;
    whatever the user may not read (a submitter's user: all but its own, issue 40) is left out."""
    n = max(1, int(limit))
    indexes = [keys.job_index()] + ([keys.job_index_of(owner)] if owner else [])
    try:
        indexes += [keys.job_index_of(o) for o in sorted(client.smembers(keys.job_owners()))]
    except redis.exceptions.NoPermissionError:
        pass  # a submitter's user
    pipe = client.pipeline(transaction=False)  # one round trip whatever the number of submitters
    for index in dict.fromkeys(indexes):
        pipe.zrevrange(index, 0, n - 1, withscores=True)
    scored: dict[str, float] = {}
    for got in pipe.execute(raise_on_error=False):
        if isinstance(got, redis.exceptions.NoPermissionError):
            continue  # the facility's index, for a submitter's user
        if isinstance(got, Exception):
            raise got
        for job_id, score in got:
            scored[job_id] = max(score, scored.get(job_id, score))
    return sorted(scored, key=lambda j: scored[j], reverse=True)[:n]


def check_retention(retention_s: float, what: str = "job retention") -> int:
    """``retention_s`` as the whole seconds the scripts ``EXPIRE`` with; ``ValueError`` naming ``what`` unless >= 1 s
    (a finished job must be readable for a while: 0 or less would delete it as it finishes)."""
    try:
        seconds = int(float(retention_s))
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{what} {retention_s!r}: not a number of seconds") from None
    if seconds < 1:
        raise ValueError(f"{what} {retention_s!r}: must be at least 1 s (how long a finished job's state, events "
                         "and idempotency key are kept; default 7 days)")
    return seconds


def _cancel_keys(keys: Keys, job_id: str, idempotency_key: str | None) -> list[str]:
    out = [keys.job(job_id), keys.job_events(job_id)]
    if idempotency_key:
        out.append(keys.idempotency(idempotency_key))
    return out


async def acancel(client: Any, job_id: str, reason: str = "cancelled by user", *, keys: Keys | None = None,
                  retention_s: int = JOB_RETENTION_S, events_maxlen: int = EVENTS_MAXLEN) -> bool:
    """``JobStore.cancel`` on a ``redis.asyncio`` client (triggers and async hooks); same script, same result."""
    keys = keys or Keys()
    retention_s = check_retention(retention_s)
    idem = await client.hget(keys.job(job_id), "idempotency_key")
    redis_keys = _cancel_keys(keys, job_id, idem)
    out = await client.register_script(lua.CANCEL)(keys=redis_keys,
                                                   args=[reason, now_text(), retention_s, events_maxlen])
    if out == "requested":
        await client.publish(keys.cancel_channel(job_id), "cancel")
    return out in ("cancelled", "requested")
