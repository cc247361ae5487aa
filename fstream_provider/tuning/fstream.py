"""The ``fstream`` tuner (thesis ch. 3): dynamic heuristic + online profiling (Alg. 2) + history (§3.5) + QoS (Alg. 3).

Per cluster p and pp come from the heuristic, re-run whenever a cluster receives files; the
total channel count is what profiling (no target) or the QoS controller (with a target)
decides, split between clusters by estimated time to drain (pending bytes / per-channel
rate). ``variant`` says which of our departures from the thesis are on (``variants.SWITCHES``:
history at the start, short intervals, p = 0.9, the plateau guard, bounded decreases, skipping
starved intervals, the QoS jump and pacing); ``variants.THESIS`` runs Alg. 1-3 as written.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from fstream_provider.tuning.base import ClusterLayout, Observation, PathInfo, Suggestion
from fstream_provider.tuning.clustering import SMALL, Cluster
from fstream_provider.tuning.common import ClusteredTuner, describe, fmt_bps, fmt_size
from fstream_provider.tuning.heuristic import Settings, StartLayout, clamp
from fstream_provider.tuning.profile_history import ProfileHistory, ProfileRecord
from fstream_provider.tuning.profiler import OnlineProfiler
from fstream_provider.tuning.qos import PacedLayout, QosController
from fstream_provider.tuning.tails import apply_floors, tail_floors
from fstream_provider.tuning.variants import DEFAULT, FStreamVariant


SEED_WAIT_S = 5.0  # profiling waits this long at most for HARP's start while the history loads


def split_cc(total: int, weights: dict[str, float], max_cc: int) -> dict[str, int]:
    """Split ``total`` (<= max_cc) channels between clusters by weight, one each if possible (largest remainder)."""
    names = sorted(weights)
    total = min(max(total, len(names)), max_cc)
    if total < len(names):
        # more clusters than channels allowed: the heaviest wait least, the others get 0 for now
        heavy = sorted(names, key=lambda n: (-weights[n], n))[:total]
        return {n: int(n in heavy) for n in names}
    if not sum(weights.values()):
        weights = {n: 1.0 for n in names}
    wsum = sum(weights.values())
    out = {n: 1 for n in names}
    rest = total - len(names)
    if rest <= 0:
        return out
    raw = {n: rest * weights[n] / wsum for n in names}
    for n in names:
        out[n] += int(raw[n])
    left = total - sum(out.values())
    for n in sorted(names, key=lambda n: -(raw[n] - int(raw[n])))[:left]:
        out[n] += 1
    return out


class FStreamTuner(ClusteredTuner):
    """Dynamic tuning with online profiling, profiling history and optional QoS.

    :param path: the path description (bandwidth is only an initial estimate).
    :param start: the user's starting point: total channels (``cc``, instead of the heuristic's
        or the history's) and ``p``/``pp`` of the initial dataset's clusters; profiling, QoS and
        later arrivals move on from there. Values left None come from the heuristic.
    :param target_throughput_bps: hold this throughput (QoS, Alg. 3) instead of filling the path.
    :param history: profiling history to consult and to append to (None: no history).
    :param variant: the thesis' algorithms and which of our departures are on, with p, the band and
        the decision interval (``variants.DEFAULT``; ``variants.THESIS`` for Alg. 1-3 as written).
        The tuner decides only on measurements at least one interval long (observations that come
        sooner, e.g. on file arrivals, are accumulated); ``observe_every_s`` tells the driver.
    :param profiling: False turns the tuner into ``dynamic`` (for breakdowns).
    :param start_time: wall-clock seconds of the start, for history timestamps.
    :param seed: where the initial dataset's clusters start instead of the heuristic:
        ``seed(cluster) -> (Settings, reason)`` or None (``harp_start.harp_start``: HARP's prediction from the
        transfer history); online profiling continues from there.
    """

    name = "fstream"

    def __init__(self, *, path: PathInfo, start: StartLayout | None = None,
                 target_throughput_bps: float | None = None, history: ProfileHistory | None = None,
                 variant: FStreamVariant = DEFAULT, profiling: bool = True, start_time: float = 0.0,
                 seed: Callable[[Cluster], tuple[Settings, str] | None] | None = None) -> None:
        super().__init__(path=path)
        self.start = start or StartLayout()
        self.target = target_throughput_bps
        self.history = history
        self.variant = variant
        self.pacing = variant.on("pacing")
        self.profiling = profiling
        self.start_time = start_time
        self.seed = seed
        self._seeded = False
        self._decided = False  # profiling or QoS moved the layout: a late HARP start no longer applies
        guard = variant.on("plateau-guard")
        self._profiler = OnlineProfiler(bandwidth_bps=path.bandwidth_bps, max_cc=path.max_cc,
                                        utilisation=variant.p, band=variant.band, guard=guard,
                                        bounded_decrease=variant.on("bounded-decrease"))
        self._qos = (QosController(target_bps=target_throughput_bps, max_cc=path.max_cc, jump=variant.on("jump"),
                                   headroom=0.1 if self.pacing else 0.0, guard=guard)
                     if target_throughput_bps else None)
        self._total: int | None = None
        self._names: tuple[str, ...] = ()
        self._history_checked = False
        self._fine: dict[str, tuple[int, int]] = {}  # cluster -> (dp, dpp)
        self._per_channel: dict[str, float] = {}
        self._over = 0  # intervals above target although paced (sender ignores rate_bps)
        self.min_window_s = variant.interval_for(path.rtt_s)
        self.observe_every_s = self.min_window_s  # the sender consults the tuner at least this often
        self._acc_bytes, self._acc_dt, self._acc_starved = 0, 0.0, False
        self._rate = path.bandwidth_bps * variant.p  # the aggregate rate last measured (the tails' time left)
        self._tail_note = ""

    # -- helpers ------------------------------------------------------------------------
    def _dominant(self, clusters: list[Cluster]) -> Cluster:
        return max(clusters, key=lambda c: (c.bytes, c.name))

    def _history_cc(self, c: Cluster, desired: float) -> tuple[int | None, str, ProfileRecord | None]:
        if self.history is None:
            return None, "", None
        ftype = c.ftype if self.variant.on("history-ftype") else None
        rec, how = self.history.lookup(c.avg_size, c.name, desired, ftype=ftype)
        if rec is None:
            return None, "", None
        cc = rec.cc
        if 0 < rec.throughput_bps < desired:  # extrapolate like Alg. 2, at most doubling
            cc = min(self.path.max_cc, math.ceil(rec.cc * desired / rec.throughput_bps), 2 * rec.cc)
        return cc, (f"by {how}: {rec.kind or '?'} files avg {fmt_size(rec.avg_size)}/{rec.ftype or '-'}: cc={rec.cc} "
                    f"gave {fmt_bps(rec.throughput_bps)}"), rec

    def _per_channel_bps(self, name: str) -> float:
        """A cluster's measured rate per channel, else the bandwidth over its channels."""
        per = self._per_channel.get(name)
        if not per:
            s = self._settings.get(name)
            per = self.path.bandwidth_bps / max(1, s.cc if s else 2)
        return per

    def _weights(self, clusters: list[Cluster]) -> dict[str, float]:
        """Estimated time to drain each cluster's pending files; a cluster with none pending only finishes its
        files in flight (weight 0: one channel), else its stale per-channel rate would draw every channel to it."""
        out = {}
        for c in clusters:
            if c.files <= 0:
                out[c.name] = 0.0
                continue
            out[c.name] = max(c.bytes, 1) / max(self._per_channel_bps(c.name), 1e3)
        return out

    def _layouts(self) -> tuple[ClusterLayout, ...]:
        clusters = self._clusters_with_settings()
        if not clusters:
            return ()
        total = self._total or sum(self._settings[c.name].cc for c in clusters)
        weights = self._weights(clusters)
        prev = {l.cluster: l.cc for l in self._last or ()}
        if not any(weights.values()) and all(c.name in prev for c in clusters):
            # nothing queued anywhere: every file left is in flight on its channel, and a new split would only
            # open channels with nothing to carry (16 + 16 of 32, a p=5 channel's 5 handshakes each, while the
            # last files land: 7 s of a 14 s transfer on the WAN, issue 44)
            cc = {c.name: prev[c.name] for c in clusters}
        else:
            cc = split_cc(total, weights, self.path.max_cc)
        self._tail_note = ""
        if self.variant.on("tail-floor") and not self.target:
            names = {c.name for c in clusters}
            floors = tail_floors({n: st for n, st in self._stats.items() if n in names},
                                 {n: self._per_channel_bps(n) for n in names}, self._rate, self.path.max_cc)
            floored = apply_floors(cc, floors)
            moved = [f.reason for n, f in sorted(floors.items()) if floored.get(n, 0) > cc.get(n, 0)]
            if moved:
                self._tail_note = "tails: " + "; ".join(moved) + f" (split {cc} -> {floored})"
            cc = floored
        total_cc = sum(cc.values())
        out = []
        for c in clusters:
            dp, dpp = self._fine.get(c.name, (0, 0))
            base = self._settings[c.name]
            s = clamp(Settings(cc[c.name], base.p + dp, base.pp + dpp), self.path)
            s = Settings(cc[c.name], s.p, s.pp)  # cc may be 0 when clusters outnumber max_cc
            if self.target and self.pacing:
                out.append(PacedLayout(c.name, s.cc, s.p, s.pp, self.target * cc[c.name] / total_cc))
            else:
                out.append(ClusterLayout(c.name, s.cc, s.p, s.pp))
        return tuple(out)

    def suggest(self) -> Suggestion:
        s = super().suggest()
        return dataclasses.replace(s, reason=f"{s.reason}; {self._tail_note}") if self._tail_note else s

    def set_target(self, bps: float | None) -> None:
        """Move the QoS target while running (a deadline's steering, ``deadline.Deadline``); None fills the path."""
        if bps is None:
            self.target, self._qos = None, None
            return
        if self._qos is None:
            self._qos = QosController(target_bps=bps, max_cc=self.path.max_cc, jump=self.variant.on("jump"),
                                      headroom=0.1 if self.pacing else 0.0, guard=self.variant.on("plateau-guard"))
        self._qos.target_bps = bps
        self.target = bps

    # -- the loop -----------------------------------------------------------------------
    def update(self, observation: Observation) -> None:
        obs = observation
        touched = self._ingest(obs)
        reasons = []
        for name in sorted(touched):
            c = self._clustering.get(name)
            s, old = self._heuristic(c), self._settings.get(name)
            if old is not None and abs(s.p - old.p) <= 1:
                s = Settings(s.cc, old.p, s.pp)  # a new p means new channels: not worth +-1
            seeded = (self.seed(c) if self._total is None and self.seed is not None and not self.start
                      and getattr(self.seed, "ready", True) else None)  # every cluster of the initial dataset
            if self._total is None and self.start:  # the initial dataset starts where the user said
                s = clamp(self.start.over(s), self.path)
                reasons.append(f"start {describe(name, c, s)} ({self.start.describe()})")
            elif seeded is not None:
                s, why = clamp(seeded[0], self.path), seeded[1]
                self._seeded = self._history_checked = True  # HARP's start stands in for the §3.5 consult
                reasons.append(f"start {describe(name, c, s)} ({why})")
            else:
                reasons.append("heuristic " + describe(name, c, s))
            self._settings[name] = s
        if self._total is not None and self._seed_pending(ready=True):
            late = self._late_seed(obs.t)
            if late:  # what was measured so far belongs to the old layout: profile the new one afresh
                self._acc_bytes, self._acc_dt, self._acc_starved = 0, 0.0, False
                self._reason = "fstream: " + "; ".join(reasons + late)
                return
            reasons.extend(late)
        clusters = self._working()
        names = tuple(c.name for c in clusters)
        if names != self._names:
            self._names = names
            self._history_checked = False
            self._profiler.guard.reset()
            if self._qos:
                self._qos.guard.reset()
        if not clusters:
            self._reason = "fstream: " + ("; ".join(reasons) or "no pending files")
            return
        for name, st in obs.clusters.items():
            if st.active_channels and st.throughput_bps > 0:
                self._per_channel[name] = st.throughput_bps / st.active_channels
        if obs.dt >= 0.25 * self.min_window_s and obs.throughput_bps > 0:
            self._rate = obs.throughput_bps
        if self._total is None and self.start.cc is not None:
            self._total = min(max(self.start.cc, len(clusters)), self.path.max_cc)
            reasons.append(f"total cc={self._total} (given)")
            self._reason = "fstream: " + "; ".join(reasons)
            return
        if self._total is None:
            self._total = sum(self._settings[c.name].cc for c in clusters)
            desired = self.target or self._profiler.desired_bps
            dom = self._dominant(clusters)
            consult = not self._seeded and self.variant.on("start-history")  # the thesis waits until out of band
            hcc, note, _ = self._history_cc(dom, desired) if consult else (None, "", None)
            if hcc is not None:
                # history is per cluster: the dominant one gets it, the others keep the heuristic's
                others = sum(self._settings[c.name].cc for c in clusters if c is not dom)
                self._total, self._history_checked = hcc + others, True
                reasons.append(f"history {note} -> cc={self._total}")
            self._reason = "fstream: " + "; ".join(reasons)
            return
        if obs.dt <= 0:
            self._reason = "fstream: " + ("; ".join(reasons) or "waiting")
            return
        if obs.t < SEED_WAIT_S and self._seed_pending(ready=False):
            # profiling now would move the layout before HARP's start arrives and make it moot
            reasons.append(f"waiting for the transfer history (HARP start), {obs.t:.1f} of {SEED_WAIT_S:.0f} s")
            self._reason = "fstream: " + "; ".join(reasons)
            return
        cc_now = sum(l.cc for l in obs.layouts) or self._total
        pending = sum(st.pending_files for st in obs.clusters.values())
        # measure over a window of at least min_window_s (drivers also call on every arrival)
        self._acc_bytes += obs.bytes
        self._acc_dt += obs.dt
        if self.variant.on("skip-starved"):
            self._acc_starved = self._acc_starved or pending < cc_now or obs.bytes <= 0
        if self._acc_dt < 0.95 * self.min_window_s:
            reasons.append(f"measuring ({self._acc_dt:.1f} of {self.min_window_s:.1f} s)")
            self._reason = "fstream: " + "; ".join(reasons)
            return
        thr = self._acc_bytes * 8 / self._acc_dt
        starved = self._acc_starved
        self._acc_bytes, self._acc_dt, self._acc_starved = 0, 0.0, False
        self._record(obs, thr, starved)
        if starved:
            reasons.append(f"channels ran out of files ({pending} pending for {cc_now}): not profiling")
        elif self._qos is not None:
            if self._qos.headroom and thr > self.target * 1.05:
                self._over += 1
                if self._over >= 2:  # the driver does not pace: aim at the target itself
                    self._qos.headroom = 0.0
                    reasons.append("rate cap not honoured by the sender: plain Alg. 3")
            else:
                self._over = 0
            d = self._qos.step(cc_now, thr)
            self._decided = True
            self._apply(d.cc, d.fine, clusters)
            reasons.append(d.reason)
        elif self.profiling:
            hcc, note = None, ""
            if not self._history_checked and thr < self._profiler.desired_bps * (1 - self._profiler.band):
                self._history_checked = True
                dom = self._dominant(clusters)
                hcc, note, _ = self._history_cc(dom, self._profiler.desired_bps)
                if hcc is not None:
                    hcc += sum(l.cc for l in obs.layouts if l.cluster != dom.name)
            d = self._profiler.step(cc_now, thr, hcc, note)
            self._decided = True
            self._apply(d.cc, 0, clusters)
            reasons.append(d.reason)
        else:
            reasons.append("profiling off")
        self._reason = "fstream: " + "; ".join(reasons)

    def _seed_pending(self, *, ready: bool) -> bool:
        """HARP's start may still apply (nothing given, nothing decided yet) and its history is (not) ready."""
        return (self.seed is not None and not self._seeded and not self.start and not self._decided
                and getattr(self.seed, "ready", True) == ready)

    def _late_seed(self, t: float) -> list[str]:
        """The history finished loading after the start: move the initial clusters to HARP's prediction."""
        self._seeded = True  # one try
        out = []
        for c in self._working():
            got = self.seed(c)
            if got is None:
                continue
            s = clamp(got[0], self.path)
            self._settings[c.name] = s
            out.append(f"start {describe(c.name, c, s)} ({got[1]}; history ready at {t:.1f} s)")
        if out:
            self._total = min(max(sum(self._settings[c.name].cc for c in self._working()), 1), self.path.max_cc)
            self._history_checked = True  # the profiling history must not undo the start it just got
        return out

    def _apply(self, cc: int, fine: int, clusters: list[Cluster]) -> None:
        before = self._total or cc
        self._total = min(max(cc, len(clusters)), self.path.max_cc)
        if self._total == before and cc != before:
            # cc cannot move further (one channel per cluster / max_cc): move p of every cluster
            step = 1 if cc > before else -1
            for c in clusters:
                dp, dpp = self._fine.get(c.name, (0, 0))
                base = self._settings[c.name].p
                self._fine[c.name] = (min(max(dp + step, 1 - base), self.path.max_p - base), dpp)
            return
        if fine:
            c = self._dominant(clusters)
            dp, dpp = self._fine.get(c.name, (0, 0))
            if c.name == SMALL:
                dpp += fine
            else:
                dp += fine
            self._fine[c.name] = (dp, dpp)

    def _record(self, obs: Observation, thr: float, starved: bool) -> None:
        if self.history is None or starved:
            return
        # a clean measurement: one cluster carried at least 90 % of the bytes
        if obs.bytes <= 0 or not obs.clusters:
            return
        name = max(obs.clusters, key=lambda n: obs.clusters[n].bytes)
        if obs.clusters[name].bytes < 0.9 * obs.bytes:
            return
        lay = next((l for l in obs.layouts if l.cluster == name), None)
        c = self._clustering.get(name)
        if lay is None or c is None or getattr(lay, "rate_bps", None):
            return  # paced intervals say nothing about what the settings can do
        self.history.add(ProfileRecord(c.avg_size, name, c.ftype, lay.cc, lay.p, lay.pp,
                                       thr * obs.clusters[name].bytes / obs.bytes, self.start_time + obs.t))
