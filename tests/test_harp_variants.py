"""HARP as the paper writes it (variant ``paper``) beside ours: each departure is a switch that changes
exactly what its docstring says, on synthetic history whose answer is known by construction."""

from __future__ import annotations

import pytest

from fstream_provider.model.spec import TransferSpec
from fstream_provider.tuning.base import FileInfo, Observation, PathInfo
from fstream_provider.tuning.harp_history import HistoryRow, to_frame
from fstream_provider.tuning.harp_model import HarpOptimizer
from fstream_provider.tuning.harp_similarity import HarpRequest, similarity
from fstream_provider.tuning.registry import make_tuner
from fstream_provider.tuning.variants import HARP_PAPER, HARP_SWITCHES, HarpVariant
from test_harp_optimizer import REQ, quad, rows

DEST = "fstream://127.0.0.1:9/x"
PATH = PathInfo(1e9, 0.04, tcp_buffer=1 << 20, max_cc=32, max_p=16)


def test_harp_variants_parse_name_and_refuse_unknown_switches():
    assert HarpVariant.parse("paper") == HARP_PAPER and HARP_PAPER.name == "paper"
    assert HarpVariant.parse(None).switches == frozenset(HARP_SWITCHES)
    v = HarpVariant.parse("paper+observed-grid")
    assert v.switches == {"observed-grid"} and v.name == "paper+observed-grid"
    assert HarpVariant.parse("default-sample-rate").name == "default-sample-rate"
    with pytest.raises(ValueError, match=r"harp variant 'paper\+fast': unknown switch 'fast'; known: log-features"):
        HarpVariant.parse("paper+fast")
    with pytest.raises(ValueError, match=r"harp variant 'thesis': expected 'paper' or 'default'"):
        HarpVariant.parse("thesis")


def _linear_in_cc(cc, p, pp):  # rises with every channel up to the largest observed (16): a cubic fits it exactly
    return 100e6 + 20e6 * cc - 8e6 * (p - 4) ** 2


def test_the_paper_maximises_over_the_whole_grid_ours_within_what_each_group_observed():
    frame = to_frame(rows(_linear_in_cc, groups=2))
    paper = HarpOptimizer(rho=1.0, max_cc=32, variant=HarpVariant.parse("paper")).fit(frame, REQ)
    ours = HarpOptimizer(rho=1.0, max_cc=32, variant=HarpVariant.parse("paper+observed-grid")).fit(frame, REQ)
    assert all(g.best[:2] == (32, 4) for g in paper.groups)  # extrapolated past the data to the grid's edge
    assert all(g.best[:2] == (16, 4) for g in ours.groups)  # the largest cc the history ever ran


def _one_row(size: float) -> HistoryRow:
    return HistoryRow("src", "dst:1", 1e9, 0.04, 1 << 20, "small", size, 200, 4, 2, 0, 5e8, 1.0, 1.0, "g", "probe")


def test_the_paper_scales_file_size_linearly_so_files_far_below_the_largest_look_alike():
    frame = to_frame([_one_row(1e3), _one_row(1e5), _one_row(1e7)])
    req = HarpRequest(bandwidth_bps=1e9, rtt_s=0.04, tcp_buffer=1 << 20, chunk="small", avg_file_size=1e5,
                      file_count=200)
    lin = similarity(frame, req, log_features=False)
    log = similarity(frame, req, log_features=True)
    # Linear: 1 kB and 100 kB are both ~0 of the 10 MB maximum, so a file 100x smaller than the request
    # looks identical to it while one 100x larger does not.
    assert lin[1] - lin[0] < 1e-4 and lin[1] - lin[2] > 0.03
    # Log scale: a factor of 100 counts the same in either direction, and both are told apart from the request.
    assert abs(log[0] - log[2]) < 1e-3 and min(log[1] - log[0], log[1] - log[2]) > 1e-3


def test_the_paper_reports_the_models_estimate_ours_scales_it_by_the_samples_rate():
    frame = to_frame(rows(quad))
    sample = (10, 4, 0, 255e6)  # the path runs at half of what the history saw at the optimum
    for variant, expect in ((HARP_PAPER, 510e6), (HarpVariant.parse("paper+sample-rate"), 255e6)):
        opt = HarpOptimizer(rho=1.0, variant=variant)
        pred = opt.predict(opt.fit(frame, REQ), sample)
        assert (pred.cc, pred.p) == (10, 4) and pred.throughput_bps == pytest.approx(expect, rel=0.02), variant.name


def _start(tuner) -> None:
    for i in range(200):  # the agent asks for each file's cluster as it is listed, then reports
        tuner.cluster_of(FileInfo(f"f{i}", 2 * 10**6, "dat"))
    tuner.update(Observation(0.0, 0.0))


def test_the_variant_reaches_harp_from_the_spec_and_names_itself_in_every_reason():
    spec = TransferSpec.from_options(["/a"], DEST, tuner="harp", variant="paper")
    assert spec.tuner_variant() == HARP_PAPER
    history = to_frame(rows(quad, size=2e6, count=200))
    tuner = make_tuner("harp", path=PATH, transfer_history=history, variant=spec.tuner_variant())
    assert tuner.variant == HARP_PAPER and tuner.optimizer.variant == HARP_PAPER
    _start(tuner)
    assert tuner.suggest().reason.startswith("harp (paper): sample small:")
    default = make_tuner("harp", path=PATH, transfer_history=history)
    _start(default)  # sample-pays: the heuristic first, the sample only if the models say it pays
    assert default.suggest().reason.startswith("harp: every chunk at the heuristic while")
