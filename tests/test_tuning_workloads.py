"""Workload definitions: deterministic, scaled, and the size classes the thesis describes."""

from __future__ import annotations

import pytest

from fstream_provider.tuning.workloads import WORKLOADS, default_scale, make_workload


def test_default_scale_keeps_reference_and_scales_with_bdp():
    assert default_scale(10e9, 0.040) == pytest.approx(1.0)
    assert default_scale(1e9, 0.040) == pytest.approx(0.1)
    assert default_scale(100e9, 0.100) == pytest.approx(25.0)


@pytest.mark.parametrize("name", WORKLOADS)
def test_workload_is_deterministic_and_runs_1_to_2_minutes_at_line_rate(name):
    a = make_workload(name, scale=0.1, seed=7)
    b = make_workload(name, scale=0.1, seed=7)
    assert a == b
    assert a != make_workload(name, scale=0.1, seed=8)
    assert len(a.batches) == 4
    assert [bt.t for bt in a.batches] == [0.0, 5.0, 10.0, 15.0]
    seconds_at_1g = a.total_bytes * 8 / 1e9
    assert 55 <= seconds_at_1g <= 125
    assert len({f.path for f in a.files}) == len(a.files)


def test_w2_starts_large_then_small_by_the_0_4_second_rule():
    bw = 1e9
    w = make_workload("w2", scale=default_scale(bw, 0.04))
    small = [all(f.size * 8 / bw < 0.4 for f in b.files) for b in w.batches]
    large = [all(f.size * 8 / bw >= 0.4 for f in b.files) for b in w.batches]
    assert large == [True, False, True, False]
    assert small == [False, True, False, True]


def test_scale_multiplies_sizes_and_count_factor_thins():
    full = make_workload("sra", scale=1.0)
    tenth = make_workload("sra", scale=0.1)
    assert tenth.total_bytes == pytest.approx(full.total_bytes * 0.1, rel=1e-3)
    thin = make_workload("w3", count_factor=0.01)
    assert 0 < len(thin.files) < 60


def test_unknown_workload_is_refused_with_the_name():
    with pytest.raises(ValueError, match="w9"):
        make_workload("w9")


def test_heldout_draws_its_shape_from_the_seed_within_the_stated_bounds():
    """HARP's held-out transfers (issue 44): 1-3 groups, 5-10 GB at reference scale, everything at t=0."""
    from fstream_provider.tuning.workloads import HELDOUT

    shapes = set()
    for seed in range(20):
        w = make_workload(HELDOUT, seed=seed, scale=0.1)
        assert w.batches[0].t == 0.0 and len(w.batches) == 1
        assert 0.45e9 <= w.total_bytes <= 1.05e9  # +-50 % per file around each group's drawn total
        groups = {f.path.split("/")[1] for f in w.files}
        assert 1 <= len(groups) <= 3
        assert all(0.25e6 * 0.5 <= f.size <= 100e6 * 1.5 for f in w.files)
        shapes.add((len(w.files), len(groups)))
        assert make_workload(HELDOUT, seed=seed, scale=0.1).files == w.files  # the seed replays it
    assert len(shapes) >= 15 and {g for _, g in shapes} == {1, 2, 3}
