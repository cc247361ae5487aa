"""The one retry policy (fstream_provider.model.retry): predicate, backoff with jitter and cap, limits, stop event."""

from __future__ import annotations

import random
import threading
import time

import pytest

from fstream_provider.model.retry import RetryPolicy


class Flaky:
    """Fails ``failures`` times with ``exc``, then returns ``"ok"``."""

    def __init__(self, failures: int, exc: Exception) -> None:
        self.failures, self.exc, self.calls = failures, exc, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc
        return "ok"


def test_retries_a_retryable_failure_with_growing_jittered_waits():
    fn, seen = Flaky(3, OSError("reset")), []
    policy = RetryPolicy(base_s=0.001, cap_s=0.002, attempts=5)
    assert policy.call(fn, on_retry=lambda n, exc, delay: seen.append((n, delay))) == "ok"
    assert fn.calls == 4 and [n for n, _ in seen] == [1, 2, 3]
    assert 0.0005 <= seen[0][1] <= 0.001 and all(d <= 0.002 for _, d in seen)


def test_a_terminal_failure_is_raised_at_once():
    fn = Flaky(3, ValueError("bad spec"))
    with pytest.raises(ValueError, match="bad spec"):
        RetryPolicy(retryable=lambda exc: isinstance(exc, OSError), base_s=0.001).call(fn)
    assert fn.calls == 1


def test_gives_up_after_its_attempts_with_the_last_failure_and_counts_every_one():
    fn, failed = Flaky(10, OSError("down")), []
    with pytest.raises(OSError, match="down"):
        RetryPolicy(base_s=0.001, attempts=3).call(fn, on_failure=lambda n, exc: failed.append(n))
    assert fn.calls == 3 and failed == [1, 2, 3]


def test_gives_up_at_its_deadline():
    fn = Flaky(10**6, OSError("down"))
    t0 = time.monotonic()
    with pytest.raises(OSError):
        RetryPolicy(base_s=0.01, cap_s=0.02, deadline_s=0.2).call(fn)
    assert 0.2 <= time.monotonic() - t0 < 5 and fn.calls > 2


def test_a_stop_event_ends_a_long_wait_at_once_and_nothing_is_tried_again():
    fn, stop = Flaky(10, OSError("down")), threading.Event()
    timer = threading.Timer(0.1, stop.set)
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(OSError, match="down"):
        RetryPolicy(base_s=60.0, cap_s=60.0).call(fn, stop=stop)
    assert time.monotonic() - t0 < 5 and fn.calls == 1
    with pytest.raises(OSError):  # already set: no wait, no second try
        RetryPolicy(base_s=60.0).call(Flaky(1, OSError("down")), stop=stop)


def test_delay_is_exponential_with_jitter_and_cap_and_pause_waits_on_the_event():
    policy, rng = RetryPolicy(base_s=1.0, cap_s=10.0), random.Random(7)
    for i in range(8):
        full = min(10.0, 2.0 ** i)
        assert full * 0.5 <= policy.delay(i, rng) <= full
    stop = threading.Event()
    stop.set()
    assert policy.pause(5, stop)


def test_delay_after_very_many_retries_stays_at_the_cap():
    """Regression (issue 30): ``2 ** 1024`` overflowed a float, so a stream retrying for ever crashed at try 1024."""
    import random

    from fstream_provider.model.retry import RetryPolicy

    policy = RetryPolicy(base_s=1.0, cap_s=30.0)
    delays = [policy.delay(n, random.Random(n)) for n in (1023, 1024, 5000, 10**6)]
    assert all(15.0 <= d <= 30.0 for d in delays), delays
