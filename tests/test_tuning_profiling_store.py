"""Profiling history survives in a real Redis: saved newest first, trimmed, loaded by a later run."""

from __future__ import annotations

from fstream_provider.bus.keys import Keys
from fstream_provider.bus.profiling_store import ProfilingStore
from fstream_provider.tuning.profile_history import ProfileHistory, ProfileRecord


def test_round_trip_newest_first_and_trimmed(redis_client):
    keys = Keys("proftest")
    store = ProfilingStore(redis_client, keys=keys, keep=3)
    h = ProfileHistory()
    for i in range(5):
        h.add(ProfileRecord(5e6, "small", "h5", i + 1, 2, 4, 1e8 * (i + 1), float(i)))
    h.add(ProfileRecord(2e9, "large", "", 3, 8, 0, 9e8, 9.0))
    assert store.save(h) == 6
    assert store.save(h) == 0  # nothing new
    assert redis_client.llen(keys.profiling("4MiB", "h5")) == 3
    loaded = store.load()
    rows = [r for r in loaded.records() if r.size_class == "4MiB"]
    assert [r.cc for r in rows] == [5, 4, 3]  # newest first, oldest trimmed
    assert [r for r in loaded.records() if r.size_class == "1GiB"][0].ftype == ""
    rec, how = loaded.lookup(5e6, "small", 3.5e8)  # fewest channels reaching 3.5e8: cc=4
    assert how == "size" and rec.cc == 4
    # another namespace sees nothing
    assert len(ProfilingStore(redis_client, keys=Keys("other")).load()) == 0


def test_bad_records_are_skipped_not_fatal(redis_client):
    keys = Keys("proftest2")
    redis_client.lpush(keys.profiling("4MiB", "h5"), "not json")
    store = ProfilingStore(redis_client, keys=keys)
    h = ProfileHistory([ProfileRecord(5e6, "small", "h5", 2, 1, 1, 1e8, 1.0)])
    h.add(ProfileRecord(5e6, "small", "h5", 3, 1, 1, 2e8, 2.0))
    store.save(h)
    assert [r.cc for r in store.load().records()] == [3]


def test_a_later_run_starts_from_the_history_an_earlier_run_saved(redis_client):
    from fstream_provider.bus.profiling_store import load_history, save_history
    from fstream_provider.tuning.base import FileInfo, PathInfo
    from fstream_provider.tuning.fstream import FStreamTuner
    from fstream_provider.tuning.sim import dtn_storage, simulate
    from fstream_provider.tuning.workloads import Batch, Workload

    keys = Keys("proftest3")
    path = PathInfo(1e9, 0.04, tcp_buffer=2**20)
    big = Workload("big", [Batch(0.0, [FileInfo(f"{i}.h5", 150_000_000, "h5") for i in range(40)])])
    h1 = load_history(redis_client, keys=keys)
    simulate(FStreamTuner(path=path, history=h1, start_time=1000.0), big, path, storage=dtn_storage(1e9))
    assert save_history(redis_client, h1, keys=keys) > 0
    h2 = load_history(redis_client, keys=keys)
    second = simulate(FStreamTuner(path=path, history=h2, start_time=2000.0), big, path, storage=dtn_storage(1e9))
    assert "history by size" in second.intervals[0]["reason"] and second.intervals[0]["cc"] > 2
