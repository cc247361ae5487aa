"""Online profiling (thesis §3.4, Alg. 2): find the concurrency that keeps throughput near utilisation x bandwidth."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fstream_provider.tuning.common import fmt_bps


def recommended_interval(rtt_s: float, *, floor_s: float = 2.0, rtts: float = 50.0) -> float:
    """Profiling interval long enough that new channels' slow start is a small part of it: max(2 s, 50 RTT).

    A channel needs about two RTTs to connect and ~10 RTTs of slow start to reach a large
    window; judged over a shorter interval, added channels look useless (the thesis uses
    10 s at 38 ms).
    """
    return max(floor_s, rtts * rtt_s)


@dataclass(frozen=True)
class Decision:
    """A controller's answer for the total channel count.

    :param cc: channels to use from now on.
    :param reason: why.
    :param fine: optional fine step for the dominant cluster: +1/-1 on pp (small) or p (large).
    """

    cc: int
    reason: str
    fine: int = 0


class PlateauGuard:
    """Remembers the last channel increase and undoes it when it bought < ``min_gain`` (storage or path limit).

    :param min_gain: relative throughput gain an increase must bring.
    :param forget_after: intervals after which a ceiling is forgotten (conditions change).
    :param enabled: False makes it a no-op (the thesis' algorithms have no such guard).
    """

    def __init__(self, *, min_gain: float = 0.05, forget_after: int = 10, enabled: bool = True) -> None:
        self.enabled = enabled
        self.min_gain = min_gain
        self.forget_after = forget_after
        self._before: tuple[int, float] | None = None
        self.ceiling: int | None = None
        self._age = 0

    def reset(self) -> None:
        self._before, self.ceiling, self._age = None, None, 0

    def check(self, cc: int, thr: float) -> Decision | None:
        """Call once per interval before deciding; returns a revert decision if the last increase failed."""
        if not self.enabled:
            return None
        if self.ceiling is not None:
            self._age += 1
            if self._age > self.forget_after:
                self.ceiling, self._age = None, 0
        before, self._before = self._before, None
        if before is not None and before[0] < cc and thr < before[1] * (1 + self.min_gain):
            self.ceiling, self._age = cc, 0
            return Decision(before[0], f"plateau: cc {before[0]}->{cc} gave {fmt_bps(before[1])}->"
                                       f"{fmt_bps(thr)}, back to cc={before[0]}")
        return None

    def limit(self, cc: int, new: int, thr: float) -> int:
        """Cap an increase below the ceiling and remember the state it started from."""
        if not self.enabled:
            return max(new, 1)
        if self.ceiling is not None:
            new = min(new, self.ceiling - 1)
        if new > cc:
            self._before = (cc, thr)
        return max(new, 1)


class OnlineProfiler:
    """Alg. 2: target = utilisation x bandwidth with a +-band; history first, then per-channel extrapolation.

    :param bandwidth_bps: initial bandwidth estimate (raised when exceeded).
    :param max_cc: upper bound on channels.
    :param utilisation: share of the bandwidth to aim for (thesis default 0.8; we use 0.9).
    :param band: accepted relative distance from the target (thesis 15 %).
    :param guard: undo increases that bought < 5 % (``PlateauGuard``; not in the thesis).
    :param bounded_decrease: lower cc at most by half per round (the thesis lowers it straight to
        ``ceil(desired / per-channel)``: Alg. 2 line 10 bounds only increases).
    """

    def __init__(self, *, bandwidth_bps: float, max_cc: int, utilisation: float = 0.9,
                 band: float = 0.15, guard: bool = True, bounded_decrease: bool = True) -> None:
        self.bandwidth_bps = bandwidth_bps
        self.max_cc = max_cc
        self.utilisation = utilisation
        self.band = band
        self.guard = PlateauGuard(enabled=guard)
        self.bounded_decrease = bounded_decrease

    @property
    def desired_bps(self) -> float:
        return self.utilisation * self.bandwidth_bps

    def step(self, cc: int, thr: float, history_cc: int | None = None, history_note: str = "") -> Decision:
        """One profiling round for an interval at ``cc`` channels that reached ``thr`` bits/s."""
        note = ""
        if thr > self.bandwidth_bps:
            self.bandwidth_bps = thr
            note = f"bandwidth raised to {fmt_bps(thr)}; "
        desired = self.desired_bps
        revert = self.guard.check(cc, thr)
        if revert is not None:
            return Decision(revert.cc, note + revert.reason)
        if abs(thr - desired) <= self.band * desired:
            return Decision(cc, note + f"profiling: {fmt_bps(thr)} within {self.band:.0%} of "
                                       f"{fmt_bps(desired)}, cc={cc} kept")
        if thr < desired:
            if history_cc is not None:
                new = min(history_cc, self.max_cc)
                why = f"history ({history_note}) says cc={history_cc}"
            else:
                per = thr / max(cc, 1)
                required = math.ceil(desired / per) if per > 0 else 2 * cc
                new = min(required, 2 * cc, self.max_cc)
                why = (f"{fmt_bps(thr)} below {fmt_bps(desired)}: {fmt_bps(per)} per channel needs "
                       f"{required}, at most doubling")
            new = self.guard.limit(cc, new, thr)
            if new == cc:
                return Decision(cc, note + why + f"; cc={cc} kept (limit {self.guard.ceiling or self.max_cc})")
            return Decision(new, note + why + f" -> cc={new}")
        per = thr / max(cc, 1)
        new = max(math.ceil(desired / per), cc // 2 if self.bounded_decrease else 1, 1)
        return Decision(new, note + f"{fmt_bps(thr)} above {fmt_bps(desired)}: cc {cc}->{new}")
