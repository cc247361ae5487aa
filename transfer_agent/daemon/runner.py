"""Running one claimed job on the agent: claim, transfer with retries, events pumped, outcome recorded through outages."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fstream_provider.bus.audit import mark_ended
from fstream_provider.bus.client import REDIS_UNREACHABLE, WriteInDoubt, redis_unreachable
from fstream_provider.bus.job_state import Claim
from fstream_provider.model.retry import RetryPolicy
from fstream_provider.model.spec import TransferSpec
from fstream_provider.watch.sources import listing_progress
from transfer_agent.daemon.authorize import Decision, Guard
from transfer_agent.daemon.jobrun import JobRun, PrefixedLog
from transfer_agent.errors import FStreamError

log = logging.getLogger(__name__)


# Writes of a finished job while Redis is unreachable: 0.2 s doubling to 5 s (times [0.5, 1]), as long as
# the agent's ``redis_outage_s``. The agent's reconnect loop waits the same way.
REDIS_BACKOFF = RetryPolicy(retryable=redis_unreachable, base_s=0.4, cap_s=5.0)


def is_retryable(exc: BaseException) -> bool:
    """The retry predicate: FStream errors say so themselves; plain OS/network errors are retryable."""
    if isinstance(exc, FStreamError):
        return bool(exc.retryable)
    return isinstance(exc, (OSError, TimeoutError))


class RetryableFailure(Exception):
    """A try of a job's transfer failed and may be tried again (the retry policy's predicate).

    :param error: what failed, naming the files/peer and the cause.
    :param result: the transfer result of that try, if it returned one.
    :param retry: which try failed (0 = the first).
    """

    def __init__(self, error: str, result: dict | None, retry: int) -> None:
        super().__init__(error)
        self.error, self.result, self.retry = error, result, retry


class JobRunnerMixin:
    """Takes one stream entry to its end for ``transfer_agent.daemon.worker.Agent``.

    Uses the agent's settings (``name``, ``keys``, ``authorizer``, ``audit``, ``max_deliveries``, ``max_retries``,
    ``retry_base_s``, ``retry_cap_s``, ``flush_interval``, ``redis_outage_s``, ``transfer_factory``,
    ``rng``), its ``counters``, ``log``, ``_client``, ``_store``, ``_current``, ``_note_fence``, ``_alive`` (pings
    systemd's watchdog from the job's events and retries) and its stop state, declared below.
    """

    _stop: threading.Event  # no new job (set by ``drain`` and ``stop``)
    _halt: threading.Event  # stop at once (``stop`` only): a job's Redis writes are no longer retried
    _drain_ends: float | None  # a drain's end (monotonic): a job's Redis writes are retried until then
    _board: Any  # the agents' shared scheduling board (``scheduled``), None under ``fifo``

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
            if claim.outcome == "foreign":
                self._foreign_entry(job_id, entry_id, claim.message)
                return
            if claim.outcome == "missing":
                self.log.warning("job %s (entry %s): its state is gone from Redis (flushed, lost or expired); "
                                 "entry acknowledged; `fstream reconcile` reports such orphans", job_id, entry_id)
                return
            level = logging.WARNING if claim.outcome == "dead" else logging.INFO
            self.log.log(level, "job %s (entry %s): %s %s", job_id, entry_id, claim.outcome, claim.message)
            return
        decision = self._authorize(job_id, entry_id, claim)
        if decision is not None:
            self._run_claimed(job_id, entry_id, claim, decision)

    def _foreign_entry(self, job_id: str, entry_id: str, submitted_as: str) -> None:
        """An entry naming a job that was submitted under another entry (issue 40: anyone who may add to the jobs
        stream can write one): acknowledged and ignored, audited without blaming the job's submitter."""
        self.counters["entries_foreign"] += 1
        reason = (f"jobs-stream entry {entry_id} names job {job_id}, which was submitted as entry {submitted_as}: "
                  "a forged or duplicated entry, acknowledged and ignored (the job itself is untouched)")
        self.log.warning("%s", reason)
        self.audit.record("decision", job_id=job_id, submitter="", decision="ignored", reason=reason, agent=self.name)

    def _authorize(self, job_id: str, entry_id: str, claim: Claim) -> Decision | None:
        """The policy's decision on a claimed job, audited; a refused job is dead-lettered (None returned)."""
        d = self.authorizer.decide(job_id, entry_id, claim.spec, claim.spec_json, claim.auth, claim.message)
        spec = claim.spec
        self.audit.record("decision", job_id=job_id, submitter=d.submitter, decision="accepted" if d.accepted
                          else "refused", reason=d.reason, sources=spec.sources if spec else None,
                          destination=spec.destination if spec else None, key=(spec.key or "default") if spec
                          else None, agent=self.name)
        if d.accepted:
            shown = ", ".join(spec.sources[:3]) + (f" (+{len(spec.sources) - 3})" if len(spec.sources) > 3 else "")
            self.log.info("job %s: %s: %s -> %s, key %s", job_id, d.reason, shown, spec.destination,
                          spec.key or "default")
            return d
        self.counters["jobs_refused"] += 1
        self.log.warning("job %s: %s; dead-lettered", job_id, d.reason)
        if self._store.reject(job_id, claim.attempt, entry_id, d.reason):
            board = self._board
            if board is not None:
                board.remove(job_id)
        return None

    def _run_claimed(self, job_id: str, entry_id: str, claim: Claim, decision: Decision) -> None:
        """Run a claimed, authorized job to its outcome (taken from the stream, or given by the agents' scheduler)."""
        run = JobRun(job_id, claim.attempt, entry_id)
        run.submitter = decision.submitter
        run.auth = claim.auth
        observer = self.observer  # read once: a SIGHUP reload may set it to None meanwhile
        run.observe = observer.job(decision.run_spec) if observer is not None else None  # metrics
        self._current = run
        if self._stop.is_set():  # stopping since before it started: handed back untouched (``_try``)
            self._hand_back(run, cut=True)
        pump_stop = threading.Event()
        pump = threading.Thread(target=self._pump_loop, args=(run, pump_stop), name=f"events-{job_id}", daemon=True)
        pump.start()
        self.log.info("job %s attempt %d: started", job_id, claim.attempt)
        try:
            outcome = self._execute(run, decision.run_spec, decision.guard)
        finally:
            pump_stop.set()
            run.wake.set()
            pump.join()
            try:
                self._through_outage(run, "publishing its last events", lambda: self._flush(run))
            finally:
                self._current = None
        self._through_outage(run, "recording its outcome", lambda: self._conclude(run, outcome))
        if outcome is not None and not run.lost:
            state, error, result = outcome
            self._audit_outcome(run, state, error, result)

    @staticmethod
    def _hand_back(run: JobRun, *, cut: bool) -> None:
        """Stop ``run`` so that its job is released to the bus (``_conclude``) for another try: no new try starts
        (``_try``); its transfer finishes the files it has open and starts no other (``sending.drain``) or, with
        ``cut``, stops them now at their last flushed ranges. Either way the files it did not land are handed
        back, never reported failed: the next try sends them."""
        run.stopping = True
        if cut:
            run.drain.set()  # with the cancel: what the transfer holds back, not what it fails
            run.signal(run.cancel)
        else:
            run.signal(run.drain)

    def _mark_ended(self, run: JobRun, state: str) -> None:
        """The job's nonce marked ended (``bus.audit.mark_ended``): no later change of its hash runs it again."""
        try:
            mark_ended(self._client, self.keys, run.auth, f"{run.job_id} {run.entry_id}", state)
        except REDIS_UNREACHABLE as exc:
            self.log.warning("job %s: could not mark its nonce ended (%s); a later change of its state could be "
                             "re-run by `fstream reconcile --repair`", run.job_id, exc)

    def _audit_outcome(self, run: JobRun, state: str, error: str | None, result: dict | None) -> None:
        files = (result or {}).get("files_committed") if isinstance(result, dict) else None
        moved = (result or {}).get("bytes_committed") if isinstance(result, dict) else None
        try:
            self.audit.record("outcome", job_id=run.job_id, submitter=run.submitter, outcome=state, reason=error,
                              files=files, bytes=moved, agent=self.name)
        except REDIS_UNREACHABLE as exc:  # the job's outcome is recorded; the audit line is in the log
            self.log.warning("job %s: audit record of its outcome not written (%s)", run.job_id, exc)
        self.log.info("audit: job %s from submitter %r: %s%s", run.job_id, run.submitter, state,
                      f" ({error})" if error else "")

    def _through_outage(self, run: JobRun, what: str, write: Callable[[], None]) -> None:
        """Run a job write; while Redis is unreachable, retry it with backoff (up to ``redis_outage_s``).

        A transfer that finished while Redis was down (killed, restarting from its AOF) is recorded
        once Redis is back, instead of being thrown away and run again. The writes are fenced by
        attempt, so retrying one is safe. Gives up (re-raising) on stop or after ``redis_outage_s``;
        the entry then stays pending and is finished by this agent's next look at its own pending
        entries, or reclaimed.
        """
        tries = 0

        def failed(n: int, exc: BaseException) -> None:
            nonlocal tries
            tries = n
            self.counters["redis_outage_retries"] += 1

        def retrying(n: int, exc: BaseException, delay: float) -> None:
            self._alive()
            self.log.warning("job %s attempt %d: Redis unreachable while %s (%s); retrying in %.1f s",
                             run.job_id, run.attempt, what, exc, delay)

        # a drain (SIGTERM) keeps retrying until its grace ends; only a hard stop (SIGINT, ``stop()``) gives up at once
        ends = self._drain_ends
        limit = self.redis_outage_s if ends is None else max(0.0, min(self.redis_outage_s, ends - time.monotonic()))
        policy = dataclasses.replace(REDIS_BACKOFF, deadline_s=limit)
        policy.call(write, stop=self._halt, rng=self.rng, on_failure=failed, on_retry=retrying)
        if tries:
            self.log.info("job %s attempt %d: Redis is back; %s succeeded after %d tries", run.job_id,
                          run.attempt, what, tries + 1)

    def _conclude(self, run: JobRun, outcome: tuple[str, str | None, dict | None] | None) -> None:
        if run.lost:
            self.log.warning("job %s attempt %d: superseded by a newer attempt; not acknowledging", run.job_id,
                             run.attempt)
            return
        board = self._board
        if outcome is None and run.preempt_reason:  # the scheduler's: stopped at its checkpoint, runs again later
            data = {"by": run.preempt_by, "committed_bytes": run.moved, "agent": self.name}
            if self._store.preempt(run.job_id, run.attempt, run.preempt_reason, data):
                self.counters["jobs_preempted"] += 1
                self.log.info("job %s attempt %d: preempted (%s)", run.job_id, run.attempt, run.preempt_reason)
                board.requeue(run.job_id, done_bytes=run.moved, preempted=True)
            return
        if outcome is None:  # interrupted because the agent stops: give it back
            if self._store.release(run.job_id, run.attempt, f"agent {self.name} stopping"):
                self.log.info("job %s attempt %d: released (agent stopping)", run.job_id, run.attempt)
                if board is not None:
                    board.requeue(run.job_id, done_bytes=run.moved)
            return
        state, error, result = outcome
        if self._store.finish(run.job_id, run.attempt, run.entry_id, state=state, error=error, result=result):
            self._mark_ended(run, state)
            if board is not None:
                board.remove(run.job_id)
            self.counters[f"jobs_{state}"] += 1
            self.log.info("job %s attempt %d: %s%s", run.job_id, run.attempt, state, f" ({error})" if error else "")
        else:
            now = self._store.get(run.job_id)
            if now is not None and now.terminal and now.attempt == run.attempt and now.worker == self.name:
                # a retry after Redis went away mid-reply, or of a write in doubt: the first try was recorded
                self._mark_ended(run, now.state)
                self.counters[f"jobs_{now.state}"] += 1
                self.log.info("job %s attempt %d: %s (recorded by an earlier try)", run.job_id, run.attempt,
                              now.state)
                if board is not None:
                    board.remove(run.job_id)
                return
            self.counters["fenced_out" if now is not None else "vanished"] += 1
            self.log.warning("job %s attempt %d: finished as %s but %s; not acknowledging", run.job_id,
                             run.attempt, state, "a newer attempt owns it" if now is not None
                             else "its state vanished from Redis (`fstream reconcile` reports orphans)")

    def _execute(self, run: JobRun, spec: TransferSpec, guard: Guard | None = None
                 ) -> tuple[str, str | None, dict | None] | None:
        """Run the transfer with retries; ``(state, error, result)``, or None if the job must not be finished here.

        ``spec`` carries the files of the key the policy chose; ``guard`` checks every source file it opens."""
        jlog = PrefixedLog(log, {"name": f"{self.name} job {run.job_id}#{run.attempt}"})

        def on_event(kind: str, data: dict) -> None:
            self._alive()  # the transfer's loop runs on the agent's main thread: its records ping the watchdog
            if kind == "log":
                jlog.info("%s", data.get("message", data))
            run.add(kind, data)

        tries = itertools.count()
        policy = RetryPolicy(retryable=lambda exc: isinstance(exc, RetryableFailure), base_s=self.retry_base_s,
                             cap_s=self.retry_cap_s, attempts=self.max_retries + 1)

        def retrying(n: int, exc: BaseException, delay: float) -> None:
            self._alive()
            error = exc.error if isinstance(exc, RetryableFailure) else str(exc)
            run.add("retry", {"attempt": run.attempt, "try": n, "delay": delay, "message": error})
            jlog.warning("retryable failure (%s); try %d of %d in %.1f s", error, n, self.max_retries, delay)

        try:
            return policy.call(lambda: self._try(run, spec, next(tries), on_event, jlog, guard), stop=run.cancel,
                               rng=self.rng, on_retry=retrying)
        except RetryableFailure as failure:
            if failure.retry >= self.max_retries:
                return "failed", f"{failure.error} (gave up after {failure.retry + 1} tries)", failure.result
            # the cancel event ended the wait before the next try
            if run.lost or run.stopping:
                return None
            return "cancelled", self._cancel_reason(run), failure.result

    def _try(self, run: JobRun, spec: TransferSpec, retry: int, on_event: Callable[[str, dict], None],
             jlog: PrefixedLog, guard: Guard | None = None) -> tuple[str, str | None, dict | None] | None:
        """One try of the transfer: its outcome, None (not to be finished here), or ``RetryableFailure``."""
        result_dict: dict | None = None
        error: str | None = None
        retryable = False
        if run.drain.is_set():  # the agent drains (or stops): no new try starts; the job is handed back
            return None
        try:
            transfer = self.transfer_factory(spec, job_id=run.job_id, attempt=run.attempt, on_event=on_event,
                                             cancel=run.cancel, redis=self._client, log=jlog, history=self.history,
                                             guard=guard, drain=run.drain)
            run.poke = getattr(transfer, "wake", None)
            with listing_progress(self._alive):  # listing the job's sources (this thread) feeds the watchdog too
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
            if result_dict is not None and run.drain.is_set() and not run.lost:  # what this attempt did, for the next
                run.add("drained", {k: result_dict.get(k) for k in ("verified_files", "skipped_files", "bytes_sent",
                                                                    "resumed_bytes", "error")})
            return None
        if run.cancel.is_set() and run.cancel_requested:
            return "cancelled", self._cancel_reason(run), result_dict
        run.add("error", {"message": error, "retryable": retryable, "try": retry})
        if retryable:
            raise RetryableFailure(error, result_dict, retry)
        return "failed", error, result_dict

    def _cancel_reason(self, run: JobRun) -> str:
        return self._client.hget(self.keys.job(run.job_id), "cancel_reason") or "cancelled"

    # ------------------------------------------------------------------ events
    def _pump_loop(self, run: JobRun, pump_stop: threading.Event) -> None:
        doubt = False
        while not pump_stop.is_set():
            run.wake.wait(self.flush_interval)
            run.wake.clear()
            try:
                self._flush(run)
                doubt = False
            except WriteInDoubt as exc:  # sent again with the next flush; the bus appends each event once
                self.counters["publish_in_doubt"] += 1
                if not doubt:
                    self.log.warning("job %s: events in doubt (%s)", run.job_id, exc)
                doubt = True
            except REDIS_UNREACHABLE as exc:  # the events stay buffered (``_flush``) and go out once Redis is back
                self.counters["publish_errors"] += 1
                self.log.warning("job %s: Redis unreachable while publishing events (%s); will retry", run.job_id, exc)
            except Exception:
                self.counters["publish_errors"] += 1
                self.log.exception("job %s: publishing events failed; will retry", run.job_id)

    def _flush(self, run: JobRun) -> None:
        if run.lost:
            return
        once = True
        while once or run.pending():
            once = False
            events, progress, first = run.take()
            fields = {"progress": json.dumps(progress, default=str)} if progress is not None else None
            try:
                owner, cancel = self._store.publish(run.job_id, run.attempt, events, fields, first=first)
            except Exception:
                run.untake(events, progress, first)  # not lost: sent again with the next flush, appended once
                raise
            self._note_fence(run, owner, cancel)
            if run.lost:
                return
