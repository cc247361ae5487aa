"""HARP's Optimizer (Arslan & Kosar, SC'16, §III-B2–3, Eq. 2–5) and channel allocation (Algorithm 1, lines 9–22).

``HarpOptimizer.fit`` is the sample-independent, expensive part, run while a chunk's sample transfer is
in flight (the paper's pipelined cost analysis): filter similar history (``harp_similarity``), group it
into experiment sets, fit a cubic polynomial ``throughput = f_i(cc, p, pp)`` per group (Eq. 2;
scikit-learn's ``PolynomialFeatures(3)`` + ``LinearRegression`` on standardised inputs, written out in numpy in
``harp_cubic`` because importing scikit-learn cost the sender 1.6 s of CPU mid-transfer), drop groups with
R² < 0.6 or too few distinct settings, maximise each model over the integer grid (Eq. 4), then relax
each parameter in turn while the estimate stays >= rho = 0.9 of the maximum (§III-B3).

``HarpOptimizer.predict`` is the sample-dependent part: the error of each model at the sample's settings
(Eq. 3), DBSCAN classes of those errors, class weights 2^0..2^(k-1) and the weighted average of the
relaxed settings (Eq. 5).

Departures, each for a stated reason and each a switch of ``variants.HarpVariant`` (all off in the
``paper`` variant, all on by default):

* ``observed-grid``: the grid of each group is restricted to the range of each parameter the group
  observed and to no more streams (cc x p) than any of its probes ran (a cubic extrapolates wildly; the paper's
  history covered the whole (1..32)^3 grid, ours may not: on the WAN a small-file group's maximum was the box's
  corner cc=16 p=8, the one point whose probe had been cut before it measured), and the prediction is one the
  chunk can run: a channel takes up to pp + 1 files, so pp is lowered until the
  chunk's files keep its cc channels busy (``feedable_pp``; four large files at pp=4 ran on one channel);
* ``sample-rate``: with a sample, the throughput estimate is scaled by T_act / (weighted model estimate at
  the sample): the models predict where the optimum is, the sample says how fast the path is today;
* ``unit-floor``: one channel's throughput (UT) is at least a tenth of one channel's share at the relaxed
  point (``_unit``).

Read, not departed from: DBSCAN runs on |eps_i| / T_act (relative errors, so one ``dbscan_eps`` works at
any rate; the paper gives no unit), and the class with the smallest errors gets the largest weight (the
paper sorts "in descending order based on eps", meaning that the models matching today's load count most).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from fstream_provider.extras import agent_only

try:
    import numpy as np
    import pandas as pd
except ImportError as exc:  # a provider-only install (issue 39)
    raise agent_only(exc, "HARP's regression") from exc

from fstream_provider.tuning.harp_cubic import Cubic, r2 as r2_score, split_1d

from fstream_provider.tuning.harp_fits import rows_digest
from fstream_provider.tuning.harp_similarity import GROUP_WINDOW_S, WEIGHTS, HarpRequest, group_rows, select_similar

Settings3 = tuple[int, int, int]


@dataclass(frozen=True)
class GroupModel:
    """One experiment set's model ``throughput = f(cc, p, pp)`` and its optimum.

    :param name: the group key.
    :param n_rows: rows it was fitted on.
    :param n_settings: distinct (cc, p, pp) among them.
    :param r2: coefficient of determination of the fit.
    :param best: the grid maximiser (Eq. 4).
    :param t_max_bps: the estimate there.
    :param relaxed: the settings after relaxation (§III-B3).
    :param t_relaxed_bps: the estimate there.
    :param unit_bps: the estimate with one channel (Algorithm 1's UT).
    :param bounds: the observed (low, high) of cc, p and pp (the grid searched).
    """

    name: str
    n_rows: int
    n_settings: int
    r2: float
    best: Settings3
    t_max_bps: float
    relaxed: Settings3
    t_relaxed_bps: float
    unit_bps: float
    bounds: tuple[tuple[int, int], ...]
    model: Any = field(repr=False, compare=False, default=None)

    def predict(self, cc: Any, p: Any, pp: Any) -> np.ndarray:
        """Estimated throughput (bits/s) at the given settings (scalars or arrays)."""
        x = np.column_stack([np.atleast_1d(cc), np.atleast_1d(p), np.atleast_1d(pp)]).astype(float)
        return np.maximum(self.model.predict(x), 0.0) * 1e6


@dataclass(frozen=True)
class FittedChunk:
    """The sample-independent part of the Optimizer for one chunk (``reused``: groups taken from the fit cache)."""

    request: HarpRequest
    threshold: float
    entries: int
    groups: tuple[GroupModel, ...]
    dropped: dict[str, str]
    reason: str
    fit_seconds: float
    reused: int = 0


@dataclass(frozen=True)
class Prediction:
    """What the Optimizer recommends for one chunk, and why.

    :param fallback: True when no group could be used: the caller keeps its heuristic.
    :param throughput_bps: the estimated throughput at (cc, p, pp) (scaled by the sample when given).
    :param unit_bps: estimated throughput with one channel (Algorithm 1's UT), scaled likewise.
    :param weights: each kept group's weight.
    :param errors: each kept group's relative error at the sample's settings.
    """

    chunk: str
    cc: int
    p: int
    pp: int
    throughput_bps: float
    unit_bps: float
    weights: dict[str, float]
    errors: dict[str, float]
    entries: int
    groups_kept: int
    r2_median: float
    fallback: bool
    reason: str
    seconds: float


def _fmt(bps: float) -> str:
    return f"{bps / 1e6:.0f} Mbit/s" if bps >= 1e6 else f"{bps / 1e3:.0f} kbit/s"


class HarpOptimizer:
    """The Optimizer with the paper's settings; every number is a parameter.

    :param weights: similarity weights (bandwidth, RTT, BDP/buffer, chunk, file size, file count).
    :param min_entries: lower the threshold until this many entries are similar. The paper asks for
        3,000 of its 21,000 (one 216-point grid sweep per group, >= 15 groups); our calibration sweeps
        ~40-120 settings per chunk and pass, so 300 (a few sweeps) plays the same role; a smaller history
        asks for a quarter of itself, at least one group's worth (``entries_needed``).
    :param threshold_start: first similarity threshold (0.99).
    :param threshold_step: how much it drops each time (0.01).
    :param threshold_floor: never below this (then whatever matched is used, and the reason says so).
    :param window_s: rows of a path and chunk within this window form one group (transfer intervals).
    :param degree: polynomial degree (3: cubic, §III-B2).
    :param r2_min: groups whose fit has a lower R² are dropped (0.6).
    :param min_settings: distinct settings a group needs (default: the cubic's 20 coefficients).
    :param rho: relaxation keeps at least this share of the estimate (0.9).
    :param dbscan_eps: DBSCAN radius on relative errors (0.1 = models within 10 % of each other).
    :param max_cc: grid bound for concurrency.
    :param max_p: grid bound for parallelism.
    :param max_pp: grid bound for pipelining.
    :param min_pp: lowest pipelining on the grid (FStream allows 0: no file queued ahead).
    :param clock: seconds counter (injected in tests).
    :param variant: which departures from the paper are on (``variants.HarpVariant``; None: all).
    :param fit_cache: a ``harp_fits.GroupFitCache``: a group whose rows were fitted before (with the same
        settings) reuses that fit (None: every group is fitted every time).
    """

    def __init__(self, *, weights=WEIGHTS, min_entries: int = 300, threshold_start: float = 0.99,
                 threshold_step: float = 0.01, threshold_floor: float = 0.5, window_s: float = GROUP_WINDOW_S,
                 degree: int = 3, r2_min: float = 0.6, min_settings: int | None = None, rho: float = 0.9,
                 dbscan_eps: float = 0.1, max_cc: int = 32, max_p: int = 32, max_pp: int = 32, min_pp: int = 0,
                 clock: Callable[[], float] = time.perf_counter, variant: Any = None, fit_cache: Any = None) -> None:
        from fstream_provider.tuning.variants import HarpVariant

        self.variant = variant if variant is not None else HarpVariant()
        if not 0 < rho <= 1 or degree < 1 or min_entries < 1 or dbscan_eps <= 0:
            raise ValueError(f"HARP optimizer: need 0 < rho ({rho}) <= 1, degree ({degree}) >= 1, min_entries "
                             f"({min_entries}) >= 1 and dbscan_eps ({dbscan_eps}) > 0")
        if min(max_cc, max_p) < 1 or max_pp < min_pp or min_pp < 0:
            raise ValueError(f"HARP optimizer: bad grid bounds cc<={max_cc}, p<={max_p}, pp {min_pp}..{max_pp}")
        self.weights, self.min_entries = weights, min_entries
        self.threshold = (threshold_start, threshold_step, threshold_floor)
        self.window_s, self.degree, self.r2_min, self.rho, self.dbscan_eps = window_s, degree, r2_min, rho, dbscan_eps
        self.min_settings = min_settings if min_settings is not None else math.comb(3 + degree, degree)
        self.max_cc, self.max_p, self.max_pp, self.min_pp = max_cc, max_p, max_pp, min_pp
        self.clock = clock
        self.fit_cache = fit_cache

    # -- fit: the sample-independent part -------------------------------------------------------
    def fit(self, history: pd.DataFrame, request: HarpRequest) -> FittedChunk:
        t0 = self.clock()
        usable = self._usable(history)
        start, step, floor = self.threshold
        similar, thr, note = select_similar(usable, request, min_entries=self.entries_needed(len(usable)),
                                            start=start, step=step, floor=floor, weights=self.weights,
                                            log_features=self.variant.on("log-features"))
        groups, dropped, reused = [], {}, 0
        for name, rows in group_rows(similar, window_s=self.window_s).items():
            (model, why), hit = self._fit_group_cached(name, rows)
            reused += hit
            if model is None:
                dropped[name] = why
            else:
                groups.append(model)
        why_dropped = "; ".join(f"{n.split('|')[-1] if '|' in n else n}: {w}" for n, w in list(dropped.items())[:3])
        reason = (f"{note}, {len(groups)} of {len(groups) + len(dropped)} groups kept"
                  + (f" (dropped: {why_dropped}{'...' if len(dropped) > 3 else ''})" if dropped else ""))
        return FittedChunk(request, thr, len(similar), tuple(groups), dropped, reason, self.clock() - t0,
                           reused=reused)

    def fit_signature(self) -> tuple:
        """Every setting a group's fit depends on (``fit_group``, ``relax``, ``_unit``): part of a fit cache key."""
        return (self.degree, self.r2_min, self.min_settings, self.rho, self.max_cc, self.max_p, self.max_pp,
                self.min_pp, self.variant.on("observed-grid"), self.variant.on("unit-floor"))

    def _fit_group_cached(self, name: str, rows: pd.DataFrame) -> tuple[tuple[GroupModel | None, str], bool]:
        """``fit_group``, or its earlier result for the same rows when a fit cache is given."""
        if self.fit_cache is None:
            return self.fit_group(name, rows), False
        key = (self.fit_signature(), name, rows_digest(rows))
        return self.fit_cache.get_or_fit(key, lambda: self.fit_group(name, rows))

    def entries_needed(self, usable: int) -> int:
        """How many similar entries to look for: ``min_entries``, scaled down for a small history to a
        quarter of it, at least one group's worth of settings (asking for more than one chunk's rows
        would lower the threshold until other chunks come in: chunk weighs 10 of 28)."""
        return int(min(self.min_entries, max(self.min_settings, usable // 4)))

    @staticmethod
    def _usable(history: pd.DataFrame) -> pd.DataFrame:
        if history is None or len(history) == 0:
            return pd.DataFrame(columns=["throughput_bps"]) if history is None else history
        keep = history["throughput_bps"].astype(float) > 0
        if "source_limited" in history:
            keep &= ~history["source_limited"].astype(bool)
        return history[keep]

    def fit_group(self, name: str, rows: pd.DataFrame) -> tuple[GroupModel | None, str]:
        """Fit one experiment set; (None, why) when it cannot be used."""
        x = rows[["cc", "p", "pp"]].to_numpy(float)
        y = rows["throughput_bps"].to_numpy(float) / 1e6
        n_settings = len({tuple(r) for r in x})
        if n_settings < self.min_settings:
            return None, f"{n_settings} distinct settings < {self.min_settings}"
        model = Cubic(self.degree).fit(x, y)
        r2 = float(r2_score(y, model.predict(x)))
        if not r2 >= self.r2_min:
            return None, f"R² {r2:.2f} < {self.r2_min}"
        lo = x.min(axis=0).astype(int)
        hi = x.max(axis=0).astype(int)
        if not self.variant.on("observed-grid"):  # the paper: the whole grid
            lo, hi = (1, 1, self.min_pp), (self.max_cc, self.max_p, self.max_pp)
        bounds = ((max(1, lo[0]), min(self.max_cc, hi[0])), (max(1, lo[1]), min(self.max_p, hi[1])),
                  (max(self.min_pp, lo[2]), min(self.max_pp, hi[2])))
        if any(b[0] > b[1] for b in bounds):
            return None, f"observed settings outside the grid bounds {bounds}"
        f = GroupModel(name, len(rows), n_settings, r2, (0, 0, 0), 0.0, (0, 0, 0), 0.0, 0.0, bounds, model)
        grid = np.stack(np.meshgrid(*[np.arange(a, b + 1) for a, b in bounds], indexing="ij"), -1).reshape(-1, 3)
        if self.variant.on("observed-grid"):  # nor more streams than any of its probes ran (relax only lowers them)
            grid = grid[grid[:, 0] * grid[:, 1] <= int((x[:, 0] * x[:, 1]).max())]
        est = f.predict(grid[:, 0], grid[:, 1], grid[:, 2])
        i = int(np.argmax(est))
        best, t_max = tuple(int(v) for v in grid[i]), float(est[i])
        relaxed, t_rel = self.relax(f, best, t_max)
        unit = self._unit(f, relaxed, t_rel, floor=self.variant.on("unit-floor"))
        return GroupModel(name, len(rows), n_settings, r2, best, t_max, relaxed, t_rel, unit, bounds, model), ""

    def relax(self, f: GroupModel, best: Settings3, t_max: float) -> tuple[Settings3, float]:
        """§III-B3: lower cc while f stays >= rho x T_max, update T_max, then p, then pp."""
        cur, t = list(best), t_max
        for k in range(3):
            lo = f.bounds[k][0]
            while cur[k] - 1 >= lo:
                trial = list(cur)
                trial[k] -= 1
                v = float(f.predict(*trial)[0])
                if v < self.rho * t:
                    break
                cur = trial
            t = float(f.predict(*cur)[0])
        return (cur[0], cur[1], cur[2]), t

    @staticmethod
    def _unit(f: GroupModel, s: Settings3, t_relaxed: float, floor: bool = True) -> float:
        """One channel's throughput (UT): the model at cc=1 (or the lowest observed cc, per channel); where that
        is under a tenth of one channel's share at the relaxed point (a cubic dipping to ~zero at the edge of
        its data: Algorithm 1 would then give the chunk every channel), that share."""
        lo = f.bounds[0][0]
        if lo <= 1:
            unit = float(f.predict(1, s[1], s[2])[0])
        else:
            unit = float(f.predict(lo, s[1], s[2])[0]) / lo  # one channel's share at the lowest observed cc
        share = t_relaxed / max(1, s[0])
        if floor and unit < share / 10:  # a cubic can dip to ~zero at the edge of its data: one channel's share
            unit = share
        return unit if floor else max(unit, 1e-9)  # the paper's UT as is, kept > 0 (Algorithm 1 divides by it)

    # -- predict: the sample-dependent part -----------------------------------------------------
    def predict(self, fitted: FittedChunk, sample: tuple[int, int, int, float] | None) -> Prediction:
        t0 = self.clock()
        req = fitted.request
        if not fitted.groups:
            return Prediction(req.chunk, 0, 0, 0, 0.0, 0.0, {}, {}, fitted.entries, 0, float("nan"), True,
                              f"no usable history: {fitted.reason}", fitted.fit_seconds + self.clock() - t0)
        groups = fitted.groups
        errors: dict[str, float] = {}
        if sample is not None:
            cc0, p0, pp0, t_act = sample
            if not t_act > 0:
                raise ValueError(f"HARP sample throughput must be > 0, got {t_act!r}")
            at_sample = np.array([float(g.predict(cc0, p0, pp0)[0]) for g in groups])
            rel = np.abs(t_act - at_sample) / t_act  # Eq. 3, relative
            labels = split_1d(rel, self.dbscan_eps)  # DBSCAN(eps, min_samples=1) on one dimension
            classes = sorted(set(labels), key=lambda c: -float(rel[labels == c].mean()))  # largest error first
            class_w = {c: 2.0 ** k for k, c in enumerate(classes)}
            w = np.array([class_w[c] for c in labels])
            errors = {g.name: float(e) for g, e in zip(groups, rel)}
        else:
            w = np.ones(len(groups))
        wt = w / w.sum()
        cc = int(round(sum(g.relaxed[0] * x for g, x in zip(groups, wt))))
        p = int(round(sum(g.relaxed[1] * x for g, x in zip(groups, wt))))
        pp = int(round(sum(g.relaxed[2] * x for g, x in zip(groups, wt))))
        est = float(sum(g.t_relaxed_bps * x for g, x in zip(groups, wt)))
        unit = float(sum(g.unit_bps * x for g, x in zip(groups, wt)))
        fed = feedable_pp(max(1, cc), max(0, pp), req.file_count) if self.variant.on("observed-grid") else pp
        fed_note = ""
        if fed != pp:  # the groups' optimum cannot run on this chunk: keep its channels, feed them
            fed_note = (f", pp {pp} -> {fed} (a channel takes pp + 1 files; {req.file_count} file(s) keep {cc} "
                        f"channels busy only at pp <= {fed})")
            pp = fed
            est = float(sum(float(g.predict(cc, p, pp)[0]) * x for g, x in zip(groups, wt)))
        scale_note = ""
        if sample is not None and self.variant.on("sample-rate"):
            model_at_sample = float(sum(float(g.predict(sample[0], sample[1], sample[2])[0]) * x
                                        for g, x in zip(groups, wt)))
            if model_at_sample > 0:
                k = sample[3] / model_at_sample
                est, unit = min(est * k, req.bandwidth_bps), min(unit * k, req.bandwidth_bps)  # never above the link
                scale_note = f", sample {_fmt(sample[3])} vs models {_fmt(model_at_sample)}"
        r2s = [g.r2 for g in groups]
        reason = (f"{fitted.reason}, R² median {np.median(r2s):.2f}"
                  + (f", {len(set(w))} error class(es)" if sample is not None else ", no sample: equal weights")
                  + f"{scale_note}{fed_note} -> cc={cc} p={p} pp={pp}, predicted {_fmt(est)}")
        return Prediction(req.chunk, max(1, cc), max(1, p), max(0, pp), est, unit,
                          {g.name: float(x) for g, x in zip(groups, w)}, errors, fitted.entries, len(groups),
                          float(np.median(r2s)), False, reason, fitted.fit_seconds + self.clock() - t0)

    def optimize(self, history: pd.DataFrame, request: HarpRequest,
                 sample: tuple[int, int, int, float] | None) -> Prediction:
        """``fit`` then ``predict``."""
        return self.predict(self.fit(history, request), sample)


def feedable_pp(cc: int, pp: int, files: int) -> int:
    """The deepest pipeline at which ``files`` keep ``cc`` channels busy: a channel takes up to ``pp + 1`` files, so
    four large files at pp=4 ran on one channel (the calibration's probes at cc 1, 2 and 4 all measured 280 Mbit/s
    on the 40 ms WAN, issue 44), and a group's optimum fitted on other file counts (cc=8 pp=4) cannot run as such on
    a chunk of a few files."""
    if cc <= 1 or files < 1:
        return pp
    return min(pp, max(0, files // cc - 1))


def allocate_channels(chunks: Sequence[tuple[str, float, Prediction]]) -> dict[str, int]:
    """Algorithm 1 lines 9–22: ``cc'_i = max(cc_est_i, floor(maxCC x weight_i / totalWeight))``.

    ``weight_i = size_i x TT / UT_i`` with ``TT`` the sum of the unit throughputs: a large chunk that is
    slow per channel gets the larger share of the largest concurrency any chunk asked for.

    :param chunks: (chunk name, its size in bytes, its prediction) for each chunk still to transfer.
    """
    if not chunks:
        return {}
    for name, size, pred in chunks:
        if not pred.unit_bps > 0 or size < 0:
            raise ValueError(f"allocate_channels: chunk {name!r} needs a unit throughput > 0 and a size >= 0 "
                             f"(got {pred.unit_bps!r}, {size!r})")
    max_cc = max(1, max(p.cc for _, _, p in chunks))
    tt = sum(p.unit_bps for _, _, p in chunks)
    weight = {name: size * tt / pred.unit_bps for name, size, pred in chunks}
    total = sum(weight.values()) or 1.0
    return {name: max(pred.cc, math.floor(max_cc * weight[name] / total)) for name, _, pred in chunks}


def estimation_accuracy(predicted_bps: float, actual_bps: float) -> float:
    """§IV-A: ``1 - |predicted - actual| / actual`` (0 when it is off by the actual value or more)."""
    if not actual_bps > 0:
        raise ValueError(f"estimation accuracy: actual throughput must be > 0, got {actual_bps!r}")
    return max(0.0, 1.0 - abs(predicted_bps - actual_bps) / actual_bps)


def validation_accuracy(history: pd.DataFrame, request: HarpRequest, *, test_share: float = 0.3, seed: int = 0,
                        optimizer: HarpOptimizer | None = None) -> dict:
    """§IV-A: train on 70 % of the groups, project onto each test group's own model.

    ``Thr_projected = f_test(cc, p, pp)_train`` and ``Thr_test = max f_test``; the paper prints the error
    ratio ``|Thr_test - Thr_projected| / Thr_projected`` and reports accuracy, i.e. one minus it, averaged
    here over the test groups (each test group keeps its own model: groups differ in background load).
    """
    from fstream_provider.tuning.harp_sample_cost import group_validation

    if not 0 < test_share < 1:
        raise ValueError(f"validation: test_share {test_share!r} must be between 0 and 1")
    opt = optimizer or HarpOptimizer()
    fitted = opt.fit(history, request)
    out = group_validation(fitted.groups, test_share=test_share, seed=seed)
    if out["accuracy"] is None:
        return {"accuracy": None, "n_train": out["n_train"], "n_test": 0,
                "reason": f"needs at least 2 usable groups ({fitted.reason})"}
    return {**out,
            "reason": f"{out['n_train']} training and {out['n_test']} test groups of {fitted.entries} entries"}
