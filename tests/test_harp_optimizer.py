"""HARP's Optimizer on synthetic history whose optimum is known by construction (§III-B, Algorithm 1, §IV-A)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fstream_provider.tuning.harp_history import HistoryRow, to_frame
from fstream_provider.tuning.harp_model import (
    HarpOptimizer,
    Prediction,
    allocate_channels,
    estimation_accuracy,
    validation_accuracy,
)
from fstream_provider.tuning.harp_similarity import HarpRequest, group_rows, select_similar, similarity

REQ = HarpRequest(bandwidth_bps=1e9, rtt_s=0.04, tcp_buffer=1 << 20, chunk="small", avg_file_size=2e6,
                  file_count=200)
GRID = [(cc, p, pp) for cc in (1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16) for p in (1, 2, 3, 4, 6, 8) for pp in (0, 2, 8)]


def quad(cc, p, pp, *, peak=(10, 4), top=510e6, pp_gain=0.0):
    """A concave law a cubic represents exactly (positive on GRID): the optimum is at ``peak``; pp adds ``pp_gain``."""
    return top - 2e6 * (cc - peak[0]) ** 2 - 8e6 * (p - peak[1]) ** 2 + pp_gain * pp


def rows(law, *, groups=4, chunk="small", bandwidth=1e9, rtt=0.04, size=2e6, count=200, t0=1_700_000_000,
         label="cal", noise=0.0, seed=0, **kw) -> list[HistoryRow]:
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        for i, (cc, p, pp) in enumerate(GRID):
            thr = max(law(cc, p, pp, **kw) * (1 + rng.normal(0, noise)), 1e3)
            out.append(HistoryRow("src", "dst:1", bandwidth, rtt, 1 << 20, chunk, size, count, cc, p, pp, thr,
                                  t0 + g * 86_400 + i, 1.0, f"{label}{g}:{chunk}", kind="probe"))
    return out


def test_the_optimizer_finds_the_known_optimum_without_relaxation():
    frame = to_frame(rows(quad, noise=0.01))
    fitted = HarpOptimizer(rho=1.0).fit(frame, REQ)
    assert len(fitted.groups) == 4 and all(g.r2 > 0.99 for g in fitted.groups)
    for g in fitted.groups:
        assert g.best[:2] == (10, 4) and abs(g.t_max_bps - 510e6) < 10e6
    pred = HarpOptimizer(rho=1.0).predict(fitted, None)
    assert (pred.cc, pred.p) == (10, 4) and not pred.fallback
    assert "no sample: equal weights" in pred.reason and "-> cc=10 p=4" in pred.reason


def test_relaxation_lowers_what_barely_matters_and_keeps_ninety_percent():
    frame = to_frame(rows(quad, pp_gain=1e3))  # pp: +1 kbit/s per step, nothing
    opt = HarpOptimizer()
    (g, *_), = [HarpOptimizer(rho=1.0).fit(frame, REQ).groups]
    assert g.best == (10, 4, 8)  # the maximiser takes the highest pp for a marginal gain
    fitted = opt.fit(frame, REQ)
    g = fitted.groups[0]
    # cc: 510 - 2 (c-10)^2 >= 459 down to c = 5 (460); then p: 460 - 8 (p-4)^2 >= 414 down to p = 2; pp to 0
    assert g.relaxed == (5, 2, 0)
    assert g.t_relaxed_bps >= 0.9 * 0.9 * g.t_max_bps
    assert g.unit_bps == pytest.approx(quad(1, 2, 0), rel=0.01)


def test_dbscan_weights_favour_the_groups_whose_load_matches_the_sample():
    light = rows(quad, groups=3, peak=(8, 2), top=800e6, label="light")
    heavy = rows(quad, groups=3, peak=(14, 6), top=600e6, label="heavy", t0=1_700_500_000)
    frame = to_frame(light + heavy)
    opt = HarpOptimizer(rho=1.0)
    fitted = opt.fit(frame, REQ)
    assert len(fitted.groups) == 6
    at_sample_light = quad(4, 1, 0, peak=(8, 2), top=800e6)
    at_sample_heavy = quad(4, 1, 0, peak=(14, 6), top=600e6)
    pl = opt.predict(fitted, (4, 1, 0, at_sample_light))
    ph = opt.predict(fitted, (4, 1, 0, at_sample_heavy))
    assert {k: v for k, v in pl.weights.items() if "light" in k} == {k: 2.0 for k in pl.weights if "light" in k}
    assert all(v == 1.0 for k, v in pl.weights.items() if "heavy" in k)
    assert all(v == 2.0 for k, v in ph.weights.items() if "heavy" in k)
    # weighted 2:1, the average lands on the matching side of the middle
    assert pl.cc == round((2 * 8 + 14) / 3) and ph.cc == round((8 + 2 * 14) / 3)
    assert (pl.p, ph.p) == (round((2 * 2 + 6) / 3), round((2 + 2 * 6) / 3)) and "2 error class(es)" in pl.reason
    assert pl.throughput_bps > ph.throughput_bps and "sample 760 Mbit/s" in pl.reason
    assert ph.errors and max(v for k, v in ph.errors.items() if "heavy" in k) < 0.05


def test_similarity_prefers_the_same_path_and_chunk_and_lowers_the_threshold_until_enough():
    same = rows(quad, groups=1)
    lan = rows(quad, groups=1, bandwidth=1e9, rtt=0.0002, label="lan")
    large = rows(quad, groups=1, chunk="large", size=2e9, count=20, label="big")
    frame = to_frame(same + lan + large)
    sim = similarity(frame, REQ)
    n = len(same)
    assert sim[:n].min() > 0.999 and sim[n:2 * n].max() < sim[:n].min() and sim[2 * n:].max() < sim[:n].min()
    kept, thr, note = select_similar(frame, REQ, min_entries=n)
    assert thr == 0.99 and len(kept) == n and set(kept["group"]) == {"cal0:small"}
    kept2, thr2, note2 = select_similar(frame, REQ, min_entries=2 * n)
    assert thr2 < 0.99 and len(kept2) >= 2 * n and f"similarity >= {thr2:.2f}" in note2
    assert len(group_rows(kept2)) >= 2


def test_too_little_history_falls_back_with_the_reason():
    few = [r for r in rows(quad, groups=1) if r.pp == 0 and r.p == 1]  # 11 settings < 20 coefficients
    pred = HarpOptimizer().optimize(to_frame(few), REQ, None)
    assert pred.fallback and "no usable history" in pred.reason and "distinct settings < 20" in pred.reason
    rng = np.random.default_rng(3)
    noise = [HistoryRow.from_dict({**r.to_dict(), "throughput_bps": float(rng.uniform(1e6, 1e9))})
             for r in rows(quad, groups=1)]
    frame = to_frame(noise).drop(columns=["bdp_buffer_ratio"])
    pred = HarpOptimizer().optimize(frame, REQ, None)
    assert pred.fallback and "R² " in pred.reason and "< 0.6" in pred.reason
    empty = HarpOptimizer().optimize(to_frame([]), REQ, None)
    assert empty.fallback and "no history" in empty.reason


def test_algorithm_1_channel_allocation_by_hand():
    def pred(cc, unit):
        return Prediction("x", cc, 1, 0, 0.0, unit, {}, {}, 0, 1, 1.0, False, "", 0.0)
    # maxCC = 12; TT = 100 + 300 = 400; weights: small 1e9 * 400/100 = 4e9, large 3e9 * 400/300 = 4e9
    # cc' = max(cc_est, floor(12 * 0.5)) = max(12, 6) and max(4, 6)
    got = allocate_channels([("small", 1e9, pred(12, 100e6)), ("large", 3e9, pred(4, 300e6))])
    assert got == {"small": 12, "large": 6}
    with pytest.raises(ValueError, match="chunk 'large' needs a unit throughput > 0"):
        allocate_channels([("large", 1e9, pred(4, 0.0))])


def test_validation_accuracy_is_high_on_consistent_history_and_low_when_the_optimum_moves():
    good = validation_accuracy(to_frame(rows(quad, groups=10, noise=0.02)), REQ)
    assert good["accuracy"] >= 0.85 and good["n_test"] == 3 and good["n_train"] == 7
    moved = rows(quad, groups=5) + rows(quad, groups=5, peak=(16, 8), top=1200e6, label="other", t0=1_701_000_000)
    frame = to_frame(moved)
    # some split puts "other" groups (optimum far from the rest) in the test share: the projection misses
    bad = None
    for seed in range(30):
        v = validation_accuracy(frame, REQ, seed=seed)
        if v["accuracy"] is not None and v["accuracy"] < 0.85:
            bad = v
            break
    assert bad is not None, "no split put the moved groups into the test share"
    assert validation_accuracy(to_frame(rows(quad, groups=1)), REQ)["accuracy"] is None


def test_estimation_accuracy_and_bad_input_name_the_problem():
    assert estimation_accuracy(90e6, 100e6) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="actual throughput must be > 0"):
        estimation_accuracy(1.0, 0.0)
    with pytest.raises(ValueError, match="chunk 'huge' is not one of tiny, small, medium, large"):
        HarpRequest(1e9, 0.04, 1 << 20, "huge", 1e6, 10)
    with pytest.raises(ValueError, match="avg_file_size must be > 0"):
        HarpRequest(1e9, 0.04, 1 << 20, "small", -5, 10)
    bad = to_frame(rows(quad, groups=1)).assign(chunk="enormous")
    with pytest.raises(ValueError, match="unknown chunk type"):
        similarity(bad, REQ)
    with pytest.raises(ValueError, match="sample throughput must be > 0"):
        opt = HarpOptimizer()
        opt.predict(opt.fit(to_frame(rows(quad, groups=1)), REQ), (4, 1, 0, 0.0))
    assert isinstance(to_frame([]), pd.DataFrame)


def test_unit_throughput_stays_positive_where_a_model_reaches_zero_at_one_channel():
    # the WAN bench's failure: a model estimating 0 at cc=1 gave UT = 0 and Algorithm 1 raised, failing the
    # transfer; one channel's share at the relaxed point stands in
    frame = to_frame(rows(lambda cc, p, pp: 100e6 * (cc - 1), groups=1))
    g, why = HarpOptimizer().fit_group("g", frame)
    assert g is not None, why
    assert float(g.predict(1, g.relaxed[1], g.relaxed[2])[0]) < 1e6  # ~0 at one channel
    assert g.unit_bps == pytest.approx(g.t_relaxed_bps / g.relaxed[0]) and g.unit_bps > 0
    pred = Prediction("small", g.relaxed[0], g.relaxed[1], g.relaxed[2], g.t_relaxed_bps, g.unit_bps, {}, {}, 0, 1,
                      g.r2, False, "", 0.0)
    assert allocate_channels([("small", 1e9, pred)]) == {"small": g.relaxed[0]}


def test_a_prediction_is_one_the_chunk_can_run_its_pipeline_feeds_every_channel():
    """A group whose optimum is cc=10 with the deepest pipeline (pp=8), asked for nine large files: a channel takes
    pp + 1 files, so at pp=8 one channel takes all nine and the other nine idle (on the 40 ms WAN four large files
    at pp=4 ran on one channel: cc 1, 2 and 4 measured the same 280 Mbit/s, issue 44). The prediction keeps cc=10
    and lowers pp to 0, and says so; with 200 files it is unchanged; the paper's variant keeps it as written."""
    from fstream_provider.tuning.harp_model import feedable_pp
    from fstream_provider.tuning.variants import HARP_PAPER

    frame = to_frame(rows(quad, pp_gain=2e6))
    few = HarpRequest(bandwidth_bps=1e9, rtt_s=0.04, tcp_buffer=1 << 20, chunk="small", avg_file_size=2e6,
                      file_count=9)
    opt = HarpOptimizer(rho=1.0)
    pred = opt.predict(opt.fit(frame, few), None)
    assert (pred.cc, pred.pp) == (10, 0) and "pp 8 -> 0 (a channel takes pp + 1 files; 9 file(s)" in pred.reason
    assert abs(pred.throughput_bps - quad(10, 4, 0, pp_gain=2e6)) < 10e6  # the estimate is at the setting that runs
    many = opt.predict(opt.fit(frame, REQ), None)
    assert (many.cc, many.pp) == (10, 8) and "pp 8 ->" not in many.reason
    paper = HarpOptimizer(rho=1.0, variant=HARP_PAPER)
    assert paper.predict(paper.fit(frame, few), None).pp >= 8  # the whole grid: pp up to 32, as written
    assert [feedable_pp(cc, 4, 9) for cc in (1, 2, 4, 8)] == [4, 3, 1, 0] and feedable_pp(7, 4, 1249) == 4


def test_a_groups_maximum_uses_no_more_streams_than_its_probes_ran():
    """A law rising with cc and p, probed at every grid point but those over 32 streams (on the WAN the cc=16 p=8
    probe of a small-file group was cut before it measured, and the cubic's maximum was that unmeasured corner,
    issue 44): the maximum is at 32 streams at most; the paper's variant searches the whole grid."""
    from fstream_provider.tuning.variants import HARP_PAPER

    def rising(cc, p, pp):
        return 100e6 + 10e6 * cc + 20e6 * p

    frame = to_frame([r for r in rows(rising) if r.cc * r.p <= 32])
    (g, *_) = HarpOptimizer(rho=1.0).fit(frame, REQ).groups
    assert g.best[0] * g.best[1] <= 32 and g.bounds[0] == (1, 16) and g.bounds[1] == (1, 8)
    assert g.best[:2] in {(4, 8), (16, 2)} and abs(g.t_max_bps - rising(*g.best)) < 5e6
    (paper, *_) = HarpOptimizer(rho=1.0, variant=HARP_PAPER).fit(frame, REQ).groups
    assert paper.best[0] * paper.best[1] > 32
