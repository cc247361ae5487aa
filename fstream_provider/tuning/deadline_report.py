"""Deadlines in the simulator (issue 27's goals): does steering meet a deadline, and at what cost in streams?

For a workload on a path, ``minimum_time`` is the oracle's: the fastest fixed (cc, p, pp) of a grid (as in
``simreport``), and deadlines are set at multiples of it. A steered run (``deadline.Deadline`` around the
``fstream`` tuner) is scored on whether it landed everything by the deadline and on its *stream-seconds*
(TCP streams open x time, summed over the run: what it held of a shared path), against the fixed setting
of the grid that meets the same deadline with the fewest stream-seconds ("the slowest setting that meets
it"). An infeasible deadline (below the minimum) is scored on when the run first says so.

    python -m fstream_provider.tuning.deadline_report      # prints the table (bench/deadline_bench wraps it)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from fstream_provider.tuning.base import PathInfo
from fstream_provider.tuning.deadline import Deadline
from fstream_provider.tuning.fixed import FixedTuner
from fstream_provider.tuning.fstream import FStreamTuner
from fstream_provider.tuning.sim import SimResult, StorageModel, simulate
from fstream_provider.tuning.workloads import Workload

GRID = ((1, 2, 4, 8, 16, 32), (1, 2, 4, 8), (0, 2, 8))


def stream_seconds(r: SimResult) -> float:
    """TCP streams open (cc x p over every cluster's layout) times time, over the run."""
    out, last = 0.0, 0.0
    for iv in r.intervals:
        layouts = iv.get("layouts") or []
        streams = sum(l["cc"] * l["p"] for l in layouts) if layouts else iv["cc"] * iv["p"]
        out += streams * (iv["t"] - last)
        last = iv["t"]
    return out


@dataclass
class FixedRun:
    cc: int
    p: int
    pp: int
    seconds: float
    stream_seconds: float


def fixed_runs(w: Workload, path: PathInfo, *, storage: StorageModel | None = None, grid=GRID,
               profile_interval_s: float = 2.0, max_time_s: float = 3600.0, **sim_kw) -> list[FixedRun]:
    """Every completed fixed setting of ``grid`` on ``w`` (``sim_kw``: more ``simulate`` options, e.g. the
    emulated WAN's calibration ``ablation.SIM_KW``)."""
    out = []
    for cc, p, pp in itertools.product(*grid):
        if cc > path.max_cc:
            continue
        r = simulate(FixedTuner(cc=cc, p=p, pp=pp), w, path, storage=storage, profile_interval_s=profile_interval_s,
                     max_time_s=max_time_s, **sim_kw)
        if r.completed:
            out.append(FixedRun(cc, p, pp, r.total_time_s, stream_seconds(r)))
    return out


def steered(w: Workload, path: PathInfo, deadline_s: float, *, storage: StorageModel | None = None,
            profile_interval_s: float = 2.0, bandwidth_known: bool = False, steer: str = "streams",
            sim_kw: dict | None = None) -> dict:
    """One steered run: met, seconds, stream-seconds, when each state was first said (``steer``: the
    ``Deadline``'s rule; ``sim_kw``: more ``simulate`` options, e.g. the WAN's calibration ``ablation.SIM_KW``)."""
    d = Deadline(FStreamTuner(path=path), deadline_s, bandwidth_bps=path.bandwidth_bps if bandwidth_known else None,
                 steer=steer)
    r = simulate(d, w, path, storage=storage, profile_interval_s=profile_interval_s, max_time_s=deadline_s * 4,
                 **(sim_kw or {}))
    first: dict[str, float] = {}
    for t, st in d.changes:
        first.setdefault(st.state, round(t, 3))
    return {"met": r.completed and r.total_time_s <= deadline_s, "seconds": r.total_time_s,
            "stream_seconds": stream_seconds(r), "first": first, "completed": r.completed}


def case(w: Workload, path: PathInfo, factors=(1.2, 1.5, 2.0), infeasible=0.8, steers=("streams",),
         **kw) -> list[dict]:
    """Rows for one workload: each deadline factor, and the infeasible one, for each ``Deadline`` rule in
    ``steers`` (row key "steer"), against the same fixed settings."""
    runs = fixed_runs(w, path, storage=kw.get("storage"), profile_interval_s=kw.get("profile_interval_s", 2.0),
                      **(kw.get("sim_kw") or {}))
    best = min(runs, key=lambda f: f.seconds)
    rows = []
    for steer in steers:
        for k in factors:
            deadline = best.seconds * k
            s = steered(w, path, deadline, steer=steer, **kw)
            meeting = [f for f in runs if f.seconds <= deadline]
            slowest = min(meeting, key=lambda f: f.stream_seconds)
            rows.append({"workload": w.name, "steer": steer, "factor": k, "minimum_s": best.seconds,
                         "deadline_s": deadline, **s,
                         "fixed": {"cc": slowest.cc, "p": slowest.p, "pp": slowest.pp, "seconds": slowest.seconds,
                                   "stream_seconds": slowest.stream_seconds},
                         "stream_ratio": s["stream_seconds"] / slowest.stream_seconds if slowest.stream_seconds
                         else None})
        s = steered(w, path, best.seconds * infeasible, steer=steer, **kw)
        rows.append({"workload": w.name, "steer": steer, "factor": infeasible, "minimum_s": best.seconds,
                     "deadline_s": best.seconds * infeasible, **s,
                     "infeasible_reported_s": s["first"].get("infeasible")})
    return rows


class EtaProbe:
    """``tuner`` unchanged, with an ``EtaEstimator`` fed every observation as the sender feeds it: records
    ``(t, remaining bytes, Eta)`` so a run can be scored against when it really finished."""

    def __init__(self, tuner) -> None:
        from fstream_provider.tuning.eta import EtaEstimator

        self.tuner, self.name = tuner, getattr(tuner, "name", "tuner")
        self.eta, self.known, self.moved, self.points = EtaEstimator(), 0.0, 0.0, []

    def __getattr__(self, item: str):
        return getattr(self.tuner, item)

    def cluster_of(self, file):
        return self.tuner.cluster_of(file)

    def update(self, obs) -> None:
        self.known += sum(f.size for f in obs.new_files)
        self.moved += obs.bytes
        pending = sum(st.pending_files for st in obs.clusters.values())
        if obs.dt > 0:
            self.eta.add(obs.t, obs.dt, obs.bytes, busy=obs.bytes > 0 or pending > 0,
                         streams=sum(l.cc * l.p for l in obs.layouts) or None)
            left = max(0.0, self.known - self.moved)
            self.points.append((obs.t, left, self.eta.estimate(left, pending)))
        self.tuner.update(obs)

    def suggest(self):
        return self.tuner.suggest()


def eta_errors(w: Workload, path: PathInfo, *, storage: StorageModel | None = None, profile_interval_s: float = 2.0,
               at=(0.25, 0.5, 0.75), sim_kw: dict | None = None) -> dict:
    """The ETA's relative error (and whether its interval held the truth) when 25, 50 and 75 % of a backlogged
    workload had moved, on the ``fstream`` tuner."""
    probe = EtaProbe(FStreamTuner(path=path))
    r = simulate(probe, w, path, storage=storage, profile_interval_s=profile_interval_s, **(sim_kw or {}))
    total = w.total_bytes
    out = {}
    for frac in at:
        point = next(((t, left, e) for t, left, e in probe.points if total - left >= frac * total and e is not None),
                     None)
        if point is None:
            out[str(frac)] = None
            continue
        t, left, e = point
        truth = r.total_time_s - t
        out[str(frac)] = {"t": t, "eta_s": e.s, "truth_s": truth, "rel_error": abs(e.s - truth) / truth if truth > 0
                          else 0.0, "covered": e.lo <= truth <= e.hi, "basis": e.basis}
    return out
