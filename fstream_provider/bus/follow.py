"""Following one job's event stream until the job ends: the rules both loops share, and the blocking loop."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from fstream_provider.bus.job_state import JobLostError, JobNotFoundError, JobState

OnEvent = Callable[[str, dict], None]
log = logging.getLogger(__name__)


class JobFollow:
    """Where a follower is in a job's event stream, and when the follow ends (``follow_job``, ``afollow_job``).

    The rules: the job must exist when the follow starts (else ``JobNotFoundError``); its ``done``
    event ends the follow; after a read that brought nothing the job's hash is looked at: gone means
    its state vanished (``JobLostError``: Redis flushed or restarted without its data, never a normal
    expiry, so the follower must not wait for ever), terminal means one last non-blocking read
    ("drain": the ``done`` event written meanwhile, or nothing if the stream was trimmed past it).
    A ``done`` event ends the follow only if the job's state, as the client believes it, is terminal: a store
    with ``trust`` shows a success no trusted agent signed as ``unverified`` (``authz.outcome``), so a forged
    ``done`` event or hash is not an end: the follower logs that once and keeps waiting (issue 40).

    :param job_id: the job.
    :param after: the stream id to read after (``0-0``: from the start).
    """

    def __init__(self, job_id: str, after: str = "0-0") -> None:
        self.job_id = job_id
        self.after = after
        self.done: dict | None = None
        self.state: Any = None
        self.draining = False
        self.warned = False

    def found(self, state: Any) -> Any:
        """The first look at the job's hash: raises ``JobNotFoundError`` if the job does not exist."""
        if state is None:
            raise JobNotFoundError(self.job_id)
        self.state = state
        return state

    def advance(self, batch: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
        """Move past ``batch``; returns its events up to and including ``done`` (which ends the follow)."""
        out = []
        for eid, ev in batch:
            self.after = eid
            out.append((eid, ev))
            if ev.get("kind") == "done":
                self.done = ev
                break
        return out

    def still_there(self, state: Any) -> Any:
        """A later look at the job's hash: raises ``JobLostError`` if its state vanished."""
        if state is None:
            last = self.state
            raise JobLostError(self.job_id, f"last seen {getattr(last, 'state', '?')}, "
                                            f"attempt {getattr(last, 'attempt', '?')}")
        self.state = state
        return state

    def settled(self, state: Any) -> bool:
        """After a ``done`` event, with the job's fresh state: True when it is terminal (the follow ends); else the
        event is not believed (an outcome no trusted agent signed) and the follow goes on."""
        if state.terminal:
            return True
        self.done = None
        self.not_believed(state)
        return False

    def not_believed(self, state: Any) -> None:
        """Say once, clearly, that the job shows an outcome no trusted agent signed."""
        reason = getattr(state, "unverified", None)
        if reason and not self.warned:
            self.warned = True
            log.warning("%s: not done; waiting for an outcome a trusted agent signed (docs/authorization.md, "
                        "\"Outcomes\")", reason)

    def after_empty_read(self, state: Any) -> bool:
        """Looked at the hash after a read brought nothing: True when the follow ends (drained a finished job)."""
        state = self.still_there(state)
        self.not_believed(state)
        if self.draining:
            return True
        self.draining = bool(state.terminal)
        return False

    def block_ms(self, block_ms: int | None) -> int | None:
        """How long the next read blocks: not at all while draining."""
        return None if self.draining else block_ms

    def done_event(self) -> dict:
        """The ``done`` event as the job's state (the hash as the client believes it: ``settled``) says: never the
        event's own data, which anyone who may write the stream could have written."""
        s = self.state
        return {"kind": "done", "ts": s.updated_at, "state": s.state, "error": s.error, "result": s.result}


def follow_job(store: Any, job_id: str, *, on_event: OnEvent | None = None, timeout: float | None = None,
               after: str = "0-0", block_ms: int = 1000, count: int = 500,
               on_idle: Callable[[JobState], None] | None = None) -> JobState:
    """Follow a job's events until it ends (or ``timeout`` passes); returns its state.

    ``on_event(entry_id, event)`` sees every event after ``after`` (a job already finished is replayed;
    without ``on_event`` it returns at once). Raises ``JobNotFoundError`` (a ``KeyError``) if the job
    does not exist, ``JobLostError`` if its state vanishes while following.

    :param store: a ``fstream_provider.bus.jobs.JobStore``.
    :param timeout: seconds to follow at most; then the current, non-terminal state is returned.
    :param block_ms: how long one read blocks before the job's hash is looked at.
    :param on_idle: called with the fresh state after every read that brought nothing (may raise).
    """
    f = JobFollow(job_id, after)
    state = f.found(store.get(job_id))
    if on_event is None and state.terminal:
        return state
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        block = f.block_ms(block_ms)
        if deadline is not None and block is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return f.still_there(store.get(job_id))
            block = max(1, int(min(block, remaining * 1000)))
        batch = f.advance(store.events(job_id, after=f.after, block_ms=block, count=count))
        if on_event is not None:
            for eid, ev in batch:
                on_event(eid, ev)
        if f.done is not None:
            state = f.still_there(store.get(job_id))
            if f.settled(state):
                return state
            continue
        if not batch:
            state = store.get(job_id)
            if f.after_empty_read(state):
                return f.state
            if on_idle is not None:
                on_idle(state)
