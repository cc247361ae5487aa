"""The per-process cache of HARP's transfer history and of its fitted group models, on a real ``redis-server``.

What a refresh reads is observed through a client that counts every XRANGE/XREVRANGE and the entries it
got back; every cached frame is compared with a full reload (``TransferHistory.frame``).
"""

from __future__ import annotations

import json
import logging
import threading

import numpy as np
import pandas as pd
import pytest

from fstream_provider.bus.client import connect
from fstream_provider.bus.history_cache import HistoryCache, HistoryCaches, connection_identity
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.transfer_history import TransferHistory
from fstream_provider.tuning.harp import HarpTuner
from fstream_provider.tuning.harp_start import harp_start
from fstream_provider.tuning.harp_fits import GroupFitCache
from fstream_provider.tuning.harp_history import HistoryRow, from_frame
from fstream_provider.tuning.harp_model import HarpOptimizer
from fstream_provider.tuning.clustering import Cluster
from transfer_agent.sending.history_io import BackgroundHistory
from test_harp_optimizer import REQ, quad, rows as probe_rows
from test_harp_tuner import PATH, SAMPLED, SMALL_FILE, drive_sample, files, history as tuner_history, law

STRINGS = ("source", "destination", "chunk", "group", "kind")
log = logging.getLogger("test-history-cache")


def row(i: int, *, group: str = "job1:all", t0: float = 1_790_000_000.0, **kw) -> HistoryRow:
    base = dict(source="dtn1", destination="rx:7000", bandwidth_bps=1e9, rtt_s=0.04, tcp_buffer=1 << 20,
                chunk=("tiny", "small", "medium", "large")[i % 4], avg_file_size=1e5 * (1 + i % 7), file_count=10 + i,
                cc=1 + i % 8, p=1 + i % 4, pp=i % 3, throughput_bps=1e7 * (1 + i % 11), time=t0 + i, duration_s=1.0,
                group=group, kind="interval", source_limited=i % 5 == 0)
    return HistoryRow(**{**base, **kw})


