"""Token-bucket pacing for ``PacedLayout.rate_bps`` (QoS), pure: the caller passes the clock and does the waiting.

The sender keeps one ``TokenBucket`` per cluster, shared by that cluster's channels; before
writing a block a channel calls ``delay = bucket.reserve(len(block), time.monotonic())`` and
waits ``delay`` seconds (``Event.wait(delay)``, so cancellation stays immediate). Rate changes
apply at once through ``set_rate``. Without pacing, integer streams bound the QoS error: one
stream at 1 Gbit/s / 40 ms / 1 MiB is ~20 % of the link.
"""

from __future__ import annotations


class TokenBucket:
    """A byte budget refilled at ``rate_bps / 8`` bytes per second, holding at most ``burst`` bytes.

    :param rate_bps: rate in bits/s (None or <= 0: unlimited).
    :param burst_s: bucket depth in seconds of the rate (how far a pause can be caught up).
    :param now: the clock at creation.
    """

    def __init__(self, rate_bps: float | None, *, burst_s: float = 0.05, now: float = 0.0) -> None:
        self.burst_s = burst_s
        self._rate = 0.0
        self._tokens = 0.0
        self._t = now
        self.set_rate(rate_bps, now)

    @property
    def rate_bps(self) -> float | None:
        return self._rate * 8 if self._rate > 0 else None

    def set_rate(self, rate_bps: float | None, now: float) -> None:
        """Change the rate (keeps the tokens earned so far, capped to the new burst)."""
        self._refill(now)
        self._rate = (rate_bps or 0.0) / 8.0 if rate_bps and rate_bps > 0 else 0.0
        self._tokens = min(self._tokens, self._burst())

    def _burst(self) -> float:
        return self._rate * self.burst_s

    def _refill(self, now: float) -> None:
        if self._rate > 0 and now > self._t:
            self._tokens = min(self._burst(), self._tokens + (now - self._t) * self._rate)
        self._t = max(self._t, now)

    def reserve(self, nbytes: int, now: float) -> float:
        """Take ``nbytes`` (possibly into debt) and return how long to wait before sending them."""
        if self._rate <= 0:
            return 0.0
        self._refill(now)
        self._tokens -= nbytes
        return 0.0 if self._tokens >= 0 else -self._tokens / self._rate
