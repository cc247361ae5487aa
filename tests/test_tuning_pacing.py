"""Token-bucket pacing: a sender that waits what ``reserve`` says moves exactly the rate."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from fstream_provider.tuning.pacing import TokenBucket


def drive(bucket: TokenBucket, block: int, seconds: float, t: float = 0.0) -> tuple[int, float]:
    """A sender that writes blocks as fast as allowed for ``seconds``; returns (bytes, end time)."""
    sent, end = 0, t + seconds
    while t < end:
        t += bucket.reserve(block, t)
        sent += block
    return sent, t


@settings(deadline=None, max_examples=50)
@given(rate=st.floats(1e6, 1e11), block=st.integers(1024, 4 * 2**20))
def test_long_run_rate_matches_the_cap(rate, block):
    b = TokenBucket(rate, now=0.0)
    seconds = 1000 * block * 8 / rate  # about a thousand blocks
    sent, t = drive(b, block, seconds)
    assert sent * 8 / t == pytest.approx(rate, rel=0.01)


def test_unlimited_never_waits_and_rate_changes_apply_at_once():
    b = TokenBucket(None)
    assert b.reserve(10**9, 0.0) == 0.0 and b.rate_bps is None
    b.set_rate(8e6, 0.0)  # 1 MB/s
    sent, t = drive(b, 10_000, 1.0)
    assert sent == pytest.approx(1e6, rel=0.02)
    b.set_rate(16e6, t)
    sent2, t2 = drive(b, 10_000, 1.0, t)
    assert sent2 == pytest.approx(2e6, rel=0.02)


def test_idle_time_is_only_caught_up_to_the_burst():
    b = TokenBucket(8e6, burst_s=0.05, now=0.0)  # burst = 50 kB
    assert b.reserve(50_000, 10.0) == 0.0       # after 10 s idle, only 50 kB are free
    assert b.reserve(10_000, 10.0) == pytest.approx(0.01)
