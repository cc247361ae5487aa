"""Straggler tails (issue 44, ``tuning.tails``): a cluster keeps the channels its queued large files need in the time
left, in the pure rule, in the default ``fstream`` tuner in the simulator, and in ``fstream bench tails``."""

from __future__ import annotations

import json
import random

from fstream_provider.tuning.ablation import Setup
from fstream_provider.tuning.base import ClusterStats, FileInfo
from fstream_provider.tuning.fstream import FStreamTuner
from fstream_provider.tuning.tails import Floor, apply_floors, tail_floors
from fstream_provider.tuning.variants import DEFAULT, FStreamVariant
from fstream_provider.tuning.workloads import Batch, Workload

MB = 1_000_000


def test_a_queued_large_file_keeps_its_channel_and_small_files_get_no_floor():
    # issue 44's slow runs at t ~ 4.2 s: 2 large files in flight, 1 queued (134 MB at 300 Mbit/s per channel:
    # 3.6 s), ~300 MB of small files queued, 900 Mbit/s measured: 4 s left
    stats = {"large": ClusterStats(active_channels=2, pending_files=1, pending_bytes=134 * MB),
             "small": ClusterStats(active_channels=6, pending_files=750, pending_bytes=300 * MB)}
    floors = tail_floors(stats, {"large": 300e6, "small": 100e6}, 900e6, 32)
    assert set(floors) == {"large"}
    assert floors["large"].cc == 3
    assert "1 queued file(s)" in floors["large"].reason and "2 in flight" in floors["large"].reason
    # the same file with an hour of small files still to go can wait for a free channel
    long = {**stats, "small": ClusterStats(active_channels=6, pending_files=9000, pending_bytes=400_000 * MB)}
    assert tail_floors(long, {"large": 300e6, "small": 100e6}, 900e6, 32) == {}


def test_a_vanishing_rate_gives_no_floor_instead_of_a_nan():
    """Hypothesis found it in CI (test_tuning_tuners): a measured rate of 5e-324 bit/s made the time left and one
    file's time both infinite, and ``floor(inf / inf)`` raised "cannot convert float NaN to integer"."""
    stats = {"small": ClusterStats(bytes=1_000_000, throughput_bps=5e-324, active_channels=1, pending_files=50,
                                   pending_bytes=1_000_000_000)}
    assert tail_floors(stats, {"small": 5e-324}, 5e-324, 1) == {}
    assert tail_floors(stats, {"small": 5e-324}, float("nan"), 1) == {}


def test_queued_files_share_channels_when_several_fit_in_the_time_left():
    # 6 queued files of 1.3 s each with 4.1 s left: 3 fit one after another on a channel -> 2 channels + 1 in flight
    stats = {"large": ClusterStats(active_channels=1, pending_files=6, pending_bytes=6 * 50 * MB),
             "small": ClusterStats(active_channels=4, pending_files=100, pending_bytes=160 * MB)}
    floors = tail_floors(stats, {"large": 300e6}, 900e6, 32)
    assert floors["large"].cc == 3


def test_apply_floors_keeps_the_total_and_one_channel_each():
    got = apply_floors({"large": 1, "small": 15}, {"large": Floor(3, "x")})
    assert got == {"large": 3, "small": 13}
    got = apply_floors({"large": 1, "small": 2}, {"large": Floor(9, "x")})
    assert got == {"large": 2, "small": 1} and sum(got.values()) == 3
    assert apply_floors({"a": 4}, {"b": Floor(2, "x")}) == {"a": 4}


def _issue_mix(seed: int) -> Workload:
    """Issue 44's held-out shape: ~1,300 files of ~400 kB and 4 of ~134 MB, all present at the start."""
    rng = random.Random(seed)
    files = [FileInfo(f"s{i}.dat", int(400_000 * rng.uniform(0.5, 1.5)), "dat") for i in range(1300)]
    files += [FileInfo(f"l{i}.h5", int(134 * MB * rng.uniform(0.8, 1.2)), "h5") for i in range(4)]
    rng.shuffle(files)
    return Workload("issue44-mix", [Batch(0.0, files)])


