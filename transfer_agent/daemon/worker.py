"""The ``fstream agent`` daemon: takes jobs from the Redis stream, runs them, fences, reclaims, dead-letters."""

from __future__ import annotations

import collections
import json
import logging
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from fstream_provider.bus.client import connect, describe
from fstream_provider.bus.jobs import Claim, JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.model.spec import TransferSpec
from transfer_agent.errors import FStreamError

log = logging.getLogger(__name__)

PUBLISH_BATCH = 500


def default_agent_name() -> str:
    """``<host>-<pid>``: unique per process, so a restarted agent's leftovers are reclaimed by heartbeat."""
    return f"{socket.gethostname()}-{os.getpid()}"


def backoff_delay(retry: int, *, base: float, cap: float, rng: random.Random) -> float:
    """Exponential backoff with jitter: ``min(cap, base * 2**retry)`` scaled by a random factor in [0.5, 1]."""
    return min(cap, base * (2 ** retry)) * rng.uniform(0.5, 1.0)


def is_retryable(exc: BaseException) -> bool:
    """The retry predicate: FStream errors say so themselves; plain OS/network errors are retryable."""
    if isinstance(exc, FStreamError):
        return bool(exc.retryable)
    return isinstance(exc, (OSError, TimeoutError))


class _Prefixed(logging.LoggerAdapter):
    def process(self, msg: str, kwargs: Any) -> tuple[str, Any]:
        return f"[agent {self.extra['name']}] {msg}", kwargs


class _JobRun:
    """One claimed job while it runs: fencing token, cancel event, buffered events.

    :param job_id: the job.
    :param attempt: the fencing number from the claim.
    :param entry_id: the jobs-stream entry to acknowledge.
    """

    def __init__(self, job_id: str, attempt: int, entry_id: str) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.entry_id = entry_id
        self.cancel = threading.Event()
        self.lost = False  # another agent took the job over: write nothing more
        self.cancel_requested = False
        self.stopping = False
        self._lock = threading.Lock()
        self._events: list[tuple[str, float, dict]] = []
        self._progress: dict | None = None
        self.wake = threading.Event()

    def add(self, kind: str, data: dict) -> None:
        with self._lock:
            self._events.append((kind, time.time(), data))
            if kind == "interval":
                self._progress = data
            if len(self._events) >= PUBLISH_BATCH:
                self.wake.set()

    def take(self) -> tuple[list[tuple[str, float, dict]], dict | None]:
        with self._lock:
            events, self._events = self._events[:PUBLISH_BATCH], self._events[PUBLISH_BATCH:]
            progress, self._progress = self._progress, None
            return events, progress

    def pending(self) -> bool:
        with self._lock:
            return bool(self._events) or self._progress is not None


