"""Deterministic path + storage simulator that drives any tuner with no real time passing (DESIGN "The simulator").

Model (time-stepped, ``dt`` seconds; everything is a plain number, nothing sleeps):

- Bottleneck of ``path.bandwidth_bps`` shared max-min fairly *per TCP stream* between our
  channels (a channel with p streams weighs p) and background traffic (``background`` steps
  ``(t, bps)``: that many bits/s of competing TCP streams, each at most one stream's cap).
- One stream carries at most ``tcp_buffer * 8 / rtt`` bits/s; a new channel first spends
  two RTTs on connect + authentication, then its streams slow-start from 10 segments,
  doubling every RTT up to the buffer.
- Between files a channel waits for commands: per file it can move at most ``pp + 1``
  files per round trip, i.e. an idle gap of ``max(0, (rtt + tau) / (pp + 1) - tau)`` after
  a file that took ``tau`` seconds (pp = 0: a whole RTT per file).
- Storage: each channel is one reader thread of at most ``storage.per_thread_bps``; the
  aggregate is at most ``storage.max_bps``, degrading as ``(knee / threads) ** degrade``
  beyond ``knee_threads`` busy channels.
- An optional per-cluster rate cap (``rate_bps`` on a layout, see ``qos.PacedLayout``) is
  split evenly between the cluster's busy channels (pacing).
- Files arrive from a ``Workload``; each goes to the queue of ``tuner.cluster_of(file)``;
  channels of that cluster take them in order. Every ``profile_interval_s`` the tuner gets an
  ``Observation`` and its ``Suggestion`` is applied through ``plan_channels`` (smart channel
  distribution), exactly as the sender does.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from fstream_provider.tuning.base import (
    ClusterLayout,
    ClusterStats,
    FileInfo,
    Observation,
    PathInfo,
    Tuner,
)
from fstream_provider.tuning.distribution import ChannelState, plan_channels
from fstream_provider.tuning.workloads import Workload

INIT_CWND = 10 * 1448
SETUP_RTTS = 2.0


@dataclass(frozen=True)
class StorageModel:
    """End-system storage limits.

    :param per_thread_bps: rate one channel (one reader/writer thread) can sustain.
    :param max_bps: aggregate storage rate with few threads.
    :param knee_threads: busy channels beyond which the aggregate degrades.
    :param degrade: exponent of the degradation ``(knee / threads) ** degrade``.
    """

    per_thread_bps: float = math.inf
    max_bps: float = math.inf
    knee_threads: int = 1_000_000
    degrade: float = 0.5

    def aggregate(self, threads: int) -> float:
        if threads <= self.knee_threads:
            return self.max_bps
        return self.max_bps * (self.knee_threads / threads) ** self.degrade


def dtn_storage(bandwidth_bps: float) -> StorageModel:
    """A data-transfer-node-like storage: a thread reads 30 % of the link, 1.5x the link in total, degrading past 16 threads."""
    return StorageModel(per_thread_bps=0.3 * bandwidth_bps, max_bps=1.5 * bandwidth_bps,
                        knee_threads=16, degrade=0.5)


@dataclass
class _Channel:
    cid: int
    p: int
    cluster: str | None
    ready_t: float
    cwnd: float = INIT_CWND
    file: FileInfo | None = None
    file_cluster: str = ""
    left: float = 0.0
    started: float = 0.0
    gap_until: float = 0.0
    closing: bool = False


@dataclass
class SimResult:
    """What a simulated transfer did.

    :param tuner: tuner name.
    :param workload: workload name.
    :param intervals: one record per profiling interval, shaped like the agent's
        (``t, throughput_bps, cc, p, pp, reason`` plus ``layouts``, ``clusters``,
        ``channels_open``, ``passive``, ``background_bps``, ``bytes``).
    :param total_bytes: bytes moved.
    :param total_time_s: time from the start until the last byte.
    :param files: files moved.
    :param completed: False when ``max_time_s`` ran out first.
    :param channels_opened: channels opened over the whole run.
    """

    tuner: str
    workload: str
    intervals: list[dict] = field(default_factory=list)
    total_bytes: int = 0
    total_time_s: float = 0.0
    files: int = 0
    completed: bool = True
    channels_opened: int = 0

    @property
    def throughput_bps(self) -> float:
        return self.total_bytes * 8 / self.total_time_s if self.total_time_s > 0 else 0.0


def _waterfill(capacity: float, entities: list[tuple[float, float]]) -> list[float]:
    """Weighted max-min share of ``capacity`` between (weight, cap) entities."""
    out = [0.0] * len(entities)
    order = sorted(range(len(entities)), key=lambda i: entities[i][1] / max(entities[i][0], 1e-12))
    left, wsum = capacity, sum(w for w, _ in entities)
    for i in order:
        w, cap = entities[i]
        if wsum <= 0:
            break
        share = left * w / wsum
        give = min(cap, share)
        out[i] = give
        left -= give
        wsum -= w
    return out


def simulate(tuner: Tuner, workload: Workload, path: PathInfo, *, dt: float | None = None,
             profile_interval_s: float = 2.0, background: Sequence[tuple[float, float]] = (),
             storage: StorageModel | None = None, max_passive: int = 8,
             max_time_s: float = 3600.0, honour_rate_caps: bool = True,
             window_efficiency: float = 1.0, startup_s: float = 0.0) -> SimResult:
    """Run ``tuner`` over ``workload`` on ``path``; see the module docstring for the model.

    :param tuner: any ``Tuner`` (it may hold its own, possibly wrong, idea of the path).
    :param workload: batches of files arriving over time.
    :param path: the real path: bandwidth, RTT, TCP buffer.
    :param dt: time step (default ``min(rtt / 2, 0.02)``).
    :param profile_interval_s: time between observations / suggestions.
    :param background: ``(t, bps)`` steps of competing TCP traffic.
    :param storage: storage limits (default: none).
    :param max_passive: passive channels kept (``plan_channels``).
    :param max_time_s: give up (``completed=False``) after this much simulated time.
    :param honour_rate_caps: False plays a sender that ignores ``rate_bps`` (no pacing).
    :param window_efficiency: share of ``tcp_buffer`` a stream really keeps in flight (Linux
        reserves part of the buffer for overhead; the emulated WAN measured ~0.65: one stream
        129-137 Mbit/s with a 1 MiB cap at 40 ms, where buffer / RTT is 210 Mbit/s).
    :param startup_s: time before the first channels can connect (process start, control
        session; the agent on the emulated WAN took ~1.2 s).
    """
    if profile_interval_s <= 0:
        raise ValueError(f"simulate: profile_interval_s must be > 0, got {profile_interval_s}")
    rtt = path.rtt_s
    dt = dt or min(rtt / 2, 0.02)
    storage = storage or StorageModel()
    stream_cap = path.tcp_buffer * window_efficiency * 8 / rtt
    bg_steps = sorted(background)
    batches = deque(sorted(workload.batches, key=lambda b: b.t))
    queues: dict[str, deque[FileInfo]] = {}
    channels: dict[int, _Channel] = {}
    next_id = 0
    pp_of: dict[str, int] = {}
    rate_of: dict[str, float] = {}
    layouts: tuple[ClusterLayout, ...] = ()
    res = SimResult(getattr(tuner, "name", type(tuner).__name__), workload.name)
    arrived: list[FileInfo] = []
    iv_bytes: dict[str, float] = {}
    iv_chans: dict[str, set[int]] = {}
    t = 0.0
    last_obs_t = 0.0
    last_byte_t = 0.0
    total = workload.total_bytes
    moved = 0.0

    def bg_at(now: float) -> float:
        bps = 0.0
        for st, b in bg_steps:
            if st <= now + 1e-9:
                bps = b
        return bps

    def arrive(now: float) -> None:
        while batches and batches[0].t <= now + 1e-9:
            for f in batches.popleft().files:
                queues.setdefault(tuner.cluster_of(f), deque()).append(f)
                arrived.append(f)

    def observe(now: float, span: float, done: bool) -> None:
        nonlocal layouts, next_id, arrived, iv_bytes, iv_chans
        names = set(queues) | set(iv_bytes) | {c.file_cluster for c in channels.values() if c.file}
        stats = {}
        for n in sorted(names):
            b = iv_bytes.get(n, 0.0)
            q = queues.get(n, ())
            stats[n] = ClusterStats(int(b), b * 8 / span if span > 0 else 0.0,
                                    len(iv_chans.get(n, ())), len(q), sum(f.size for f in q))
        b_all = sum(iv_bytes.values())
        obs = Observation(now, span, int(b_all), b_all * 8 / span if span > 0 else 0.0,
                          tuple(arrived), stats, layouts, done)
        arrived = []
        tuner.update(obs)
        sug = tuner.suggest()
        if span > 0:
            top = max(stats, key=lambda n: stats[n].bytes, default=None)
            lay = next((l for l in layouts if l.cluster == top), layouts[0] if layouts else None)
            res.intervals.append({
                "t": round(now, 6), "throughput_bps": obs.throughput_bps, "bytes": int(b_all),
                "cc": sum(l.cc for l in layouts), "p": lay.p if lay else 0, "pp": lay.pp if lay else 0,
                "reason": last_reason[0],
                "layouts": [{"cluster": l.cluster, "cc": l.cc, "p": l.p, "pp": l.pp,
                             **({"rate_bps": l.rate_bps} if getattr(l, "rate_bps", None) else {})}
                            for l in layouts],
                "clusters": {n: s.throughput_bps for n, s in stats.items()},
                "channels_open": len(channels),
                "passive": sum(1 for c in channels.values() if c.cluster is None),
                "background_bps": bg_at(now),
            })
        last_reason[0] = sug.reason
        iv_bytes, iv_chans = {}, {}
        if done:
            return
        layouts = tuple(sug.layouts)
        pp_of.clear()
        rate_of.clear()
        for l in layouts:
            pp_of[l.cluster] = l.pp
            r = getattr(l, "rate_bps", None)
            if r and honour_rate_caps:
                rate_of[l.cluster] = float(r)
        states = [ChannelState(c.cid, c.p, c.cluster, c.file is not None)
                  for c in channels.values() if not c.closing]
        plan = plan_channels(states, layouts, max_passive=max_passive)
        for cid, cl in plan.reassign:
            channels[cid].cluster = cl
        for cid in plan.passivate:
            channels[cid].cluster = None
        for cid in plan.close:
            channels[cid].closing = True
            channels[cid].cluster = None
        for o in plan.open:
            for _ in range(o.count):
                channels[next_id] = _Channel(next_id, o.p, o.cluster,
                                             max(now, startup_s) + SETUP_RTTS * rtt)
                next_id += 1
                res.channels_opened += 1

    last_reason = [""]
    arrive(0.0)
    observe(0.0, 0.0, False)
    while True:
        # --- choose who transfers this step and at what rate
        for c in list(channels.values()):
            if c.closing and c.file is None:
                del channels[c.cid]
        t_end = t + dt
        movers = []
        for c in channels.values():
            if c.ready_t >= t_end or c.gap_until >= t_end:
                continue
            if c.file is not None or (c.cluster is not None and queues.get(c.cluster)):
                movers.append(c)
        rates: dict[int, float] = {}
        if movers:
            per_cluster: dict[str, int] = {}
            for c in movers:
                cl = c.file_cluster if c.file is not None else c.cluster
                per_cluster[cl] = per_cluster.get(cl, 0) + 1
            ents = []
            for c in movers:
                cl = c.file_cluster if c.file is not None else c.cluster
                cap = min(c.p * min(stream_cap, c.cwnd * 8 / rtt), storage.per_thread_bps)
                if cl in rate_of:
                    cap = min(cap, rate_of[cl] / per_cluster[cl])
                ents.append((float(c.p), cap))
            bg = bg_at(t)
            if bg > 0:
                n_bg = max(1, math.ceil(bg / stream_cap))
                ents.extend([(1.0, bg / n_bg)] * n_bg)
            shares = _waterfill(path.bandwidth_bps, ents)[:len(movers)]
            s_tot = sum(shares)
            s_cap = storage.aggregate(len(movers))
            scale = min(1.0, s_cap / s_tot) if s_tot > 0 else 1.0
            rates = {c.cid: r * scale / 8.0 for c, r in zip(movers, shares)}  # bytes/s
        # --- advance channels through the step (files may finish and start inside it)
        for c in movers:
            tt = max(t, c.ready_t)
            active = 0.0
            rate = rates.get(c.cid, 0.0)
            while tt < t_end - 1e-12 and rate > 0:
                if c.gap_until > tt:
                    tt = min(t_end, c.gap_until)
                    continue
                if c.file is None:
                    q = queues.get(c.cluster) if c.cluster is not None else None
                    if not q:
                        break
                    c.file = q.popleft()
                    c.file_cluster = c.cluster
                    c.left = float(c.file.size)
                    c.started = tt
                step = min(t_end - tt, c.left / rate)
                c.left -= rate * step
                tt += step
                active += step
                iv_bytes[c.file_cluster] = iv_bytes.get(c.file_cluster, 0.0) + rate * step
                iv_chans.setdefault(c.file_cluster, set()).add(c.cid)
                moved += rate * step
                if c.left <= 1e-6:
                    tau = tt - c.started
                    pp = pp_of.get(c.cluster, 0) if c.cluster is not None else 0
                    c.gap_until = tt + max(0.0, (rtt + tau) / (pp + 1) - tau)
                    res.files += 1
                    last_byte_t = tt
                    c.file = None
                    if c.closing or c.cluster is None:
                        break
            if active > 0:
                c.cwnd = min(float(path.tcp_buffer) * window_efficiency, c.cwnd * 2 ** (active / rtt))
        t = t_end
        arrive(t)
        busy = any(c.file is not None for c in channels.values())
        done = not batches and not busy and not any(queues.values())
        if done or t - last_obs_t >= profile_interval_s - 1e-9:
            observe(t, t - last_obs_t, done)
            last_obs_t = t
        if done:
            break
        if t >= max_time_s:
            res.completed = False
            last_byte_t = t
            break
    res.total_bytes = int(round(moved)) if not res.completed else total
    res.total_time_s = last_byte_t
    return res
