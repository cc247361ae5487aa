"""Token-bucket pacing for ``PacedLayout.rate_bps`` (QoS), pure: the caller passes the clock and does the waiting.

The sender keeps one ``TokenBucket`` per cluster, shared by that cluster's channels; before
writing a block a channel calls ``delay = bucket.reserve(len(block), time.monotonic())`` and
waits ``delay`` seconds (``Event.wait(delay)``, so cancellation stays immediate). Rate changes
apply at once through ``set_rate``. Without pacing, integer streams bound the QoS error: one
stream at 1 Gbit/s / 40 ms / 1 MiB is ~20 % of the link.

A paced block waits until the rate has paid for all of it and then goes at once, so the wire
sees bursts of one block: ``paced_block_size`` keeps a paced block within the bucket's depth
(4 MiB blocks at 100 Mbit/s were 0.34 s bursts, 7 times the 50 ms depth), and ``earned`` counts
the bytes reserved so far as the rate pays for them, so an interval's count can credit a block's
bytes when they were earned rather than all at its release (issue 31).
"""

from __future__ import annotations

BURST_S = 0.05  # bucket depth, in seconds of the rate
PACED_BLOCK_MIN = 64 << 10  # a paced block is a multiple of this, and never smaller


def paced_block_size(block_size: int, rate_bps: float | None, burst_s: float = BURST_S) -> int:
    """The block size a sender paced at ``rate_bps`` should cut files into: at most ``burst_s`` of the rate.

    Rounded down to a multiple of ``PACED_BLOCK_MIN`` (64 KiB) and never below it, never above
    ``block_size``; unpaced (``rate_bps`` None or <= 0) it is ``block_size``. At 100 Mbit/s:
    576 KiB (47 ms) instead of 4 MiB (336 ms); from ~700 Mbit/s on a 4 MiB block is within 50 ms.
    """
    if not rate_bps or rate_bps <= 0:
        return block_size
    granule = int(rate_bps / 8 * burst_s) // PACED_BLOCK_MIN * PACED_BLOCK_MIN
    return min(block_size, max(PACED_BLOCK_MIN, granule))


class TokenBucket:
    """A byte budget refilled at ``rate_bps / 8`` bytes per second, holding at most ``burst`` bytes.

    :param rate_bps: rate in bits/s (None or <= 0: unlimited).
    :param burst_s: bucket depth in seconds of the rate (how far a pause can be caught up).
    :param now: the clock at creation.
    """

    def __init__(self, rate_bps: float | None, *, burst_s: float = BURST_S, now: float = 0.0) -> None:
        self.burst_s = burst_s
        self._rate = 0.0
        self._tokens = 0.0
        self._t = now
        # (bytes of blocks fully paid for, blocks told to wait as (due, nbytes, rate in bytes/s)); replaced
        # whole, never mutated, so that ``earned`` may read it from another thread without the caller's lock
        self._ledger: tuple[int, tuple[tuple[float, int, float], ...]] = (0, ())
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
            self._note(nbytes, now, 0.0)
            return 0.0
        self._refill(now)
        self._tokens -= nbytes
        delay = 0.0 if self._tokens >= 0 else -self._tokens / self._rate
        self._note(nbytes, now, delay)
        return delay

    def _note(self, nbytes: int, now: float, delay: float) -> None:
        done, waiting = self._ledger
        done += sum(n for due, n, _r in waiting if due <= now)
        kept = tuple(w for w in waiting if w[0] > now)
        if delay > 0:
            self._ledger = (done, kept + ((now + delay, nbytes, self._rate),))
        else:
            self._ledger = (done + nbytes, kept)

    def earned(self, now: float) -> int:
        """Bytes reserved so far, each counted as the rate has paid for it by ``now``.

        A block of ``n`` bytes due at ``d`` is paid for during the last ``n / rate`` seconds before
        it goes: ``n - (d - now) * rate`` of it by ``now`` (clamped to 0..n). A block that did not
        have to wait counts whole when reserved. Unlike the bytes sent, which rise by a whole block
        when one goes, this rises smoothly at the rate while the pacer is what limits the sender.
        """
        done, waiting = self._ledger
        return done + round(sum(max(0.0, min(float(n), n - (due - now) * rate)) for due, n, rate in waiting))