class Agent:
    """A transfer agent that consumes FStream jobs from Redis.

    Shape of Rucio's daemons: ``run(once=False)`` / ``stop()``, waits on ``threading.Event``,
    SIGTERM sets the stop event, a heartbeat key with a TTL, exceptions counted and logged with
    context while the loop continues. Data safety (DESIGN.md): a job's stream entry is
    acknowledged only after its transfer returned with every file committed, or after a
    terminal state was recorded; the attempt number from the claim fences every write.

    :param redis_url: where the bus is (``fstream_provider.bus.embedded.resolve_redis_url`` resolves defaults).
    :param name: consumer name in the ``agents`` group and heartbeat key (default ``<host>-<pid>``).
    :param secret_file: shared secret used for jobs whose spec names none.
    :param heartbeat_ttl: seconds the heartbeat key lives; refreshed every third of it.
    :param claim_idle_ms: a pending job idle this long whose agent's heartbeat is gone is reclaimed.
    :param orphan_idle_ms: a pending job idle this long is reclaimed whatever the heartbeats say
        (``XAUTOCLAIM``; live agents touch their job's entry, so only orphans get this idle).
    :param max_deliveries: a job taken this many times without finishing is dead-lettered next time.
    :param max_retries: in-process retries of retryable failures per claim.
    :param retry_base_s: first backoff delay.
    :param retry_cap_s: backoff cap.
    :param block_ms: how long one read of the stream blocks (also bounds stop latency).
    :param poll_interval: seconds between checks of the job's cancel flag and fence.
    :param flush_interval: seconds between batched event writes.
    :param trim_interval: seconds between trims of acknowledged stream entries.
    :param redis_outage_s: how long a finished job's last writes are retried while Redis is unreachable.
    :param keys: the key schema (namespace).
    :param transfer_factory: builds the transfer; default ``transfer_agent.sending.sender.Transfer``.
    :param rng: randomness for backoff jitter.
    """

    def __init__(self, redis_url: str, *, name: str | None = None, secret_file: str | None = None,
                 heartbeat_ttl: float = 10, claim_idle_ms: int = 30000, orphan_idle_ms: int | None = None,
                 max_deliveries: int = 5, max_retries: int = 3, retry_base_s: float = 1.0,
                 retry_cap_s: float = 60.0, block_ms: int = 1000, poll_interval: float = 1.0,
                 flush_interval: float = 0.2, trim_interval: float = 60.0, redis_outage_s: float = 600.0,
                 keys: Keys | None = None,
                 transfer_factory: Callable[..., Any] | None = None, rng: random.Random | None = None) -> None:
        self.redis_url = redis_url
        self.name = name or default_agent_name()
        self.secret_file = secret_file
        self.heartbeat_ttl = heartbeat_ttl
        self.claim_idle_ms = int(claim_idle_ms)
        self.orphan_idle_ms = int(orphan_idle_ms if orphan_idle_ms is not None else 10 * claim_idle_ms)
        self.max_deliveries = int(max_deliveries)
        self.max_retries = int(max_retries)
        self.retry_base_s = retry_base_s
        self.retry_cap_s = retry_cap_s
        self.block_ms = int(block_ms)
        self.poll_interval = poll_interval
        self.flush_interval = flush_interval
        self.trim_interval = trim_interval
        self.redis_outage_s = redis_outage_s
        self.keys = keys or Keys()
        self.transfer_factory = transfer_factory
        self.rng = rng or random.Random()
        self.counters: collections.Counter[str] = collections.Counter()
        self.log = _Prefixed(log, {"name": self.name})
        self._stop = threading.Event()
        self._current: _JobRun | None = None
        self._client: redis.Redis | None = None
        self._store: JobStore | None = None
        self._autoclaim_cursor = "0-0"
        self._last_trim = 0.0
        self._started_at = 0.0

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        """Ask the agent to stop: the loop exits, a running transfer is cancelled and its job released."""
        self._stop.set()
        run = self._current
        if run is not None:
            run.stopping = True
            run.cancel.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run(self, once: bool = False) -> None:
        """Consume jobs until ``stop()`` (or SIGTERM); with ``once``, one iteration that re-raises errors."""
        if self.transfer_factory is None:
            from transfer_agent.sending.sender import Transfer

            self.transfer_factory = Transfer
        self._client = connect(self.redis_url)
        self._store = JobStore(self._client, keys=self.keys)
        self._started_at = time.time()
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, lambda *_: self.stop())
        hb_stop = threading.Event()
        heartbeat = threading.Thread(target=self._heartbeat_loop, args=(hb_stop,), name=f"heartbeat-{self.name}",
                                     daemon=True)
        try:
            heartbeat.start()  # beats at once, then every period; Redis being down is retried there and below
            self.log.info("consuming %s on %s", self.keys.jobs_stream(), describe(self.redis_url))
            failures = 0
            while not self._stop.is_set():
                try:
                    self._iteration()
                    failures = 0
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as exc:
                    self.counters["redis_unreachable"] += 1
                    failures += 1
                    if once:
                        raise
                    delay = backoff_delay(failures, base=0.2, cap=5.0, rng=self.rng)
                    self.log.warning("Redis unreachable (%s); reconnecting in %.1f s", exc, delay)
                    self._stop.wait(delay)
                except Exception:
                    self.counters["exceptions"] += 1
                    failures += 1
                    self.log.exception("iteration failed (%d in a row, %d in total); continuing",
                                       failures, self.counters["exceptions"])
                    if once:
                        raise
                    self._stop.wait(backoff_delay(failures, base=0.5, cap=30.0, rng=self.rng))
                if once:
                    break
        finally:
            hb_stop.set()
            if heartbeat.is_alive():
                heartbeat.join()
            try:
                self._client.delete(self.keys.agent(self.name))
                self._client.srem(self.keys.agents(), self.name)
            except redis.RedisError as exc:
                self.log.warning("could not remove heartbeat key on exit: %s", exc)
            self._client.close()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            self.log.info("stopped: %s", dict(self.counters))

    # ------------------------------------------------------------------ heartbeat
    def _beat(self) -> None:
        run = self._current
        fields = {"name": self.name, "host": socket.gethostname(), "pid": os.getpid(),
                  "started_at": repr(self._started_at), "seen": repr(time.time()),
                  "job_id": run.job_id if run else "", "attempt": run.attempt if run else 0}
        pipe = self._client.pipeline(transaction=True)
        pipe.hset(self.keys.agent(self.name), mapping=fields)
        pipe.pexpire(self.keys.agent(self.name), int(self.heartbeat_ttl * 1000))
        pipe.sadd(self.keys.agents(), self.name)
        pipe.execute()

    def _heartbeat_loop(self, hb_stop: threading.Event) -> None:
        period = min(self.heartbeat_ttl / 3.0, self.poll_interval)
        while True:
            try:
                self._beat()
                run = self._current
                if run is not None and not run.lost:
                    owner, cancel = self._store.touch(run.job_id, run.attempt, run.entry_id, self.name)
                    self._note_fence(run, owner, cancel)
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as exc:
                self.counters["heartbeat_errors"] += 1
                self.log.warning("heartbeat: Redis unreachable (%s); retrying in %.1f s", exc, period)
            except Exception:
                self.counters["heartbeat_errors"] += 1
                self.log.exception("heartbeat failed; retrying in %.1f s", period)
            if hb_stop.wait(period):
                return

    def _note_fence(self, run: _JobRun, owner: bool, cancel: bool) -> None:
        if not owner and not run.lost:
            run.lost = True
            run.cancel.set()
            if not self._client.exists(self.keys.job(run.job_id)):
                # not superseded: the state is gone (Redis flushed, or restarted without its data)
                self.counters["vanished"] += 1
                self.log.error("job %s attempt %d: its state vanished from Redis (flushed or restarted without "
                               "its data); stopping the transfer (committed files stay, parts stay resumable); "
                               "`fstream reconcile` reports what is left, resubmitting finishes it",
                               run.job_id, run.attempt)
                return
            self.counters["fenced_out"] += 1
            self.log.warning("job %s attempt %d: another agent took it over; stopping without writing",
                             run.job_id, run.attempt)
        elif cancel and not run.cancel_requested:
            run.cancel_requested = True
            run.cancel.set()
            self.log.info("job %s: cancel requested", run.job_id)

    # ------------------------------------------------------------------ main loop
    def _iteration(self) -> bool:
        stream, group = self.keys.jobs_stream(), self.keys.jobs_group()
        self._store.ensure_group()
        # 1. leftovers in our own pending list (a previous incarnation with this name, a failed ack)
        entries = self._read(stream, group, "0", block=None)
        # 2. jobs of dead agents
        if not entries:
            entries = self._reclaim()
        # 3. new jobs
        if not entries:
            entries = self._read(stream, group, ">", block=self.block_ms)
        for entry_id, fields in entries:
            if self._stop.is_set():
                break
            self._handle(entry_id, fields)
        if time.monotonic() - self._last_trim >= self.trim_interval:
            self._last_trim = time.monotonic()
            self._housekeeping()
        return bool(entries)

    def _read(self, stream: str, group: str, start: str, block: int | None) -> list[tuple[str, dict | None]]:
        try:
            resp = self._client.xreadgroup(group, self.name, {stream: start}, count=1, block=block)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._store._group_ready = False
            self._store.ensure_group()
            return []
        out = []
        for _stream, entries in resp or []:
            out.extend(entries)
        return out

    def _reclaim(self) -> list[tuple[str, dict | None]]:
        stream, group = self.keys.jobs_stream(), self.keys.jobs_group()
        try:
            pending = self._client.xpending_range(stream, group, min="-", max="+", count=50,
                                                  idle=self.claim_idle_ms)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self.log.warning("the jobs stream or its consumer group vanished (Redis flushed?); recreating it")
            self._store._group_ready = False
            self._store.ensure_group()
            return []
        for p in pending:
            owner = p["consumer"]
            if owner == self.name or self._client.exists(self.keys.agent(owner)):
                continue
            # XCLAIM re-checks the idle time atomically: a live owner that just touched it keeps it
            got = self._client.xclaim(stream, group, self.name, self.claim_idle_ms, [p["message_id"]])
            if got:
                self.counters["reclaimed"] += 1
                self.log.info("reclaimed entry %s of agent %s (heartbeat gone, idle %d ms)",
                              p["message_id"], owner, p["time_since_delivered"])
                return got[:1]
        resp = self._client.xautoclaim(stream, group, self.name, self.orphan_idle_ms,
                                       start_id=self._autoclaim_cursor, count=1)
        self._autoclaim_cursor = resp[0] if resp and resp[0] else "0-0"
        got = [e for e in (resp[1] if resp else []) if e and e[0]]
        if got:
            self.counters["reclaimed"] += 1
            self.log.info("reclaimed orphan entry %s (idle > %d ms)", got[0][0], self.orphan_idle_ms)
        return got

    def _housekeeping(self) -> None:
        removed = self._store.trim_acked()
        if removed:
            self.log.info("trimmed %d acknowledged job entries", removed)
        stream, group = self.keys.jobs_stream(), self.keys.jobs_group()
        for c in self._client.xinfo_consumers(stream, group):
            if (c["name"] != self.name and not c["pending"] and c["idle"] > 3600_000
                    and not self._client.exists(self.keys.agent(c["name"]))):
                self._client.xgroup_delconsumer(stream, group, c["name"])

    # ------------------------------------------------------------------ one job
    def _handle(self, entry_id: str, fields: dict | None) -> None:
        stream, group = self.keys.jobs_stream(), self.keys.jobs_group()
        job_id = (fields or {}).get("job_id")
        if not job_id:
            # a deleted entry (fields None) or garbage: nothing can ever run it
            self._client.xack(stream, group, entry_id)
            self.log.warning("acknowledged entry %s without a job id (%r)", entry_id, fields)
            return
        claim: Claim = self._store.claim(job_id, entry_id, worker=self.name, max_deliveries=self.max_deliveries)
        if claim.outcome != "claimed":
            self.counters[f"claim_{claim.outcome}"] += 1
            if claim.outcome == "missing":
                self.log.warning("job %s (entry %s): its state is gone from Redis (flushed, lost or expired); "
                                 "entry acknowledged; `fstream reconcile` reports such orphans", job_id, entry_id)
                return
            level = logging.WARNING if claim.outcome == "dead" else logging.INFO
            self.log.log(level, "job %s (entry %s): %s %s", job_id, entry_id, claim.outcome, claim.message)
            return
        run = _JobRun(job_id, claim.attempt, entry_id)
        self._current = run
        if self._stop.is_set():
            run.stopping = True
            run.cancel.set()
        pump_stop = threading.Event()
        pump = threading.Thread(target=self._pump_loop, args=(run, pump_stop), name=f"events-{job_id}", daemon=True)
        pump.start()
        self.log.info("job %s attempt %d: started", job_id, claim.attempt)
        try:
            outcome = self._execute(run, claim.spec)
        finally:
            pump_stop.set()
            run.wake.set()
            pump.join()
            try:
                self._through_outage(run, "publishing its last events", lambda: self._flush(run))
            finally:
                self._current = None
        self._through_outage(run, "recording its outcome", lambda: self._conclude(run, outcome))

    def _through_outage(self, run: _JobRun, what: str, write: Callable[[], None]) -> None:
        """Run a job write; while Redis is unreachable, retry it with backoff (up to ``redis_outage_s``).

        A transfer that finished while Redis was down (killed, restarting from its AOF) is recorded
        once Redis is back, instead of being thrown away and run again. The writes are fenced by
        attempt, so retrying one is safe. Gives up (re-raising) on stop or after ``redis_outage_s``;
        the entry then stays pending and is finished by this agent's next look at its own pending
        entries, or reclaimed.
        """
        deadline = time.monotonic() + self.redis_outage_s
        tries = 0
        while True:
            try:
                write()
                if tries:
                    self.log.info("job %s attempt %d: Redis is back; %s succeeded after %d tries", run.job_id,
                                  run.attempt, what, tries + 1)
                return
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as exc:
                tries += 1
                self.counters["redis_outage_retries"] += 1
                if self._stop.is_set() or time.monotonic() >= deadline:
                    raise
                delay = backoff_delay(tries, base=0.2, cap=5.0, rng=self.rng)
                self.log.warning("job %s attempt %d: Redis unreachable while %s (%s); retrying in %.1f s",
                                 run.job_id, run.attempt, what, exc, delay)
                if self._stop.wait(delay):
                    raise

    def _conclude(self, run: _JobRun, outcome: tuple[str, str | None, dict | None] | None) -> None:
        if run.lost:
            self.log.warning("job %s attempt %d: superseded by a newer attempt; not acknowledging", run.job_id,
                             run.attempt)
            return
        if outcome is None:  # interrupted because the agent stops: give it back
            if self._store.release(run.job_id, run.attempt, f"agent {self.name} stopping"):
                self.log.info("job %s attempt %d: released (agent stopping)", run.job_id, run.attempt)
            return
        state, error, result = outcome
        if self._store.finish(run.job_id, run.attempt, run.entry_id, state=state, error=error, result=result):
            self.counters[f"jobs_{state}"] += 1
            self.log.info("job %s attempt %d: %s%s", run.job_id, run.attempt, state, f" ({error})" if error else "")
        else:
            now = self._store.get(run.job_id)
            if now is not None and now.terminal and now.attempt == run.attempt and now.worker == self.name:
                # a retry after Redis went away mid-reply: the first try was recorded
                self.counters[f"jobs_{now.state}"] += 1
                self.log.info("job %s attempt %d: %s (recorded before Redis went away)", run.job_id, run.attempt,
                              now.state)
                return
            self.counters["fenced_out" if now is not None else "vanished"] += 1
            self.log.warning("job %s attempt %d: finished as %s but %s; not acknowledging", run.job_id,
                             run.attempt, state, "a newer attempt owns it" if now is not None
                             else "its state vanished from Redis (`fstream reconcile` reports orphans)")

    def _execute(self, run: _JobRun, spec: TransferSpec) -> tuple[str, str | None, dict | None] | None:
        """Run the transfer with retries; ``(state, error, result)``, or None if the job must not be finished here."""
        if not spec.secret_file and self.secret_file:
            spec = spec.replace(secret_file=self.secret_file)
        jlog = _Prefixed(log, {"name": f"{self.name} job {run.job_id}#{run.attempt}"})

        def on_event(kind: str, data: dict) -> None:
            if kind == "log":
                jlog.info("%s", data.get("message", data))
            run.add(kind, data)

        retry = 0
        while True:
            result_dict: dict | None = None
            error: str | None = None
            retryable = False
            try:
                transfer = self.transfer_factory(spec, job_id=run.job_id, attempt=run.attempt, on_event=on_event,
                                                 cancel=run.cancel, redis=self._client, log=jlog)
                result = transfer.run()
                result_dict = result.to_dict()
                if result.ok:
                    return "succeeded", None, result_dict
                failures = result_dict.get("failures") or []
                retryable = bool(failures) and all(f.get("retryable") for f in failures)
                shown = "; ".join(f"{f.get('path')}: {f.get('reason')}" for f in failures[:5])
                more = f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""
                if failures:
                    error = f"{len(failures)} file(s) failed: {shown}{more}"
                else:
                    error = result_dict.get("error") or "transfer did not complete (no failure reported)"
            except Exception as exc:
                retryable = is_retryable(exc)
                error = exc.describe() if isinstance(exc, FStreamError) else f"{type(exc).__name__}: {exc}"
                if not isinstance(exc, (FStreamError, OSError)):
                    self.counters["transfer_exceptions"] += 1
                    jlog.exception("transfer raised an unexpected error")
            if run.lost or run.stopping:
                return None
            if run.cancel.is_set() and run.cancel_requested:
                reason = self._client.hget(self.keys.job(run.job_id), "cancel_reason") or "cancelled"
                return "cancelled", reason, result_dict
            run.add("error", {"message": error, "retryable": retryable, "try": retry})
            if not retryable or retry >= self.max_retries:
                if retryable:
                    error = f"{error} (gave up after {retry + 1} tries)"
                return "failed", error, result_dict
            delay = backoff_delay(retry, base=self.retry_base_s, cap=self.retry_cap_s, rng=self.rng)
            retry += 1
            run.add("retry", {"attempt": run.attempt, "try": retry, "delay": delay, "message": error})
            jlog.warning("retryable failure (%s); try %d of %d in %.1f s", error, retry, self.max_retries, delay)
            if run.cancel.wait(delay):
                if run.lost or run.stopping:
                    return None
                reason = self._client.hget(self.keys.job(run.job_id), "cancel_reason") or "cancelled"
                return "cancelled", reason, result_dict

    # ------------------------------------------------------------------ events
    def _pump_loop(self, run: _JobRun, pump_stop: threading.Event) -> None:
        while not pump_stop.is_set():
            run.wake.wait(self.flush_interval)
            run.wake.clear()
            try:
                self._flush(run)
            except Exception:
                self.counters["publish_errors"] += 1
                self.log.exception("job %s: publishing events failed; will retry", run.job_id)

    def _flush(self, run: _JobRun) -> None:
        if run.lost:
            return
        first = True
        while first or run.pending():
            first = False
            events, progress = run.take()
            fields = {"progress": json.dumps(progress, default=str)} if progress is not None else None
            owner, cancel = self._store.publish(run.job_id, run.attempt, events, fields)
            self._note_fence(run, owner, cancel)
            if run.lost:
                return