def comparable(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame with the cache's compact dtypes spelled as a full reload spells them."""
    out = frame.astype({c: object for c in STRINGS})
    return out.astype({c: "int64" for c in ("cc", "p", "pp", "file_count", "tcp_buffer")})


def assert_same_as_full_reload(cache: HistoryCache, client, limit=None) -> None:
    full = TransferHistory(client, keys=Keys()).frame(limit=limit)
    pd.testing.assert_frame_equal(comparable(cache.frame()), comparable(full))


class Counting:
    """A Redis client that records every XRANGE/XREVRANGE it sends (pipelined too) and how many entries came back."""

    def __init__(self, client) -> None:
        self._client, self.calls = client, []

    def __getattr__(self, name):
        return getattr(self._client, name)

    def xrange(self, key, min="-", max="+", count=None):
        out = self._client.xrange(key, min=min, max=max, count=count)
        self.calls.append(("XRANGE", min, max, count, len(out)))
        return out

    def xrevrange(self, key, max="+", min="-", count=None):
        out = self._client.xrevrange(key, max=max, min=min, count=count)
        self.calls.append(("XREVRANGE", min, max, count, len(out)))
        return out

    def pipeline(self, transaction=True):
        return _CountingPipe(self, self._client.pipeline(transaction=transaction))

    def entries(self) -> int:
        return sum(c[-1] for c in self.calls)


class _CountingPipe:
    def __init__(self, owner: Counting, pipe) -> None:
        self.owner, self.pipe, self.sent = owner, pipe, []

    def xrange(self, key, min="-", max="+", count=None):
        self.pipe.xrange(key, min=min, max=max, count=count)
        self.sent.append(("XRANGE", min, max, count))
        return self

    def xrevrange(self, key, max="+", min="-", count=None):
        self.pipe.xrevrange(key, max=max, min=min, count=count)
        self.sent.append(("XREVRANGE", min, max, count))
        return self

    def __getattr__(self, name):
        command = getattr(self.pipe, name)

        def queue(*args, **kw):
            command(*args, **kw)
            self.sent.append((name.upper(),))
            return self
        return queue

    def execute(self, **kw):
        replies = self.pipe.execute(**kw)
        for sent, reply in zip(self.sent, replies):
            if sent[0] in ("XRANGE", "XREVRANGE"):
                self.owner.calls.append((*sent, len(reply)))
        return replies


@pytest.fixture
def store(redis_client) -> TransferHistory:
    return TransferHistory(redis_client, keys=Keys(), max_rows=0, max_age_s=0)


def test_an_incremental_refresh_reads_only_the_entries_appended_since(redis_client, store):
    store.append([row(i) for i in range(300)])
    cache = HistoryCache(Keys().history(), batch=64)
    first = cache.refresh(redis_client)
    assert first.reloaded and first.new == 300 and len(cache.frame()) == 300
    store.append([row(i) for i in range(300, 307)])
    counting = Counting(redis_client)
    r = cache.refresh(counting)
    assert (r.new, r.dropped, r.reloaded) == (7, 0, False)
    # one MULTI: XINFO STREAM, the last entry read again (is it still there?) and what came after it: the 7 new
    last_read = [c for c in counting.calls if c[1].startswith("(")]
    assert len(last_read) == 1 and last_read[0][-1] == 7
    assert not any(c[0] == "XREVRANGE" for c in counting.calls) and counting.entries() == 7 + 1
    assert len(cache.frame()) == 307 and cache.generation == first.generation + 1
    assert_same_as_full_reload(cache, redis_client)
    nothing = Counting(redis_client)
    again = cache.refresh(nothing)
    assert (again.new, again.generation) == (0, r.generation) and nothing.entries() == 1


def test_a_trimmed_head_is_dropped_and_the_rest_is_not_read_again(redis_client, store):
    store.append([row(i) for i in range(200)])
    cache = HistoryCache(Keys().history())
    cache.refresh(redis_client)
    before = cache.frame()
    redis_client.xtrim(Keys().history(), maxlen=150, approximate=False)
    store.append([row(i) for i in range(200, 205)])
    counting = Counting(redis_client)
    r = cache.refresh(counting)
    assert (r.new, r.dropped, r.reloaded) == (5, 50, False) and counting.entries() == 5 + 1
    assert_same_as_full_reload(cache, redis_client)
    assert len(before) == 200 and before["time"].iloc[0] == row(0).time  # a frame handed out is a snapshot
    # trimmed by age (MINID), as TransferHistory.append does
    cut = redis_client.xrange(Keys().history(), count=31)[-1][0]
    redis_client.xtrim(Keys().history(), minid=cut, approximate=False)
    assert cache.refresh(redis_client).dropped == 30
    assert_same_as_full_reload(cache, redis_client)


def test_a_limited_window_keeps_the_newest_entries_as_a_limited_reload_does(redis_client, store):
    store.append([row(i) for i in range(120)])
    cache = HistoryCache(Keys().history(), limit=50, batch=16)
    cache.refresh(redis_client)
    assert_same_as_full_reload(cache, redis_client, limit=50)
    for k in range(6):  # enough appends to move the window through its buffers more than once
        store.append([row(1000 + 10 * k + i) for i in range(10 + k)])
        r = cache.refresh(redis_client)
        assert r.new == 10 + k and not r.reloaded and cache.entries == 50
        assert_same_as_full_reload(cache, redis_client, limit=50)


def test_a_deleted_or_recreated_stream_is_read_again(redis_client, store):
    key = Keys().history()
    store.append([row(i) for i in range(100)])
    cache = HistoryCache(key)
    cache.refresh(redis_client)
    redis_client.delete(key)
    gone = cache.refresh(redis_client)
    assert gone.dropped == 100 and len(cache.frame()) == 0
    store.append([row(i, group="job2:all") for i in range(500, 530)])
    back = cache.refresh(redis_client)
    assert back.reloaded and back.new == 30
    assert_same_as_full_reload(cache, redis_client)
    # deleted and recreated between two refreshes, with entries after the last one read: that entry is gone
    redis_client.delete(key)
    store.append([row(i, group="job3:all") for i in range(700, 710)])
    r = cache.refresh(redis_client)
    assert r.reloaded and "last entry read is gone" in r.why and set(cache.frame()["group"]) == {"job3:all"}
    # recreated with ids that include the last one read (written by hand): the length gives it away
    ids = [e[0] for e in redis_client.xrange(key)]
    redis_client.delete(key)
    for i, eid in enumerate(ids[-3:]):
        redis_client.xadd(key, {"row": json.dumps(row(900 + i, group="job4:all").to_dict())}, id=eid)
    r = cache.refresh(redis_client)
    if "entries-added" in redis_client.xinfo_stream(key):  # Redis >= 7.0, Valkey: the count gives it away
        assert r.reloaded and "the stream was recreated (3 entries ever added where 10 were expected)" in r.why
    else:  # Redis 6.2 has no such count: the last entry read, rewritten, gives it away (issue 39's floor)
        assert r.reloaded and "the last entry read was rewritten" in r.why
    assert_same_as_full_reload(cache, redis_client)
    # an entry deleted in the middle (XDEL; FStream never does it) of a cache holding the whole stream
    redis_client.xdel(key, ids[-2])
    r = cache.refresh(redis_client)
    assert r.reloaded and "2 entries in Redis where 3 were expected" in r.why
    assert_same_as_full_reload(cache, redis_client)


def test_unreadable_entries_and_loosely_typed_rows_are_skipped_and_kept_as_a_full_reload_does(redis_client, store):
    key = Keys().history()
    store.append([row(i) for i in range(20)])
    good = row(20).to_dict()
    redis_client.xadd(key, {"row": "{not json"})
    redis_client.xadd(key, {"row": json.dumps({**good, "chunk": "gigantic"})})
    redis_client.xadd(key, {"other": "field"})
    loose = {**good, "cc": "3", "p": 2.0, "source_limited": "yes", "group": 7, "background_bps": None}
    redis_client.xadd(key, {"row": json.dumps(loose)})
    store.append([row(i) for i in range(21, 25)])
    cache = HistoryCache(key, batch=7)
    cache.refresh(redis_client)
    frame = cache.frame()
    assert len(frame) == 20 + 1 + 4 and cache.entries == 28
    r = frame[frame["group"] == "7"].iloc[0]
    assert (r["cc"], r["p"], bool(r["source_limited"])) == (3, 2, True) and np.isnan(r["background_bps"])
    assert_same_as_full_reload(cache, redis_client)
    limited = HistoryCache(key, limit=6)  # the window counts entries, readable or not, as XREVRANGE COUNT does
    limited.refresh(redis_client)
    assert_same_as_full_reload(limited, redis_client, limit=6)


def test_two_threads_refreshing_at_once_see_one_consistent_frame(redis_url, redis_client, store):
    store.append([row(i) for i in range(2000)])
    cache = HistoryCache(Keys().history(), batch=100)
    start = threading.Barrier(3)
    seen: dict[int, list] = {0: [], 1: []}
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        client = connect(redis_url)
        try:
            start.wait()
            for _ in range(25):
                cache.refresh(client)
                seen[k].append(cache.frame())
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    start.wait()
    for k in range(20):  # appends while both threads refresh
        store.append([row(2000 + 10 * k + i) for i in range(10)])
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert cache.reloads == 1  # the two cold refreshes did not both read the stream
    cache.refresh(redis_client)
    final = comparable(cache.frame())
    pd.testing.assert_frame_equal(final, comparable(TransferHistory(redis_client).frame()))
    for frames in seen.values():
        for f in frames:  # every frame either thread saw is a prefix of the stream: no row lost, doubled or torn
            assert len(f) >= 2000
            pd.testing.assert_frame_equal(comparable(f), final.iloc[:len(f)])


def test_caches_are_shared_per_server_key_and_limit(redis_url, redis_client):
    caches = HistoryCaches()
    other = connect(redis_url)
    try:
        a = caches.get(redis_client, Keys().history(), limit=10)
        assert caches.get(other, Keys().history(), limit=10) is a
        assert caches.get(other, Keys("ns2").history(), limit=10) is not a
        assert caches.get(other, Keys().history(), limit=20) is not a
        assert connection_identity(redis_client).endswith(f"127.0.0.1:{redis_url.split(':')[2].split('/')[0]}/0")
        assert caches.get(object(), Keys().history()) is not caches.get(object(), Keys().history())  # unknown: own
    finally:
        other.close()


def test_a_group_is_refitted_only_when_its_rows_changed(redis_client, store):
    store.append(probe_rows(quad, groups=4, noise=0.01))
    cache = HistoryCache(Keys().history())
    cache.refresh(redis_client)
    gen0 = cache.generation
    versions = cache.group_versions()
    assert sorted(versions) == [f"probe|cal{g}:small" for g in range(4)]
    opt = HarpOptimizer(rho=1.0, fit_cache=cache.fit_cache)
    first = opt.fit(cache.frame(), REQ)
    assert (cache.fit_cache.fits, cache.fit_cache.hits, first.reused) == (4, 0, 0) and len(first.groups) == 4
    again = opt.fit(cache.frame(), REQ)
    assert (cache.fit_cache.fits, again.reused) == (4, 4)  # nothing changed: no group refitted
    assert [g.best for g in again.groups] == [g.best for g in first.groups] and again.reason == first.reason
    # a pass of calibration group 1 is probed again: its rows change, no other group's do
    extra = [HistoryRow.from_dict({**r.to_dict(), "throughput_bps": r.throughput_bps * 0.5, "time": r.time + 10})
             for r in probe_rows(quad, groups=4) if r.group == "cal1:small"][:40]
    store.append(extra)
    assert cache.refresh(redis_client).new == 40
    assert cache.changed_since(gen0) == {"probe|cal1:small"}
    third = opt.fit(cache.frame(), REQ)
    assert (cache.fit_cache.fits, third.reused) == (5, 3)
    fresh = HarpOptimizer(rho=1.0).fit(TransferHistory(redis_client).frame(), REQ)
    assert [(g.name, g.best, g.relaxed, g.n_rows) for g in third.groups] == \
        [(g.name, g.best, g.relaxed, g.n_rows) for g in fresh.groups]
    # other settings are other fits
    HarpOptimizer(rho=0.8, fit_cache=cache.fit_cache).fit(cache.frame(), REQ)
    assert cache.fit_cache.fits == 9


def test_the_fit_cache_is_a_bounded_lru():
    cache = GroupFitCache(maxsize=2)
    calls = []
    for key in ("a", "b", "a", "c", "b"):
        cache.get_or_fit(key, lambda k=key: calls.append(k) or k)
    assert calls == ["a", "b", "c", "b"] and len(cache) == 2 and (cache.fits, cache.hits) == (4, 1)


def _decisions(tuner: HarpTuner) -> list[tuple]:
    return [(d["chunk"], d["cc"], d["p"], d["pp"], d["predicted_bps"], d["fallback"], d["reason"])
            for d in tuner.decisions]


def test_harp_decides_the_same_with_the_cache_as_without_and_a_second_job_reuses_the_models(redis_client, store,
                                                                                           caplog):
    store.append(from_frame(tuner_history()))
    dataset = files(20, 200_000, "t") + files(200)
    sample_bps = law(4, 4, 2, load=0.4)
    plain = HarpTuner(path=PATH, history=TransferHistory(redis_client).frame(), variant=SAMPLED)
    plain_layouts, _ = drive_sample(plain, dataset, sample_bps)
    caches = HistoryCaches()
    results, fits = [], []
    with caplog.at_level(logging.INFO, logger=log.name):
        for job in range(2):  # two jobs of one agent process
            src = BackgroundHistory(redis_client, log, caches=caches)
            assert src.wait(30) is not None and src.fit_cache is not None
            tuner = HarpTuner(path=PATH, history=src, variant=SAMPLED)
            layouts, reasons = drive_sample(tuner, dataset, sample_bps)
            results.append((layouts, reasons, tuner))
            fits.append(src.fit_cache.fits)
    for layouts, _, tuner in results:
        assert _decisions(tuner) == _decisions(plain) and len(tuner.decisions) == 2
        assert {n: (l.cc, l.p, l.pp) for n, l in layouts.items()} == \
            {n: (l.cc, l.p, l.pp) for n, l in plain_layouts.items()}
    cache = results[0][2]._source.cache
    assert results[1][2]._source.cache is cache and cache.reloads == 1 and len(caches) == 1
    assert fits[0] == 6 and fits[1] == fits[0]  # six load groups, each fitted once: the second job fits none
    notes = [r for r in results[1][1] if "models fitted in" in r]
    assert notes and all("(6 of 6 groups unchanged since an earlier fit)" in r for r in notes)  # the reason says so
    assert "row(s) loaded in" in caplog.text and "row(s) cached, 0 new" in caplog.text
    # the HARP start of the fstream tuner too
    c = Cluster("small", files=200, bytes=200 * SMALL_FILE, seen_files=200, seen_bytes=200 * SMALL_FILE)
    src = BackgroundHistory(redis_client, log, caches=caches)
    src.wait(30)
    assert harp_start(PATH, src)(c) == harp_start(PATH, TransferHistory(redis_client).frame())(c)


def test_a_ready_history_is_not_fitted_before_the_first_sample_starts(redis_client, store):
    from fstream_provider.tuning.base import ClusterStats, Observation

    store.append(from_frame(tuner_history()))
    src = BackgroundHistory(redis_client, log, caches=HistoryCaches())
    assert src.wait(30) is not None  # ready before the job's first update, as a warm cache is
    tuner = HarpTuner(path=PATH, history=src)
    dataset = files(200)
    for f in dataset:
        tuner.cluster_of(f)
    busy = {"small.sample": ClusterStats(pending_files=125, pending_bytes=250_000_000),
            "small": ClusterStats(pending_files=75, pending_bytes=150_000_000)}
    tuner.update(Observation(t=0.0, dt=0.0, new_files=dataset, clusters=busy))
    # the first layout (the heuristic while samples are planned) goes out without waiting for a fit: the first
    # byte does not wait for it
    assert {l.cluster for l in tuner.suggest().layouts} == {"small", "small.sample"} and src.fit_cache.fits == 0
    tuner.update(Observation(t=0.25, dt=0.25, bytes=10**7, clusters=busy))
    assert src.fit_cache.fits == 6 and "small: models fitted in" in tuner.suggest().reason
