"""ADAPT's policy service: shared stream pools per (source, destination) (ADAPT final report, §1.2.2, Table I, Fig. 2-3).

A *pool* holds at most ``s_pmax`` streams between one source and one destination, shared by every client
(agent) that moves data on that pair. A client asks for an allocation before it transfers and again
periodically; the **Greedy** policy (Fig. 2) grants ``s_i`` streams on a first request and ``s_u`` more on
each update, never more than ``s_cmax`` to one client nor more than the pool has left; a client that asks
when little is left gets what is left. A client adapts *within* its grant (Fig. 3: ``adapt``).

Pure: ``GreedyPolicy.provision`` is the decision; ``fstream_provider.bus.pools`` applies it atomically in
Redis (a Lua script for Greedy, an optimistic transaction for any other ``PoolPolicy``), with grants as
leases that expire when a client stops renewing them (the report's "future work: ... non-responsive
clients"), so a dead agent's streams return to the pool.

Custom policies: any object with ``name`` and ``provision(current, allocated) -> (streams, reason)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class PoolPolicy(Protocol):
    """A pool policy: how many streams a client holds after a request."""

    name: str

    def provision(self, current: int, allocated: int) -> tuple[int, str]:
        """The client's new grant, given its ``current`` grant and the pool's ``allocated`` total (its own
        grant included), and a reason."""


@dataclass(frozen=True)
class GreedyPolicy:
    """ADAPT's Greedy policy (Table I parameters).

    :param s_pmax: most streams in use between the pair, all clients together.
    :param s_cmax: most streams one client may hold.
    :param s_i: streams granted on a client's first request (if available).
    :param s_u: streams added on each update request (if available).
    """

    s_pmax: int = 128
    s_cmax: int = 32
    s_i: int = 4
    s_u: int = 4
    name: str = "greedy"

    def __post_init__(self) -> None:
        if not (self.s_pmax >= 1 and 1 <= self.s_cmax and self.s_i >= 1 and self.s_u >= 0):
            raise ValueError(f"greedy pool policy: need s_pmax >= 1, s_cmax >= 1, s_i >= 1, s_u >= 0, got {self}")

    def provision(self, current: int, allocated: int) -> tuple[int, str]:
        """Fig. 2, PROVISION(t)."""
        available = min(self.s_cmax - current, self.s_pmax - allocated)
        if available <= 0:
            return current, (f"no streams available (client {current}/{self.s_cmax}, pool "
                             f"{allocated}/{self.s_pmax})")
        if current == 0 and available > self.s_i:
            return self.s_i, f"initial grant s_i={self.s_i}"
        if current > 0 and available > self.s_u:
            return current + self.s_u, f"update +s_u={self.s_u}"
        return current + available, f"the {available} stream(s) left (pool {allocated}/{self.s_pmax})"


def adapt(c: int, delta: int, c_max: int, rate_last: float | None, rate_now: float,
          threshold: float) -> tuple[int, str]:
    """Fig. 3, ADAPT(c, delta, c_max): move the client's concurrency by ``delta`` when its rate changed by
    more than ``threshold`` (bits/s) since the last test, up when it rose, down when it fell, within
    ``c_max`` (the grant converted to concurrency: ``floor(streams / p)``)."""
    if rate_last is None:
        return min(c, c_max), "first measurement"
    change = rate_now - rate_last
    if abs(change) <= threshold:
        return min(c, c_max), f"rate change {change / 1e6:+.0f} Mbit/s within the threshold"
    if change < 0:
        return max(0, min(c, c_max) - delta), f"rate fell {change / 1e6:.0f} Mbit/s: concurrency -{delta}"
    return min(c + delta, c_max), f"rate rose {change / 1e6:+.0f} Mbit/s: concurrency +{delta} (max {c_max})"
