"""Tuning science in the simulator (issue #16): the thesis' FStream beside ours, each switch alone, against an oracle.

Pure compute, returns rows. The path is the emulated WAN's (1 Gbit/s, 40 ms, 1 MiB buffers) with
the simulator's calibration to it (``window_efficiency`` 0.65, ``startup_s`` 1.2, from
``simreport.calibration_rows``) and data-transfer-node storage. Regimes are kept apart, because an
arrival-bound run says nothing about a tuner: *backlogged* (every file present at the start) and
*streamed* (batches every 5 s, the thesis' arrivals scaled to this path); ``mix`` changes its
mix mid-run (large -> 2000 extra small -> large) while staying backlogged.

The **oracle** is the best static (cc, p, pp) per workload and regime from a grid search
(``ORACLE_GRID``: cc 1-32, p 1-16, pp 0-32, 200 points); for ``mix`` also per phase, which is
what recovery after each change is measured against. Every fstream variant starts from the same
profiling history, filled by the default variant on another seed of the same workload (so the
history switches have something to use). Metrics: throughput as a fraction of the oracle, time
to reach 0.9 of the oracle's throughput, channel churn (sum of |cc changes| per minute), for
``mix`` how long after each change the throughput last sat below 0.85 of that phase's oracle, and
for QoS the median and p90 (nearest rank) |error| per decision window after the first three.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

from fstream_provider.tuning.base import PathInfo, Tuner
from fstream_provider.tuning.fixed import FixedTuner
from fstream_provider.tuning.fstream import FStreamTuner
from fstream_provider.tuning.profile_history import ProfileHistory
from fstream_provider.tuning.registry import make_tuner
from fstream_provider.tuning.sim import SimResult, StorageModel, dtn_storage, simulate
from fstream_provider.tuning.variants import DEFAULT, SWITCHES, THESIS, FStreamVariant
from fstream_provider.tuning.workloads import MIX, WORKLOADS, Workload, default_scale, make_workload

MiB = 2**20
WAN_PATH = PathInfo(1e9, 0.040, tcp_buffer=1 * MiB, max_cc=32, max_p=16)
WAN_STORAGE = dtn_storage(1e9)
SIM_KW = {"window_efficiency": 0.65, "startup_s": 1.2}
OBSERVE_S = 1.0  # the driver's observation period; variants decide on their own interval
ORACLE_GRID = ((1, 2, 4, 8, 12, 16, 24, 32), (1, 2, 4, 8, 16), (0, 1, 4, 8, 32))
REGIMES = {"backlogged": 0.0, "streamed": 5.0}
THROUGHPUT_SWITCHES = tuple(s for s in SWITCHES if s not in ("jump", "pacing"))
QOS_SWITCHES = ("jump", "pacing", "plateau-guard", "short-intervals")


@dataclass(frozen=True)
class Setup:
    """Where the ablation runs.

    :param path: the path.
    :param storage: end-system storage model.
    :param seed: workload seed (history is filled on ``seed + 1``).
    :param count_factor: thins file counts (tests use < 1 to stay fast).
    """

    path: PathInfo = WAN_PATH
    storage: StorageModel = WAN_STORAGE
    seed: int = 0
    count_factor: float = 1.0

    def workload(self, name: str, regime: str, *, seed: int | None = None) -> Workload:
        scale = default_scale(self.path.bandwidth_bps, self.path.rtt_s)
        return make_workload(name, scale=scale, seed=self.seed if seed is None else seed,
                             interval_s=REGIMES[regime], count_factor=self.count_factor)

    def run(self, tuner: Tuner, w: Workload, *, max_time_s: float = 3600.0, background_bps: float = 0.0) -> SimResult:
        """Simulate ``tuner`` on ``w`` (``background_bps``: constant competing traffic from the start)."""
        return simulate(tuner, w, self.path, storage=self.storage, profile_interval_s=OBSERVE_S,
                        max_time_s=max_time_s, background=((0.0, background_bps),) if background_bps else (),
                        **SIM_KW)


def ablation_variants() -> dict[str, FStreamVariant]:
    """thesis, thesis + each throughput switch alone, default, default + history-ftype."""
    out = {"thesis": THESIS}
    for sw in THROUGHPUT_SWITCHES:
        if sw != "history-ftype":
            out[f"thesis+{sw}"] = FStreamVariant(frozenset({sw}))
    out["default"] = DEFAULT
    out["default+history-ftype"] = FStreamVariant.parse("default+history-ftype")
    return out


def oracle(setup: Setup, w: Workload, grid=ORACLE_GRID, *, background_bps: float = 0.0) -> tuple[float, str]:
    """Best static (cc, p, pp) over ``grid``: (throughput bits/s, "cc=.. p=.. pp=..")."""
    best_bps, best_secs, note = 0.0, 0.0, ""
    for cc, p, pp in itertools.product(*grid):
        r = setup.run(FixedTuner(cc=cc, p=p, pp=pp), w, max_time_s=best_secs or 3600.0, background_bps=background_bps)
        if r.completed and r.throughput_bps > best_bps:
            best_bps, best_secs, note = r.throughput_bps, r.total_time_s, f"cc={cc} p={p} pp={pp}"
    return best_bps, note


def warm_history(setup: Setup, name: str, regime: str) -> list:
    """Profiling records the default variant leaves after a run on another seed of the same workload."""
    h = ProfileHistory()
    setup.run(FStreamTuner(path=setup.path, history=h), setup.workload(name, regime, seed=setup.seed + 1))
    return h.records()


def churn_per_min(r: SimResult) -> float:
    ccs = [iv["cc"] for iv in r.intervals]
    moves = sum(abs(b - a) for a, b in zip(ccs, ccs[1:]))
    return moves / max(r.total_time_s, 1e-9) * 60


def time_to(r: SimResult, bps: float) -> float | None:
    """First interval end at which the throughput reached ``bps`` (None: never)."""
    return next((iv["t"] for iv in r.intervals if iv["throughput_bps"] >= bps), None)


def throughput_rows(setup: Setup = Setup(), *, workloads=WORKLOADS + (MIX,), regimes=tuple(REGIMES),
                    grid=ORACLE_GRID) -> list[dict]:
    """One row per (workload, regime, tuner/variant): throughput, fraction of the oracle, convergence, churn."""
    rows = []
    for name, regime in itertools.product(workloads, regimes):
        if name == MIX and regime == "streamed":
            continue  # mix times its own phases
        w = setup.workload(name, regime)
        best, note = oracle(setup, w, grid)
        records = warm_history(setup, name, regime)
        tuners: dict[str, Tuner] = {"static": make_tuner("static", path=setup.path)}
        for label, v in ablation_variants().items():
            tuners[label] = FStreamTuner(path=setup.path, variant=v, history=ProfileHistory(records), start_time=1e6)
        for label, tuner in tuners.items():
            r = setup.run(tuner, w)
            rows.append({"workload": name, "regime": regime, "tuner": label, "throughput_bps": r.throughput_bps,
                         "of_oracle": r.throughput_bps / best if best else 0.0, "oracle_bps": best,
                         "oracle": note, "to_90pct_s": time_to(r, 0.9 * best), "churn_per_min": churn_per_min(r),
                         "seconds": r.total_time_s, "result": r})
    return rows


def recovery_rows(setup: Setup = Setup(), *, tuners=("thesis", "default"), grid=ORACLE_GRID) -> list[dict]:
    """``mix``: per change, how long after it the throughput last sat below 0.85 of that phase's own oracle.

    The old phase's files in flight keep the link busy for a while after a change, so the dip the
    change causes comes later; what counts is when the last interval below 0.85 ends (0: never
    below), in seconds and in decision intervals. The final 3 s (the queue draining) are left out.
    """
    w = setup.workload(MIX, "backlogged")
    phase_best = [oracle(setup, Workload(f"{MIX}-p{k + 1}", [type(b)(0.0, b.files)]), grid)[0]
                  for k, b in enumerate(w.batches)]
    variants = ablation_variants()
    rows = []
    for label in tuners:
        v = variants[label]
        r = setup.run(FStreamTuner(path=setup.path, variant=v), w)
        every = v.interval_for(setup.path.rtt_s)
        for k, b in enumerate(w.batches[1:], start=1):
            end = w.batches[k + 1].t if k + 1 < len(w.batches) else r.total_time_s - 3.0
            low = [iv["t"] for iv in r.intervals if b.t < iv["t"] <= end and iv["throughput_bps"] < 0.85 * phase_best[k]]
            took = (max(low) - b.t) if low else 0.0
            rows.append({"tuner": label, "change": k, "at_s": b.t, "phase_oracle_bps": phase_best[k],
                         "recovered_s": took, "intervals": took / every, "interval_s": every})
    return rows


def qos_rows(setup: Setup = Setup(), *, workloads=("w1", "lcls", "w4"), fractions=(0.3, 0.6, 0.9),
             variants: dict[str, FStreamVariant] | None = None) -> list[dict]:
    """QoS |error| per (variant, workload, target): median and p90 after the first three decision windows."""
    if variants is None:
        variants = {"thesis": THESIS, **{f"thesis+{s}": FStreamVariant(frozenset({s})) for s in QOS_SWITCHES},
                    "default": DEFAULT}
    rows = []
    for (label, v), name, frac in itertools.product(variants.items(), workloads, fractions):
        target = frac * setup.path.bandwidth_bps
        w = setup.workload(name, "backlogged")
        r = setup.run(FStreamTuner(path=setup.path, target_throughput_bps=target, variant=v), w)
        window = v.interval_for(setup.path.rtt_s)
        # judge each decision window (the thesis reports per-interval throughput), after three of them
        errs = []
        t_end = 0.7 * r.total_time_s  # the tail drains the queue and cannot hold any target
        start, acc_b, acc_t = 3 * window, 0.0, 0.0
        for iv in r.intervals:
            if iv["t"] <= start or iv["t"] > t_end:
                continue
            acc_b += iv["bytes"]
            acc_t += iv.get("dt", OBSERVE_S)
            if acc_t >= window - 1e-9:
                errs.append(abs(acc_b * 8 / acc_t - target) / target)
                acc_b, acc_t = 0.0, 0.0
        errs.sort()
        rows.append({"variant": label, "workload": name, "target": frac, "windows": len(errs),
                     "median_err": statistics.median(errs) if errs else float("nan"),
                     "p90_err": errs[math.ceil(0.9 * len(errs)) - 1] if errs else float("nan"), "result": r})
    return rows
