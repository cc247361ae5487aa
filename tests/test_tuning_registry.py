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


TAKES_INTERVAL = [n for n in TUNER_NAMES if TUNERS[n].takes_interval]


def _mixed() -> Workload:
    """Small and large files at once: clustering tuners split the channels and re-split them as work drains."""
    return Workload("mixed", [Batch(0.0, [FileInfo(f"s/{i}.dat", 2_000_000, "dat") for i in range(200)]
                                    + [FileInfo(f"l/{i}.h5", 150_000_000, "h5") for i in range(10)])])


def _run(name: str, interval: float) -> list:
    """What tuner ``name`` did at each max_cc when consulted every ``interval`` seconds (everything arrives at 0)."""
    out = []
    for max_cc in (2, 8):  # 2: the channels are shared between clusters; 8: room for adaptivecc's doubling
        path = PathInfo(1e9, 0.040, tcp_buffer=2**20, max_cc=max_cc)
        res = simulate(make_tuner(name, path=path), _mixed(), path, profile_interval_s=interval,
                       storage=dtn_storage(1e9))
        layouts = [tuple((l["cluster"], l["cc"], l["p"], l["pp"]) for l in iv["layouts"]) for iv in res.intervals]
        out.append((res.total_time_s, res.channels_opened, [x for i, x in enumerate(layouts) if i == 0 or x != layouts[i - 1]]))
    return out


def test_every_tuner_takes_or_refuses_the_profile_interval_and_a_refusal_says_why():
    assert TAKES_INTERVAL == ["static", "dynamic", "fstream", "adaptivecc", "harp"]
    for name, info in TUNERS.items():
        assert info.takes_interval != bool(info.no_interval), name
    for name in set(TUNER_NAMES) - set(TAKES_INTERVAL):
        with pytest.raises(ValueError) as e:
            check_options(name, profile_interval=True)
        assert f"tuner {name!r} takes no profile_interval" in str(e.value) and TUNERS[name].no_interval in str(e.value)
    for name in TAKES_INTERVAL:
        assert check_options(name, profile_interval=True).name == name


@pytest.mark.parametrize("name", TUNER_NAMES)
def test_the_profile_interval_changes_what_the_tuners_taking_it_do_and_nothing_else(name):
    # the simulator consults the tuner every interval, as the agent does between arrivals of files
    often, rarely = _run(name, 0.5), _run(name, 5.0)
    if name in TAKES_INTERVAL:
        assert often != rarely, f"{name} takes a profile interval but did the same at 0.5 s and 5 s"
    else:
        assert often == rarely, f"{name} refuses a profile interval but it changed what it did"