def test_the_default_tuner_starts_every_large_file_early_on_the_issue_mix():
    """Regression (issue 44): without the floor the split moved the large cluster from 3 channels to 1 while a large
    file was still queued, and that file ended alone on one channel. With it, in the simulator on the WAN path,
    the tuner says why it keeps the channels, the last large file starts before the small files run out, and the
    transfer is faster than without the floor on every seed."""
    setup = Setup()
    off = FStreamVariant.parse("default-tail-floor")
    for seed in range(3):
        w = _issue_mix(seed)
        on_run = setup.run(FStreamTuner(path=setup.path, variant=DEFAULT), w)
        off_run = setup.run(FStreamTuner(path=setup.path, variant=off), w)
        assert on_run.completed and off_run.completed
        reasons = [iv["reason"] for iv in on_run.intervals]
        assert any("tails: large keeps cc>=" in r for r in reasons), reasons
        assert not any("tails:" in iv["reason"] for iv in off_run.intervals)
        assert on_run.total_time_s < off_run.total_time_s, (seed, on_run.total_time_s, off_run.total_time_s)


def test_bench_tails_sim_only_records_fresh_seeds_that_replay_and_draws_every_run(tmp_path):
    from fstream_bench.tuning import tails as bench

    assert bench.main(["--sim-only", "--fresh", "1", "--results", str(tmp_path)]) == 0
    (result,) = tmp_path.glob("tails-*.json")
    doc = json.loads(result.read_text())
    assert doc["seeds_fresh"] and len(doc["seeds"]) == 1 and doc["provenance"]["command"]
    row = doc["rows"][0]
    assert set(row["sim"]["of_best"]) == {"static", "default", "default without the tail floor"}
    again = tmp_path / "again"
    assert bench.main(["--sim-only", "--seeds", str(doc["seeds"][0]), "--results", str(again)]) == 0
    (replay,) = again.glob("tails-*.json")
    assert json.loads(replay.read_text())["rows"][0]["sim"] == row["sim"]
    png = tmp_path / "tails.png"
    assert bench.main(["--figure", str(result), str(png)]) == 0
    assert png.stat().st_size > 5000


def test_with_nothing_queued_the_split_keeps_every_cluster_where_it_is():
    """Regression (issue 44): once every file was in flight, all clusters weighed 0 and the split shared the channels
    equally (small 28 -> 16, large 4 -> 16): 12 new five-stream channels for nothing, opened one after another while
    the last files landed (14 s instead of 6 s on the WAN). The layout now stays as it was."""
    from fstream_provider.tuning.base import Observation, PathInfo

    path = PathInfo(1e9, 0.040, tcp_buffer=1 << 20, max_cc=32, max_p=16)
    t = FStreamTuner(path=path)
    files = [FileInfo(f"s{i}", 160_000, "dat") for i in range(1230)] + [FileInfo(f"l{i}", 100 * MB, "h5")
                                                                         for i in range(3)]
    t.update(Observation(t=0.0, dt=0.0, new_files=files))
    first = {l.cluster: l.cc for l in t.suggest().layouts}
    assert first["small"] > 10 and first["large"] >= 2
    drained = {"small": ClusterStats(bytes=50 * MB, throughput_bps=400e6, active_channels=first["small"]),
               "large": ClusterStats(bytes=50 * MB, throughput_bps=400e6, active_channels=first["large"])}
    t.update(Observation(t=6.0, dt=6.0, bytes=500 * MB, throughput_bps=667e6, clusters=drained))
    s = t.suggest()
    assert {l.cluster: l.cc for l in s.layouts} == first and not s.changed, s
    assert "channels ran out of files (0 pending" in s.reason
