"""The tuner registry: one list of built tuners; cc/p/pp are the start of adaptive tuners and refused elsewhere."""

from __future__ import annotations

import pytest

from fstream_provider.tuning.base import ClusterStats, FileInfo, Observation, PathInfo
from fstream_provider.tuning.heuristic import heuristic
from fstream_provider.tuning.registry import TUNER_NAMES, TUNERS, check_options, make_tuner, tuner_info
from fstream_provider.tuning.sim import dtn_storage, simulate
from fstream_provider.tuning.workloads import Batch, Workload

PATH = PathInfo(1e9, 0.040, tcp_buffer=2**20, max_cc=32)
ADAPTIVE = [n for n in TUNER_NAMES if TUNERS[n].adaptive]
NO_LAYOUT = [n for n in TUNER_NAMES if not TUNERS[n].layout]


def _big() -> Workload:
    return Workload("big", [Batch(0.0, [FileInfo(f"big/{i}.h5", 150_000_000, "h5") for i in range(60)])])


def test_registry_lists_only_built_tuners_each_with_a_summary():
    assert TUNER_NAMES == ("fixed", "static", "dynamic", "fstream", "globus", "adaptivecc", "harp")
    for name, info in TUNERS.items():
        assert info.name == name and info.summary
        assert make_tuner(name, path=PATH).name == name
        assert bool(info.layout) or info.no_layout  # a refusal always says why
    assert ADAPTIVE == ["fstream", "adaptivecc"] and NO_LAYOUT == ["static", "dynamic", "globus", "harp"]
    assert [n for n in TUNER_NAMES if TUNERS[n].uses_transfer_history] == ["fstream", "harp"]


@pytest.mark.parametrize("name", ADAPTIVE)
def test_adaptive_tuners_start_at_the_given_layout_in_the_simulator(name):
    res = simulate(make_tuner(name, path=PATH, cc=7, p=3, pp=5), _big(), PATH, storage=dtn_storage(1e9))
    assert res.completed
    assert [(l["cc"], l["p"], l["pp"]) for l in res.intervals[0]["layouts"]] == [(7, 3, 5)]
    assert "given cc=7 p=3 pp=5" in res.intervals[0]["reason"]
    # without a start they begin at the heuristic (cc=2 for these files), so the start is what moved them
    plain = simulate(make_tuner(name, path=PATH), _big(), PATH, storage=dtn_storage(1e9))
    assert plain.intervals[0]["cc"] == 2


@pytest.mark.parametrize("name", ADAPTIVE)
def test_a_partial_start_takes_the_rest_from_the_heuristic(name):
    t = make_tuner(name, path=PATH, cc=5)
    files = _big().batches[0].files
    t.update(Observation(0.0, 0.0, 0, 0.0, files, {t.cluster_of(files[0]): ClusterStats(0, 0.0, 0, 60, 60 * 150_000_000)}))
    s = t.suggest()
    (lay,) = s.layouts
    h = heuristic(150_000_000, 60, PATH)
    assert (lay.cc, lay.p, lay.pp) == (5, h.p, h.pp) and h.cc != 5
    assert "the rest from the heuristic" in s.reason


def test_fixed_uses_the_layout_for_the_whole_transfer():
    res = simulate(make_tuner("fixed", path=PATH, cc=3, p=2, pp=1), _big(), PATH)
    assert {(iv["cc"], iv["p"], iv["pp"]) for iv in res.intervals} == {(3, 2, 1)}


@pytest.mark.parametrize("name", NO_LAYOUT)
def test_tuners_without_a_starting_point_refuse_cc_p_pp_naming_the_tuner(name):
    with pytest.raises(ValueError) as e:
        make_tuner(name, path=PATH, p=2)
    text = str(e.value)
    assert f"tuner {name!r} takes no cc/p/pp (got p=2)" in text
    assert TUNERS[name].no_layout in text
    assert "the settings of 'fixed' and the starting point of 'fstream', 'adaptivecc'" in text


def test_unknown_tuner_and_target_refusals_name_the_value_and_the_accepted():
    with pytest.raises(ValueError, match=r"unknown tuner 'harpoon': expected one of fixed, static, dynamic, fstream, "
                                         r"globus, adaptivecc, harp"):
        tuner_info("harpoon")
    with pytest.raises(ValueError, match=r"tuner 'adaptivecc' cannot hold a target throughput; only 'fstream' can"):
        check_options("adaptivecc", target_throughput_bps=1e8)
    assert check_options("fstream", cc=4, target_throughput_bps=1e8).name == "fstream"
