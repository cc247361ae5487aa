"""Deadlines that steer (issue 27): a deadline becomes a QoS target recomputed as bytes land and files arrive.

FStream's QoS mode (thesis §3.6, Alg. 3; ``qos.QosController``) holds a throughput target the user
names. A deadline names a time instead, and the target it implies changes as the transfer runs:

    target = remaining bytes / (time left - margin x span - remaining files x per-file cost) x 1.05

recomputed at every observation, so a transfer ahead of schedule slows down and uses no more of a
shared path than the deadline needs, and one that falls behind (competing traffic, new files of a
stream) speeds up. ``Deadline(tuner, ...)`` wraps a tuner that can move its target (``set_target``:
``fstream.FStreamTuner``) the way ``granted.Granted`` wraps one for a pool.

It starts with a *probe*: for the first ``probe_s`` seconds no target is set, so the tuner fills
the path and the best rate the path gives is measured (with ``--bandwidth`` it is known before a
byte moves: no probe). The stream budget assumes a stream gives 0.65 of its window over the RTT (what a
Linux stream keeps in flight; started from the whole window, the budget held transfers below their target
on the emulated WAN until they fell behind: 4 of 10 runs at 1.2-1.5x missed, ``bench deadline wan``), or
what the probe measured per stream if more (never above the whole window). From then on:

- ``on-track``: the steered target is reachable (at most the best rate seen, or the path's bandwidth);
- ``at-risk``: the ETA's upper bound at the current rate passes the deadline; the target rises;
- ``infeasible``: even at the best rate the remaining bytes cannot land in the time left (the
  ETA's upper bound at that rate passes the deadline): said once, early, with the shortfall, and the
  target is lifted (fill the path: the best that can be done); ``on_risk="fail"`` lets the driver stop;
- ``met`` / ``missed``: nothing left before / after the deadline.

How the target is held (``steer``, issue 44). A stream gives at most its window over the RTT, so the
stream-seconds a transfer holds are least when each stream runs at the rate it gives: ``streams`` (the
default) opens the fewest streams the target needs (``budget``: the target over one stream's rate) and does
not pace them; the tuner fills the path and its layout is cut, or widened (``grow_streams``), to the budget.
A stream's rate is learned from the intervals the budget ran (``_learn_stream_rate``). Only a stream that
alone outruns the need (a short path: loopback) is paced at the target. ``target`` is issue 27's rule, kept
for the ablation: the tuner's QoS controller holds the target by pacing every cluster's channels, and the
budget only bounds them; in the simulator calibrated to the emulated WAN it held 1.1-1.3x the streams of the
fewest-stream fixed setting and missed 2 of 18 deadlines (``bench deadline sim``).

Every change of state or target carries a reason for the logs. Pure (no I/O, no clock): times are
the observations' ``t`` (seconds since the transfer started) and the deadline is on that scale.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import math

from fstream_provider.tuning.base import FileInfo, Observation, Suggestion, Tuner
from fstream_provider.tuning.common import fmt_bps, fmt_size
from fstream_provider.tuning.eta import Eta, EtaEstimator
from fstream_provider.tuning.granted import fit_streams

MARGIN = 0.10  # aim to land this share of the deadline's span early
BAND = 0.05  # and this much above the rate that needs: the QoS controller holds within 5 %
MIN_TARGET_BPS = 1e5
RISK_STATES = ("at-risk", "infeasible")
WINDOW_SHARE = 0.65  # of its window a Linux TCP stream keeps in flight (measured on the emulated WAN, sim.py)
PP_WHEN_CUT = 8  # pipelining depth of channels cut to the deadline's stream budget
PATH_LIMITED = 0.9  # of the best rate: above it the path, not the streams, set the rate (nothing to learn)
STEERS = ("streams", "target")


@dataclass(frozen=True)
class DeadlineStatus:
    """Where a transfer stands against its deadline.

    :param state: on-track, at-risk, infeasible, met, missed (``probing`` during the probe).
    :param target_bps: the target now in force (None: fill the path).
    :param need_bps: the rate the deadline needs from now on, without margin.
    :param best_bps: the best rate the path is known to give.
    :param time_left_s: seconds until the deadline.
    :param message: why, in words (the reason that reaches the logs).
    """

    state: str
    target_bps: float | None
    need_bps: float
    best_bps: float
    time_left_s: float
    message: str

    def as_dict(self) -> dict:
        return {"state": self.state, "target_bps": self.target_bps, "need_bps": round(self.need_bps, 1),
                "best_bps": round(self.best_bps, 1), "time_left_s": round(self.time_left_s, 3),
                "message": self.message}


def plan(*, t: float, deadline_t: float, remaining_bytes: float, remaining_files: float, best_bps: float,
         eta: Eta | None, margin: float = MARGIN) -> DeadlineStatus:
    """The target and state at time ``t`` (pure: the rule above, for one moment)."""
    left = deadline_t - t
    if remaining_bytes <= 0 and remaining_files <= 0:
        return DeadlineStatus("met" if left >= 0 else "missed", None, 0.0, best_bps, left,
                              "everything landed " + (f"{left:.1f} s before the deadline" if left >= 0
                                                      else f"{-left:.1f} s after the deadline"))
    if left <= 0:
        return DeadlineStatus("missed", None, float("inf"), best_bps, left,
                              f"deadline passed {-left:.1f} s ago with {fmt_size(remaining_bytes)} left: "
                              "filling the path")
    per_file = eta.per_file_s if eta is not None else 0.0
    # aim ``margin`` of the whole span early: recomputing "what is left over the time left" at every step
    # otherwise lands exactly on the deadline, and any last-interval shortfall misses it
    usable = max(left - margin * deadline_t - remaining_files * per_file, 1e-3)
    need = remaining_bytes * 8 / usable
    # infeasible is said on the point estimate at the best rate: the ETA's spread early in a transfer is its
    # ramp-up (3 intervals at 0.35, 0.89 and 1.0 Gbit/s on the WAN gave "53 s late" at a deadline of twice the
    # minimum, which then filled the path for nothing); the uncertainty is what "at-risk" is for
    at_best = remaining_bytes * 8 / best_bps + remaining_files * per_file if best_bps > 0 else float("inf")
    if at_best > left:
        return DeadlineStatus("infeasible", None, need, best_bps, left,
                              f"needs {fmt_bps(need)} for {left:.0f} s but the path's best is {fmt_bps(best_bps)}: "
                              f"about {at_best - left:.0f} s late even at full rate; filling the path")
    target = min(max(need * (1 + BAND), MIN_TARGET_BPS), best_bps)
    behind = eta is not None and eta.hi > left
    state = "at-risk" if behind else "on-track"
    what = (f"ETA up to {eta.hi:.0f} s at {fmt_bps(eta.rate_bps)} passes it: " if behind and eta else "")
    return DeadlineStatus(state, target, need, best_bps, left,
                          f"deadline in {left:.0f} s, {fmt_size(remaining_bytes)} left: {what}"
                          f"target {fmt_bps(target)} (to land {margin * deadline_t:.0f} s early)")


class Deadline:
    """``tuner`` steered to land everything by ``deadline_t`` (seconds on the observations' clock).

    :param tuner: a tuner with ``set_target(bps | None)`` (``fstream``).
    :param deadline_t: the deadline, in seconds since the transfer started.
    :param bandwidth_bps: the path's known bandwidth (None: measured during the probe).
    :param probe_s: seconds without a target at the start (measuring the best rate and a stream's); 0 with a
        bandwidth.
    :param margin: the share of the deadline's span (from the start) to land early.
    :param eta: the ETA it plans with, fed by whoever gives it (the sender's interval records: one estimator and
        one fit per interval serve the live ETA and the deadline); None: its own, fed by the observations.
    :param steer: "streams" (default): the fewest streams the target needs, unpaced, their rate learned while
        they run; "target" (issue 27's rule, kept for the ablation): the tuner holds the target by pacing.
    """

    def __init__(self, tuner: Tuner, deadline_t: float, *, bandwidth_bps: float | None = None,
                 probe_s: float = 5.0, margin: float = MARGIN, eta: EtaEstimator | None = None,
                 steer: str = "streams") -> None:
        if not hasattr(tuner, "set_target"):
            raise ValueError(f"tuner {getattr(tuner, 'name', tuner)!r} cannot hold a target: a deadline needs one "
                             "that can (fstream)")
        if steer not in STEERS:
            raise ValueError(f"deadline steer {steer!r}: one of {', '.join(STEERS)}")
        self.tuner, self.deadline_t, self.margin, self.steer = tuner, float(deadline_t), margin, steer
        self._learned: float | None = None  # the measured rate of a stream under the budget (streams steering)
        self._last_layouts: tuple = ()
        self.name = getattr(tuner, "name", "tuner")
        self.bandwidth_bps = bandwidth_bps
        self.probe_s = 0.0 if bandwidth_bps else float(probe_s)
        # its own estimator (the simulator) takes the path rate it was told as the floor, as the sender's does
        self.eta, self._feeds_eta = (eta, False) if eta is not None else (EtaEstimator(link_bps=bandwidth_bps), True)
        self.known_bytes = 0.0
        self.moved_bytes = 0.0
        self.best_seen_bps = 0.0
        self.status: DeadlineStatus | None = None
        path = getattr(tuner, "path", None)  # one stream's ceiling: its window over the RTT
        self.window_bps = path.tcp_buffer * 8 / path.rtt_s if path is not None and path.rtt_s > 0 else 150e6
        self.per_stream_bps = WINDOW_SHARE * self.window_bps  # the first guess; the probe and falling behind refine it
        self.budget: int | None = None  # streams the target needs (None: no bound)
        self.probe_per_stream = 0.0
        self.changes: list[tuple[float, DeadlineStatus]] = []  # (t, status) whenever the state changed
        self._note = ""

    def __getattr__(self, item: str):  # observe_every_s, decisions, history...: the wrapped tuner's
        return getattr(self.tuner, item)

    def cluster_of(self, file: FileInfo) -> str:
        return self.tuner.cluster_of(file)

    @property
    def deadline_status(self) -> DeadlineStatus | None:
        """The status after the last observation (what the sender reports); None before the first."""
        return self.status

    def best_bps(self) -> float:
        return max(self.bandwidth_bps or 0.0, self.best_seen_bps)

    def update(self, observation: Observation) -> None:
        obs = observation
        self.known_bytes += sum(f.size for f in obs.new_files)
        self.moved_bytes += obs.bytes
        pending = sum(st.pending_files for st in obs.clusters.values())
        if obs.dt > 0:
            streams = sum(l.cc * l.p for l in obs.layouts)
            if obs.t <= self.probe_s + obs.dt and obs.throughput_bps > self.best_seen_bps and streams:
                self.probe_per_stream = obs.throughput_bps / streams  # what a stream gave at the best rate
            self.best_seen_bps = max(self.best_seen_bps, obs.throughput_bps)
            if self._feeds_eta:
                self.eta.add(obs.t, obs.dt, obs.bytes, busy=obs.bytes > 0 or pending > 0,
                             streams=sum(l.cc * l.p for l in obs.layouts) or None)
        self.tuner.update(obs)
        self._note = ""
        remaining = max(0.0, self.known_bytes - self.moved_bytes)
        files_left = pending  # not yet started; those in flight are in ``remaining`` bytes
        if obs.t < self.probe_s and remaining > 0:
            self.status = DeadlineStatus("probing", None, 0.0, self.best_bps(), self.deadline_t - obs.t,
                                         f"measuring the path's best rate for {self.probe_s:.0f} s before steering")
            self._set(None, obs.t)
            return
        if self.probe_per_stream:  # a probe that filled the path shares it: a stream's rate then is a floor
            self.per_stream_bps = min(self.window_bps, max(self.per_stream_bps, self.probe_per_stream))
            self.probe_per_stream = 0.0
        self._learn_streams(obs)
        st = plan(t=obs.t, deadline_t=self.deadline_t, remaining_bytes=remaining, remaining_files=files_left,
                  best_bps=self.best_bps() or float("inf"), eta=self.eta.estimate(remaining, files_left),
                  margin=self.margin)
        self.status = st
        self._set(st.target_bps, obs.t)

    def _learn_streams(self, obs: Observation) -> None:
        if self.steer == "streams":
            self._learn_stream_rate(obs)
            return
        self._learn_when_behind(obs)

    def _learn_stream_rate(self, obs: Observation) -> None:
        """Streams steering: a stream's rate is what the streams under the budget really gave, unpaced, over an
        interval that ran the same layout as the one before (the first seconds of a layout are its connections'
        slow start: 28 Mbit/s a stream where 136 followed, in the calibrated simulator) while files were queued
        for every channel. Below ``PATH_LIMITED`` of the best rate that is the rate (averaged over the last two
        such intervals: small files give a stream less than its window, a round trip per file, and the budget
        grows to what the target needs); above it the path was the limit and the rate is a floor."""
        streams = sum(l.cc * l.p for l in obs.layouts)
        pending = sum(st.pending_files for st in obs.clusters.values())
        channels = sum(l.cc for l in obs.layouts)
        steady, self._last_layouts = tuple(obs.layouts) == self._last_layouts, tuple(obs.layouts)
        if (self.budget is None or not steady or obs.dt <= 0 or not streams or streams > self.budget
                or pending < channels or obs.throughput_bps <= 0):
            return
        x = obs.throughput_bps / streams
        if obs.throughput_bps >= PATH_LIMITED * self.best_bps():
            self.per_stream_bps = min(self.window_bps, max(self.per_stream_bps, x))
            return
        self._learned = x if self._learned is None else (self._learned + x) / 2
        self.per_stream_bps = min(self.window_bps, self._learned)

    def _learn_when_behind(self, obs: Observation) -> None:
        """Target steering: the budget starts from one stream's ceiling (its window over the RTT) and grows only when
        that falls short: behind schedule (at risk) and held below the target at the budget, what a stream really
        gives is measured and the budget grows to what the target needs. Learning from every interval below
        target instead (small files limited by per-file round trips, not by streams) doubled the streams held
        for no gain (``bench deadline``)."""
        if self.status is None or self.status.state != "at-risk":
            return
        streams = sum(l.cc * l.p for l in obs.layouts)
        target = getattr(self.tuner, "target", None)
        pending = sum(st.pending_files for st in obs.clusters.values())
        channels = sum(l.cc for l in obs.layouts)
        if (self.budget is not None and target and obs.dt > 0 and streams >= self.budget and pending >= channels
                and 0 < obs.throughput_bps < 0.95 * target):
            self.per_stream_bps = obs.throughput_bps / streams

    def _set(self, target: float | None, t: float) -> None:
        st = self.status
        last = self.changes[-1][1] if self.changes else None
        if last is None or last.state != st.state:
            self.changes.append((t, st))
            self._note = f"deadline {st.state}: {st.message}"
        self.budget = (None if target is None
                       else max(1, math.ceil(target * (1 + BAND) / max(self.per_stream_bps, 1.0))))
        if self.steer == "streams" and self.budget != 1:
            # the streams the target needs, each at the rate it gives: pacing them below it would hold them open
            # longer for the same bytes (stream-seconds); only a stream that alone outruns the need is paced
            target = None
        old = getattr(self.tuner, "target", None)
        if target != old and (target is None or old is None or abs(target - old) > 0.05 * old):
            self.tuner.set_target(target)  # small moves are left to the controller's band
            self._note = self._note or f"deadline {st.state}: {st.message}"

    def suggest(self) -> Suggestion:
        s = self.tuner.suggest()
        note, self._note = self._note, ""
        if self.budget is not None:  # no more streams than the target needs: pacing alone would keep them all
            layouts, cut = fit_streams(s.layouts, self.budget, what="deadline needs")
            if self.steer == "streams":  # the cut rounds every cluster down: the streams left over are used
                layouts, grew = grow_streams(layouts, self.budget, self.tuner.path.max_cc)
                cut = f"{cut}, then {grew}" if cut and grew else cut or grew
            if cut:  # fewer streams: pipeline deeper so each keeps busy between files (free in streams)
                layouts = tuple(replace(l, pp=max(l.pp, PP_WHEN_CUT)) for l in layouts)
            if layouts != s.layouts:
                s = replace(s, layouts=layouts, changed=True)
                note = f"{note}; {cut}" if note else ""
        if not note:
            return s
        return replace(s, reason=f"{s.reason}; {note}" if s.reason else note, changed=True)


def grow_streams(layouts: tuple, budget: int, max_cc: int) -> tuple[tuple, str]:
    """``layouts`` widened to the ``budget`` streams the deadline needs, and what grew ("" if nothing): every
    cluster's channels scaled alike (its p kept: the heuristic's per-file choice), then one channel more at a
    time to the narrowest cluster that has room (else the one of fewest streams a channel) until the budget is
    reached; when the last channel passes it, that cluster's p is lowered to land on it. A cut rounds down: one
    channel of p=5 under a budget of 8 held a deadline at 682 Mbit/s for 130 s and missed it (sra in the
    calibrated simulator at 1.2x). A tuner that profiles under a budget learns that more channels buy nothing
    (they were cut) and settles on one a cluster: 9 streams at 600 Mbit/s while the deadline needed 13 at
    67 Mbit/s each (w1 at 1.5x)."""
    streams = sum(l.cc * l.p for l in layouts)
    if not layouts or streams <= 0 or streams >= budget:
        return layouts, ""
    out = [replace(l, cc=min(max_cc, max(l.cc, math.floor(l.cc * budget / streams)))) if l.cc else l
           for l in layouts]
    i = None
    while sum(l.cc * l.p for l in out) < budget:  # short of it the target is missed: up to one channel over
        room = budget - sum(l.cc * l.p for l in out)
        open_ = [k for k, l in enumerate(out) if l.cc and l.cc < max_cc]
        if not open_:
            break
        fits = [k for k in open_ if out[k].p <= room]
        i = (min(fits, key=lambda k: (out[k].cc * out[k].p, out[k].cluster)) if fits
             else min(open_, key=lambda k: (out[k].p, out[k].cluster)))
        out[i] = replace(out[i], cc=out[i].cc + 1)
    over = sum(l.cc * l.p for l in out) - budget
    if i is not None and over > 0:  # the last channel passed it: its cluster's streams spread to land on it
        c = out[i]
        out[i] = replace(c, p=max(1, min(c.p, math.ceil((c.cc * c.p - over) / c.cc))))
    grew = ", ".join(f"{a.cluster} cc={a.cc} p={a.p} -> cc={b.cc} p={b.p}" for a, b in zip(layouts, out) if a != b)
    return tuple(out), (f"deadline needs {budget} stream(s): {grew}" if grew else "")
