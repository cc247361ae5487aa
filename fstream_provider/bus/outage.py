"""Riding out a Redis outage on the Airflow side (issue 41): tasks, triggers and sensors wait, as the agent does.

The agent already survives a restarting or failing-over Redis (``transfer_agent.daemon.runner``: its job writes
are retried with backoff for ``redis_outage_s``). The Airflow side must too, or a 30 s restart fails tasks whose
transfers succeed. The rule is the same on both sides:

- only ``bus.client.REDIS_UNREACHABLE`` errors are waited out (down, loading, a Sentinel or Cluster failover); a
  refused command (NOPERM, WRONGTYPE, a server below the floor) is no outage and fails at once;
- waits grow exponentially with jitter, capped (``BACKOFF``: 0.5 s doubling to 5 s);
- one outage lasts from its first failure to the next success; it may last ``budget_s`` (the operator's
  ``redis_outage_timeout``, 10 minutes by default as the agent's ``redis_outage_s``), after which the caller
  fails with ``BusOutageError``: one line naming the Redis, what was being done and for how long, no traceback;
- each outage is logged once when it starts (WARNING), again at most once a minute while it lasts, and once when
  it ends (INFO, with its length): a task log tells the story without a line per retry.

Callers resume where they were: the trigger follows the job's stream from the last id it handled, so no event is
lost or repeated; the operator's reads are idempotent and its submission is keyed (``FStreamTransferOperator.submit``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fstream_provider.bus.client import REDIS_UNREACHABLE
from fstream_provider.model.retry import RetryPolicy

T = TypeVar("T")

DEFAULT_OUTAGE_S = 600.0
BACKOFF = RetryPolicy(base_s=0.5, cap_s=5.0)
REPEAT_EVERY_S = 60.0


class BusOutageError(Exception):
    """Redis stayed unreachable longer than the caller's budget (its message is the one line a task log shows)."""


class Outage:
    """The clock of the current outage, if any: ``failed`` at each unreachable error, ``recovered`` at each success.

    :param budget_s: how long one outage may last before ``failed`` raises ``BusOutageError`` (None: for ever).
    :param what: what the caller was doing, for the log lines (``following FStream job j-1``).
    :param log: where the lines go.
    :param where: the Redis, as ``bus.client.describe`` names it (for the lines).
    :param clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, budget_s: float | None, what: str, log: logging.Logger | logging.LoggerAdapter, *,
                 where: str = "Redis", clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.budget_s = budget_s
        self.what = what
        self.log = log
        self.where = where
        self.clock = clock
        self.rng = rng
        self.since: float | None = None  # when the current outage began (None: none now)
        self.tries = 0
        self.outages = 0  # how many outages were ridden out (tests, the report)
        self._last_line = 0.0

    def failed(self, exc: BaseException) -> float:
        """An unreachable error: the seconds to wait before trying again; ``BusOutageError`` once over budget."""
        now = self.clock()
        if self.since is None:
            self.since, self.tries, self._last_line = now, 0, now
            self.outages += 1
            self.log.warning("%s unreachable while %s (%s: %s); waiting for it to come back (up to %s)",
                             self.where, self.what, type(exc).__name__, first_line(exc), _budget(self.budget_s))
        elif now - self._last_line >= REPEAT_EVERY_S:
            self._last_line = now
            self.log.warning("%s still unreachable while %s, for %.0f s (%s)", self.where, self.what,
                             now - self.since, first_line(exc))
        lasted = now - self.since
        if self.budget_s is not None and lasted >= self.budget_s:
            raise BusOutageError(f"{self.where} unreachable for {lasted:.0f} s while {self.what} "
                                 f"(redis_outage_timeout {self.budget_s:g} s): {type(exc).__name__}: "
                                 f"{first_line(exc)}")
        delay = BACKOFF.delay(self.tries, self.rng)
        self.tries += 1
        if self.budget_s is not None:
            delay = max(0.0, min(delay, self.since + self.budget_s - now))
        return delay

    def recovered(self) -> None:
        """A call succeeded: an outage in progress ends (logged once, with its length)."""
        if self.since is not None:
            self.log.info("%s is back after %.1f s: %s resumes (%d retries)", self.where,
                          self.clock() - self.since, self.what, self.tries)
            self.since = None

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()``, waiting out unreachable errors within the budget (blocking)."""
        while True:
            try:
                out = fn()
            except REDIS_UNREACHABLE as exc:
                time.sleep(self.failed(exc))  # the backoff of a blocking caller (a worker's task)
                continue
            self.recovered()
            return out

    async def acall(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()``, waiting out unreachable errors within the budget (on the running loop)."""
        while True:
            try:
                out = await fn()
            except REDIS_UNREACHABLE as exc:
                await asyncio.sleep(self.failed(exc))
                continue
            self.recovered()
            return out


def first_line(exc: BaseException) -> str:
    """The error's first line (``no message`` when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no message"


def _budget(budget_s: float | None) -> str:
    return "no limit" if budget_s is None else f"{budget_s:g} s"
