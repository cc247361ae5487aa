"""QoS throughput controller (thesis §3.6, Alg. 3); the per-channel-rate jump, pacing and the plateau guard are ours.

Alg. 3 ladder on the relative error e = |thr - target| / target: e > 50 % doubles/halves
cc, 20-50 % moves it by 2, 10-20 % by 1, 5-10 % moves pp (small files) or p (large files)
by one, inside 5 % holds. Our addition: when e > 10 % the controller first *jumps* to the
channel count the measured per-channel rate says is needed (at least one channel, at most
doubling/halving, like the ladder's largest step), so it lands in one or two intervals
instead of walking. With ``pacing`` the layouts also carry the target
as a rate cap (``PacedLayout.rate_bps``), which removes the integer-stream granularity
that otherwise bounds the error (one stream at 1 Gbit/s / 40 ms / 1 MiB is 20 % of the link).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fstream_provider.tuning.base import ClusterLayout
from fstream_provider.tuning.common import fmt_bps
from fstream_provider.tuning.profiler import Decision, PlateauGuard


@dataclass(frozen=True)
class PacedLayout(ClusterLayout):
    """A ``ClusterLayout`` with a rate cap for the whole cluster (bits/s); senders that cannot pace ignore it.

    :param rate_bps: total rate the cluster's channels together should not exceed (None: no cap).
    """

    rate_bps: float | None = None


def ladder(cc: int, thr: float, target: float) -> tuple[int, int, str]:
    """Alg. 3 exactly: return (new cc, fine step, band label)."""
    diff = abs(thr - target)
    up = thr < target
    if diff > 0.5 * target:
        return (cc * 2 if up else max(1, cc // 2)), 0, ">50%"
    if diff > 0.2 * target:
        return (cc + 2 if up else max(1, cc - 2)), 0, "20-50%"
    if diff > 0.1 * target:
        return (cc + 1 if up else max(1, cc - 1)), 0, "10-20%"
    if diff > 0.05 * target:
        return cc, (1 if up else -1), "5-10%"
    return cc, 0, "<5%"


class QosController:
    """Alg. 3 plus the per-channel jump.

    :param target_bps: the throughput to hold.
    :param max_cc: upper bound on channels.
    :param jump: use the measured per-channel rate to jump (False: the plain ladder).
    :param headroom: with pacing, aim the unpaced capacity this much above the target.
    :param guard: undo increases that bought < 5 % (not in the thesis' Alg. 3).
    """

    def __init__(self, *, target_bps: float, max_cc: int, jump: bool = True, headroom: float = 0.0,
                 guard: bool = True) -> None:
        if target_bps <= 0:
            raise ValueError(f"QoS target must be > 0 bits/s, got {target_bps}")
        self.target_bps = target_bps
        self.max_cc = max_cc
        self.jump = jump
        self.headroom = headroom
        self.guard = PlateauGuard(enabled=guard)

    def step(self, cc: int, thr: float) -> Decision:
        target = self.target_bps
        err = (thr - target) / target
        revert = self.guard.check(cc, thr)
        if revert is not None:
            return Decision(revert.cc, "qos " + revert.reason)
        new, fine, band = ladder(cc, thr, target)
        head = f"qos: {fmt_bps(thr)} vs target {fmt_bps(target)} ({err:+.0%}, band {band})"
        if band == "<5%":
            return Decision(cc, head + f": hold cc={cc}")
        if fine:
            return Decision(cc, head + (": one more" if fine > 0 else ": one less") + " pp/p step", fine)
        if self.jump and thr > 0:
            per = thr / max(cc, 1)
            aim = target * (1 + self.headroom) if thr < target else target
            want = math.ceil(aim / per) if thr < target else max(1, math.floor(aim / per))
            if thr < target:
                new = min(max(want, cc + 1), 2 * cc)
            else:
                new = max(min(want, cc - 1), cc // 2, 1)
            head += f", {fmt_bps(per)} per channel"
        new = min(max(new, 1), self.max_cc)
        if new > cc:
            new = self.guard.limit(cc, new, thr)
        if new == cc:
            return Decision(cc, head + f": cc={cc} kept (limit)", 1 if thr < target else -1)
        return Decision(new, head + f": cc {cc}->{new}")
