"""The one retry policy: a predicate (retryable or terminal), exponential backoff with jitter and a cap, a limit, a stop event."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # tenacity is imported by ``call`` (loops that count their own failures never need it: issue 29)
    from tenacity import RetryCallState

T = TypeVar("T")


def always(exc: BaseException) -> bool:
    """The default predicate: every ``Exception`` is worth another try."""
    return True


class _Stopped(Exception):
    """The stop event was set during a backoff wait: end at once with the last failure."""


@dataclass(frozen=True)
class RetryPolicy:
    """How a failing operation is tried again (built on ``tenacity``).

    Two ways to use it: ``call(fn)`` runs ``fn`` until it succeeds, fails terminally or the policy
    gives up; loops that count their own failures (a daemon that never gives up) take ``delay(n)``
    or ``pause(n, stop)``. Waits use ``Event.wait`` (never ``time.sleep``), so a set stop event
    ends a wait at once and nothing is tried again after it.

    :param retryable: the predicate: True for a failure worth retrying, False for a terminal one
        (re-raised at once).
    :param base_s: the wait before the first retry, before jitter; doubles with every retry.
    :param cap_s: the longest wait, before jitter.
    :param attempts: give up after this many tries in all (None: no limit).
    :param deadline_s: give up once this long has passed since the first try (None: no limit).
    """

    retryable: Callable[[BaseException], bool] = always
    base_s: float = 1.0
    cap_s: float = 60.0
    attempts: int | None = None
    deadline_s: float | None = None

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """The wait before retry ``retry`` (0 = the first): ``min(cap, base * 2**retry)`` times a random [0.5, 1]."""
        # the exponent is bounded: 2**1024 is no float, and a stream that retries for ever keeps counting
        return min(self.cap_s, self.base_s * (2.0 ** min(retry, 64))) * (rng or random).uniform(0.5, 1.0)

    def pause(self, retry: int, stop: threading.Event, rng: random.Random | None = None) -> bool:
        """Wait ``delay(retry)`` on ``stop``; True if ``stop`` was set (shutting down: do not try again)."""
        return stop.wait(self.delay(retry, rng))

    def call(self, fn: Callable[[], T], *, stop: threading.Event | None = None, rng: random.Random | None = None,
             on_failure: Callable[[int, BaseException], None] | None = None,
             on_retry: Callable[[int, BaseException, float], None] | None = None) -> T:
        """``fn()`` with retries; returns its result or re-raises its last exception.

        A terminal failure (the predicate says no) is re-raised at once; a retryable one is re-raised
        when the attempts or the deadline are used up, or when ``stop`` is set (before or during a wait).

        :param stop: shutdown event: ends a wait at once and stops retrying.
        :param rng: randomness for the jitter (tests pass a seeded one).
        :param on_failure: called as ``on_failure(tries, exc)`` after every retryable failure, the last included.
        :param on_retry: called as ``on_retry(tries, exc, delay)`` before each wait (for logs and events).
        """
        from tenacity import (Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, stop_never,
                              stop_when_event_set)

        limits: Any = stop_never
        for limit in (stop_after_attempt(self.attempts) if self.attempts is not None else None,
                      stop_after_delay(self.deadline_s) if self.deadline_s is not None else None,
                      stop_when_event_set(stop) if stop is not None else None):
            if limit is not None:
                limits = limit if limits is stop_never else limits | limit
        waiter = stop if stop is not None else threading.Event()
        last: list[BaseException] = []

        def sleep(seconds: float) -> None:
            if waiter.wait(seconds):
                raise _Stopped

        def after(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            if exc is not None:
                last[:] = [exc]
                if on_failure is not None:
                    on_failure(state.attempt_number, exc)

        def before_sleep(state: RetryCallState) -> None:
            if on_retry is not None and last:
                on_retry(state.attempt_number, last[0], state.upcoming_sleep)

        retrying = Retrying(retry=retry_if_exception(self.retryable),
                            wait=lambda state: self.delay(state.attempt_number - 1, rng),
                            stop=limits, sleep=sleep, after=after, before_sleep=before_sleep, reraise=True)
        try:
            return retrying(fn)
        except _Stopped:
            raise last[0] from None
