"""Regression guards for the tuning science (issue #16), in the simulator of the emulated WAN's path."""

import statistics

import pytest

from fstream_provider.tuning import ablation as A
from fstream_provider.tuning.variants import DEFAULT, THESIS

GRID = ((2, 4, 8, 16, 32), (1, 4, 16), (0, 4, 32))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["w1", "w3", "sra", "lcls", "mix"])
def test_default_reaches_0_9_of_the_grid_oracle_when_backlogged(name):
    setup = A.Setup()  # full size: short runs are dominated by start-up, not by tuning
    w = setup.workload(name, "backlogged")
    best, note = A.oracle(setup, w, GRID)
    got = setup.run(A.FStreamTuner(path=setup.path, variant=DEFAULT), w).throughput_bps
    static = setup.run(A.make_tuner("static", path=setup.path), w).throughput_bps
    assert got >= 0.9 * best, (name, got / best, note)
    assert got >= static * 0.99, (name, got / static)


def test_qos_thesis_within_its_published_error_range_default_within_goal():
    rows = A.qos_rows(variants={"thesis": THESIS, "default": DEFAULT})
    thesis = [r for r in rows if r["variant"] == "thesis"]
    ours = [r for r in rows if r["variant"] == "default"]
    assert all(r["windows"] >= 2 for r in rows), [(r["variant"], r["workload"], r["windows"]) for r in rows]
    # the thesis reports 4-19 % error (ch. 4.2, QoS figures); the plain ladder lands in that range overall
    assert 0.04 <= statistics.median(r["median_err"] for r in thesis) <= 0.19
    assert statistics.median(r["median_err"] for r in ours) <= 0.03
    assert max(r["p90_err"] for r in ours) <= 0.05, [(r["workload"], r["target"], r["p90_err"]) for r in ours]


def test_mix_change_default_recovers_within_three_intervals():
    rows = A.recovery_rows(A.Setup(), tuners=("default",), grid=GRID)
    assert len(rows) == 2 and all(r["intervals"] <= 3 for r in rows), rows
