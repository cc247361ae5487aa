"""One claimed job while it runs on an agent: its fencing token, cancel event and buffered events."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

PUBLISH_BATCH = 500


class PrefixedLog(logging.LoggerAdapter):
    """Prefixes every line with ``[agent <name>]`` (a log prefix per worker)."""

    def process(self, msg: str, kwargs: Any) -> tuple[str, Any]:
        return f"[agent {self.extra['name']}] {msg}", kwargs


def busy_streams(interval: dict) -> int:
    """TCP streams moving data in an interval record: the channels' streams, but no more than the files in
    flight can use (a channel with no file to send holds its streams idle: a transfer on its last large
    file moves on one channel whatever its layout)."""
    clusters = (interval.get("clusters") or {}).values()
    streams = sum(int(c.get("cc", 0)) * int(c.get("p", 1)) for c in clusters)
    active = interval.get("active_files")
    if active is None:
        return streams
    return min(streams, int(active) * max((int(c.get("p", 1)) for c in clusters), default=1))


class JobRun:
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
        self.drain = threading.Event()  # the agent drains: open files finish, no new one starts (``sending.drain``)
        self.poke: Callable[[], None] | None = None  # the running transfer's ``wake``: act on cancel/drain now
        self.lost = False  # another agent took the job over: write nothing more
        self.cancel_requested = False
        self.auth = ""  # the job's signature envelope as stored (its nonce is marked ended with its outcome)
        self.submitter = ""  # who signed the job (the policy's decision), for the audit record of its outcome
        self.stopping = False
        # the agents' scheduler (``--scheduler seal|steal``): bytes moved, recent rate, and why it was preempted
        self.moved = 0.0
        self.rate_bps = 0.0
        self.streams = 0  # TCP streams open in the last interval
        self.preempt_reason = ""
        self.preempt_by = ""
        self.preempt_seen = 0.0
        self._lock = threading.Lock()
        self._events: list[tuple[str, float, dict]] = []
        self._first = 1  # the number of ``_events[0]`` among this attempt's events (``JobStore.publish``'s ``first``)
        self._progress: dict | None = None
        self.wake = threading.Event()
        self.observe: Any = None  # ``observe(kind, data)`` per event: the agent's metrics (transfer_agent.service)

    def signal(self, event: threading.Event) -> None:
        """Set ``event`` (``cancel`` or ``drain``) and wake the transfer so it acts on it at once."""
        event.set()
        poke = self.poke
        if poke is not None:
            poke()

    def add(self, kind: str, data: dict) -> None:
        if self.observe is not None:
            self.observe(kind, data)
        with self._lock:
            self._events.append((kind, time.time(), data))
            if kind == "interval":
                self._progress = data
                self.moved += float(data.get("bytes") or 0)
                self.rate_bps = float(data.get("throughput_bps") or 0)
                self.streams = busy_streams(data)
            if len(self._events) >= PUBLISH_BATCH:
                self.wake.set()

    def take(self) -> tuple[list[tuple[str, float, dict]], dict | None, int]:
        """The next batch to publish: its events, the latest progress record, and the first event's number
        (this attempt's events are numbered 1, 2, ... in the order they were added; a batch sent again keeps its
        numbers, so the bus appends each event once)."""
        with self._lock:
            events, self._events = self._events[:PUBLISH_BATCH], self._events[PUBLISH_BATCH:]
            first, self._first = self._first, self._first + len(events)
            progress, self._progress = self._progress, None
            return events, progress, first

    def untake(self, events: list[tuple[str, float, dict]], progress: dict | None, first: int) -> None:
        """Put back what ``take`` gave to a publish that failed or is in doubt (Redis unreachable, a Cluster failing
        over, a write no replica acknowledged): they go out first next time with the same numbers, so no event (a
        landed file's record) is lost and none is appended twice; a newer progress record wins."""
        with self._lock:
            self._events[:0] = events
            self._first = first
            if self._progress is None:
                self._progress = progress

    def pending(self) -> bool:
        with self._lock:
            return bool(self._events) or self._progress is not None

