"""The simulator's model: stream caps, per-file round trips, slow start, storage, background, determinism."""

from __future__ import annotations

import time

import pytest

from fstream_provider.tuning.base import FileInfo, PathInfo
from fstream_provider.tuning.registry import make_tuner
from fstream_provider.tuning.fixed import FixedTuner
from fstream_provider.tuning.sim import StorageModel, dtn_storage, simulate
from fstream_provider.tuning.workloads import Batch, Workload, make_workload

PATH = PathInfo(1e9, 0.040, tcp_buffer=2**20, max_cc=32)
STREAM = 2**20 * 8 / 0.040  # one stream's cap, ~210 Mbit/s


def one_batch(n: int, size: int) -> Workload:
    return Workload("t", [Batch(0.0, [FileInfo(f"f{i}", size) for i in range(n)])])


def test_one_stream_is_capped_by_buffer_over_rtt():
    res = simulate(FixedTuner(cc=1, p=1, pp=0), one_batch(1, 200_000_000), PATH)
    assert res.throughput_bps == pytest.approx(STREAM, rel=0.05)


def test_many_streams_share_the_bottleneck():
    res = simulate(FixedTuner(cc=4, p=4, pp=0), one_batch(8, 200_000_000), PATH)
    assert 0.95e9 <= res.throughput_bps <= 1e9


def test_each_file_costs_a_round_trip_without_pipelining_and_pp_hides_it():
    small = one_batch(400, 100_000)  # 0.8 ms at line rate, 40 ms RTT
    no_pp = simulate(FixedTuner(cc=1, p=1, pp=0), small, PATH)
    with_pp = simulate(FixedTuner(cc=1, p=1, pp=50), small, PATH)
    assert no_pp.total_time_s == pytest.approx(400 * (0.040 + 100_000 * 8 / STREAM), rel=0.1)
    assert with_pp.throughput_bps > 8 * no_pp.throughput_bps


def test_new_channels_pay_setup_and_slow_start():
    res = simulate(FixedTuner(cc=1, p=1, pp=0), one_batch(1, 2_000_000), PATH)
    ideal = 2_000_000 * 8 / STREAM
    assert res.total_time_s > ideal + 2 * 0.040  # connect + auth + ramp


def test_storage_threads_cap_and_degrade():
    st = StorageModel(per_thread_bps=1e8, max_bps=8e8, knee_threads=4, degrade=1.0)
    w = one_batch(32, 50_000_000)
    two = simulate(FixedTuner(cc=2, p=4, pp=0), w, PATH, storage=st)
    four = simulate(FixedTuner(cc=4, p=4, pp=0), w, PATH, storage=st)
    sixteen = simulate(FixedTuner(cc=16, p=1, pp=0), w, PATH, storage=st)
    assert two.throughput_bps == pytest.approx(2e8, rel=0.05)
    assert four.throughput_bps == pytest.approx(4e8, rel=0.05)
    assert sixteen.throughput_bps < four.throughput_bps  # 8e8 * 4/16 = 2e8


def test_background_traffic_takes_its_fair_share():
    w = one_batch(10, 100_000_000)
    alone = simulate(FixedTuner(cc=1, p=2, pp=0), w, PATH)
    shared = simulate(FixedTuner(cc=1, p=2, pp=0), w, PATH, background=[(0.0, 1e9)])
    assert shared.throughput_bps < 0.75 * alone.throughput_bps
    assert shared.intervals[0]["background_bps"] == 1e9


def test_intervals_look_like_the_agents_and_runs_are_deterministic_and_fast():
    w = make_workload("w4", scale=0.1)
    t0 = time.perf_counter()
    a = simulate(make_tuner("fstream", path=PATH), w, PATH, storage=dtn_storage(1e9))
    took = time.perf_counter() - t0
    b = simulate(make_tuner("fstream", path=PATH), w, PATH, storage=dtn_storage(1e9))
    assert a.intervals == b.intervals and a.total_time_s == b.total_time_s
    assert took < 2.0  # ~75 simulated seconds, no real sleeping
    assert a.completed and a.total_bytes == w.total_bytes and a.files == len(w.files)
    for iv in a.intervals:
        assert {"t", "throughput_bps", "cc", "p", "pp", "reason"} <= set(iv)
    assert sum(iv["bytes"] for iv in a.intervals) == pytest.approx(w.total_bytes, rel=1e-6)


def test_files_arriving_later_wait_for_their_batch():
    w = Workload("late", [Batch(0.0, [FileInfo("a", 1000)]), Batch(10.0, [FileInfo("b", 1000)])])
    res = simulate(FixedTuner(cc=1, p=1, pp=0), w, PATH, profile_interval_s=1.0)
    assert 10.0 < res.total_time_s < 10.5


def test_gives_up_at_max_time():
    res = simulate(FixedTuner(cc=1, p=1, pp=0), one_batch(1, 10**12), PATH, max_time_s=5.0)
    assert not res.completed and 0 < res.total_bytes < 10**12


def test_channels_never_exceed_max_cc_active_plus_the_passive_cap():
    path = PathInfo(1e9, 0.040, tcp_buffer=2**20, max_cc=6)
    for name in ("static", "dynamic", "fstream", "adaptivecc"):
        res = simulate(make_tuner(name, path=path), make_workload("w3", scale=0.1), path,
                       storage=dtn_storage(1e9), max_passive=2)
        assert res.intervals, name  # the bounds below hold for every interval, so there must be some
        for iv in res.intervals:
            assert iv["cc"] <= 6, name
            assert iv["channels_open"] - iv["passive"] <= 6, name
            assert iv["passive"] <= 2 + 6, name  # closing ones finish their file first


def test_window_efficiency_and_startup_calibrate_to_the_emulated_wan():
    w = one_batch(1, 200_000_000)
    res = simulate(FixedTuner(cc=1, p=1, pp=0), w, PATH, window_efficiency=0.65)
    assert res.throughput_bps == pytest.approx(0.65 * STREAM, rel=0.05)  # ~137 Mbit/s measured
    late = simulate(FixedTuner(cc=1, p=1, pp=0), w, PATH, window_efficiency=0.65, startup_s=1.2)
    assert late.total_time_s == pytest.approx(res.total_time_s + 1.2, abs=0.05)
