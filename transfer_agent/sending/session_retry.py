"""When a failed session of a transfer is started again (issue 30, defects 1 and 2): its budget and its backoff.

A session that fails retryably (receiver unreachable, connection lost, stalled) is started again after a
capped, jittered backoff (``SESSION_RETRY``, the one retry policy of ``fstream_provider.model.retry``).
A plain send, a pipeline step, gives up, as retryable (exit 75), after ``max_attempts`` tries or
``retry_for_s`` seconds of one outage (``fstream send --max-attempts / --retry-for``; 5 tries if neither is
given). A watch stream retries for as long as it is asked to run (until stopped, until ``--until``, or, with
``--idle-exit``, until an outage lasts that long: a stream told to end after so long with nothing new ends after
so long without a receiver too) unless its spec gives a budget. Either way a ``Budget`` (tries and seconds of one
outage, derived once from the spec) decides; the last try starts as its seconds end. A session that landed a file,
or stayed connected for ``HEALTHY_S`` without stalling, ends an outage: the next failure starts a new one, from the
shortest backoff with the whole budget.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from fstream_provider.model.retry import RetryPolicy
from transfer_agent.errors import CancelledError, FStreamError, StallError

if TYPE_CHECKING:
    from fstream_provider.model.spec import TransferSpec
    from fstream_provider.model.spec_plain import PlainSpec

T = TypeVar("T")
# a session that failed retryably reconnects after 0.75-1.5 s, doubling up to 7.5-15 s
SESSION_RETRY = RetryPolicy(retryable=lambda exc: isinstance(exc, FStreamError) and exc.retryable
                            and not isinstance(exc, CancelledError), base_s=1.5, cap_s=15.0)
DEFAULT_ATTEMPTS = 5  # tries of one outage for a plain send given no budget (the first included)
HEALTHY_S = 30.0  # connected this long without stalling: the session was up, its failure starts a new outage


@dataclass(frozen=True)
class Budget:
    """What one outage may cost before the transfer gives up (None: no limit).

    :param attempts: tries of the outage, the first included.
    :param seconds: length of the outage; its last try starts as it ends.
    """

    attempts: int | None = None
    seconds: float | None = None

    def delay(self, backoff: float, tries: int, elapsed: float) -> float | None:
        """The wait before the next try (``backoff``, cut to what is left), or None once the budget is used up."""
        if self.attempts is not None and tries >= self.attempts:
            return None
        if self.seconds is None:
            return backoff
        left = self.seconds - elapsed
        return None if left <= 0 else min(backoff, left)


class SessionRetries:
    """Runs a transfer's sessions until one ends, retrying retryable failures within the spec's budget.

    :param spec: the transfer (``max_attempts``, ``retry_for_s``, ``watch``, ``until``).
    :param attempts: tries of one outage when the spec gives no budget (a watch stream then has no limit).
    :param log: where each retry is logged, with its reason and the next delay.
    :param on_event: ``callback("log", {...})`` for each retry (job events, progress).
    :param stop: the transfer's cancel event: ends a wait at once (``CancelledError``).
    :param policy: the backoff (tests may pass a faster one).
    """

    def __init__(self, spec: TransferSpec | PlainSpec, *, attempts: int = DEFAULT_ATTEMPTS, log: logging.Logger | Any,
                 on_event: Callable[[str, dict], None], stop: threading.Event,
                 policy: RetryPolicy = SESSION_RETRY) -> None:
        given = spec.max_attempts is not None or spec.retry_for_s is not None
        self.attempts = spec.max_attempts if given else attempts
        self.retry_for_s = spec.retry_for_s
        self.streaming = spec.watch and not given
        self.until = spec.until
        self.idle_exit_s = spec.idle_exit_s if self.streaming else None
        self.log, self.on_event, self.stop, self.policy = log, on_event, stop, policy
        # derived once: a watch stream retries while it runs, but one told to end after ``--idle-exit`` with nothing
        # new ends after an outage that long too; otherwise (and once its ``--until`` passed) the spec's budget
        self._while_streaming = Budget(seconds=self.idle_exit_s)
        self._bounded = Budget(self.attempts, self.retry_for_s)
        self._connected_at: float | None = None

    def connected(self) -> None:
        """Called by a session once it is connected and running."""
        self._connected_at = time.monotonic()

    def unbounded(self) -> bool:
        """True while failures are retried whatever their number: a watch stream before its ``until``."""
        return self.streaming and (self.until is None or time.time() < self.until)

    def call(self, session: Callable[[], T], landed: Callable[[], int]) -> T:
        """``session()`` until it returns; re-raises a terminal failure, or a retryable one past the budget.

        :param landed: files landed so far (a session that landed one made progress).
        """
        tries, since = 0, 0.0
        while True:
            started, before, self._connected_at = time.monotonic(), landed(), None
            try:
                return session()
            except BaseException as exc:
                if not self.policy.retryable(exc):
                    raise
                if self.stop.is_set():
                    raise CancelledError("transfer cancelled") from None
                now = time.monotonic()
                up = self._connected_at is not None and now - self._connected_at >= HEALTHY_S
                if landed() > before or (up and not isinstance(exc, StallError)):
                    tries = 0  # the session made progress: a new outage
                if tries == 0:  # a new outage starts when this session failed, or when it began if it never connected
                    since = started if self._connected_at is None else now
                tries += 1
                delay = self._delay(tries, now - since)
                if delay is None:
                    exc.args = (f"{exc} (gave up after {tries} {'try' if tries == 1 else 'tries'} over "
                                f"{now - since:.1f} s: {self.budget()})", *exc.args[1:])
                    raise
                self._announce(tries, exc, delay)
                if self.stop.wait(delay):
                    raise CancelledError("transfer cancelled") from None  # cancelled while waiting to reconnect

    def _delay(self, tries: int, elapsed: float) -> float | None:
        """The wait before the next try, or None when the budget is used up."""
        backoff = self.policy.delay(min(tries - 1, 30))  # at the cap long before; 2**1024 would overflow a float
        budget = self._while_streaming if self.unbounded() else self._bounded
        return budget.delay(backoff, tries, elapsed)

    def budget(self) -> str:
        """The budget in words, for logs and the final error."""
        if self.unbounded():
            ends = " or --until" if self.until else ""
            if self.idle_exit_s is not None:
                ends += f" or an outage of --idle-exit ({self.idle_exit_s:g} s)"
            return "a watch stream retries until it is stopped" + ends
        parts = [f"max attempts {self.attempts}"] if self.attempts is not None else []
        if self.retry_for_s is not None:
            parts.append(f"retry for {self.retry_for_s:g} s")
        return ", ".join(parts)

    def _announce(self, tries: int, exc: BaseException, delay: float) -> None:
        if self.unbounded() or self.attempts is None:
            note = f"try {tries}; {self.budget()}"
        else:
            note = f"try {tries} of {self.attempts}" + (f"; retry for {self.retry_for_s:g} s" if self.retry_for_s
                                                         else "")
        self.log.warning("session failed (%s); reconnecting in %.1f s (%s)", exc, delay, note)
        self.on_event("log", {"level": "warning", "message": f"session failed: {exc}; retry {tries}",
                              "delay": round(delay, 3)})
