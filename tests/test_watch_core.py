"""The one watcher's core: the stability rule, seen stores, the local and polled listers, and the agent's view."""

from __future__ import annotations

import asyncio
import os
import stat
from types import SimpleNamespace

import pytest

from fstream_provider.bus.keys import Keys
from fstream_provider.watch.listing import LocationLister
from fstream_provider.watch.location import Location
from fstream_provider.watch.seen import MemorySeenStore, RedisSeenStore
from fstream_provider.watch.source_watcher import SourceWatcher
from fstream_provider.watch.stability import FileStat, StabilityTracker
from fstream_provider.watch.tree import TreeLister
from fstream_provider.watch.watcher import Watcher, watch_path
from agentkit import write_file as _write


# --------------------------------------------------------------------------- the stability rule
def test_closed_file_is_complete_on_first_look():
    tr = StabilityTracker()
    f = FileStat("/d/a", 5, 1.0, closed=True)
    assert tr.observe([f], now=2.0) == [f]


def test_stable_for_needs_the_signature_to_hold_that_long():
    tr = StabilityTracker(stable_for=10)
    f = FileStat("/d/a", 5, 1.0)
    assert tr.observe([f], now=100) == []
    assert tr.observe([f], now=105) == []  # same size and mtime, but only for 5 s
    assert tr.observe([f], now=110) == [f]
    g = FileStat("/d/a", 6, 2.0)  # grew: the clock starts again
    assert tr.observe([g], now=111) == [] and tr.observe([g], now=115) == []
    assert tr.observe([g], now=121) == [g]


def test_a_file_missing_from_a_look_is_forgotten():
    tr = StabilityTracker()
    f = FileStat("/d/a", 5, 1.0)
    tr.observe([f], now=1)
    tr.observe([], now=2)  # vanished (or filtered as seen)
    assert tr.pending == [] and tr.observe([f], now=3) == []


def test_nanosecond_mtime_is_the_signature_when_known():
    a = FileStat("/d/a", 5, 1.0, mtime_ns=1_000_000_001)
    b = FileStat("/d/a", 5, 1.0, mtime_ns=1_000_000_002)
    assert a.signature != b.signature
    assert a.to_dict() == {"path": "/d/a", "size": 5, "mtime": 1.0}  # the XCom shape is unchanged


# --------------------------------------------------------------------------- seen stores
def test_memory_store_reports_a_rewritten_file_again():
    st = MemorySeenStore()
    f = FileStat("/d/a", 5, 1.0)
    assert st.claim([f]) == [f] and st.claim([f]) == [] and st.unseen([f]) == []
    g = FileStat("/d/a", 6, 2.0)
    assert st.unseen([g]) == [g] and st.claim([g]) == [g]
    assert "/d/a" in st and len(st) == 1


def test_redis_store_uses_the_bus_key_schema(redis_client):
    keys = Keys("t-watch")
    store = RedisSeenStore.scoped(redis_client, keys, "scope-x")
    assert store.key == keys.seen("scope-x")
    files = [FileStat(f"/d/f{i}", 1, 1.0) for i in range(3)]
    assert store.claim(files[:2]) == files[:2]
    assert store.unseen(files) == files[2:]
    assert redis_client.sismember(keys.seen("scope-x"), "/d/f0")


# --------------------------------------------------------------------------- the polled backend (no paramiko)
class _FakeRemote:
    def __init__(self, tree: dict[str, list]) -> None:
        self.tree, self.closed, self.broken = tree, False, False

    def listdir_attr(self, path):
        if self.broken:
            raise EOFError("session dropped")
        if path not in self.tree:
            raise FileNotFoundError(path)
        return self.tree[path]

    def close(self):
        self.closed = True


def _attr(name, size, mtime, mode=stat.S_IFREG | 0o644):
    return SimpleNamespace(filename=name, st_size=size, st_mtime=mtime, st_mode=mode)


def test_polled_lister_through_the_watcher_reports_each_file_once():
    tree = {"/data": [_attr("a.h5", 10, 100), _attr(".a.h5.tmp", 1, 100), _attr("b.txt", 1, 100),
                      _attr("sub", 0, 100, stat.S_IFDIR | 0o755)],
            "/data/sub": [_attr("c.h5", 3, 101)]}
    sessions: list[_FakeRemote] = []

    def connect():
        sessions.append(_FakeRemote(tree))
        return sessions[-1]

    w = Watcher(LocationLister(Location.parse("sftp://u@h:22/data"), pattern="*.h5", recursive=True,
                               connect=connect))
    assert w.poll() == []  # first look
    got = w.poll()
    assert [(f.path, f.rel) for f in got] == [("/data/a.h5", "a.h5"), ("/data/sub/c.h5", "sub/c.h5")]
    assert w.poll() == []  # reported once
    sessions[-1].broken = True
    with pytest.raises(ConnectionError, match="sftp://u@h:22/data"):
        w.poll()
    assert sessions[-1].closed
    tree["/data"].append(_attr("d.h5", 1, 102))
    w.poll()
    assert [f.path for f in w.poll()] == ["/data/d.h5"] and len(sessions) == 2  # reconnected


def test_min_files_and_max_files_batch_oldest_first():
    tree = {"/in": [_attr(f"f{i}", 1, 100 + i) for i in range(5)]}
    w = Watcher(LocationLister(Location.parse("sftp://h/in"), connect=lambda: _FakeRemote(tree)))
    assert w.poll(min_files=6) == [] and w.poll(min_files=6) == [] and w.last_complete == 5
    assert [f.path for f in w.poll(min_files=2, max_files=2)] == ["/in/f0", "/in/f1"]
    assert [f.path for f in w.poll(min_files=1, max_files=2)] == ["/in/f2", "/in/f3"]


def test_remote_location_without_connect_says_so():
    with pytest.raises(ValueError, match="connect"):
        LocationLister(Location.parse("sftp://h/x")).scan()


# --------------------------------------------------------------------------- the local backend and the agent's view
def test_source_watcher_two_scans_hidden_vanished_and_rewritten(tmp_path):
    src = tmp_path / "src"
    _write(src / "a.bin", b"a" * 10)
    _write(src / ".a.bin.part", b"x")  # a writer's temp: never shipped
    _write(src / "sub" / "b.bin", b"b" * 3)
    w = SourceWatcher([str(src)], "dest", use_inotify=False)
    try:
        assert w.poll() == [] and w.pending_candidates == 2
        assert w.last_scan_listed >= 3 and w.last_scan_seconds >= 0
        got = w.poll()
        assert [(f.src, f.rel, f.size) for f in got] == [(str(src / "a.bin"), "dest/a.bin", 10),
                                                          (str(src / "sub" / "b.bin"), "dest/sub/b.bin", 3)]
        assert w.poll() == [] and w.pending_candidates == 0
        _write(src / "gone.bin", b"g")
        assert w.poll() == [] and w.pending_candidates == 1
        os.unlink(src / "gone.bin")  # vanished before it was complete: not a failure, not shipped
        assert w.poll() == [] and w.pending_candidates == 0
        _write(src / "grow.bin", b"1", mtime=1000)
        assert w.poll() == []
        _write(src / "grow.bin", b"12", mtime=1001)  # still growing
        assert w.poll() == []
        assert [f.size for f in w.poll()] == [2]
    finally:
        w.close()


def test_source_watcher_places_files_and_globs_like_send(tmp_path):
    _write(tmp_path / "run1" / "x.h5", b"1")
    _write(tmp_path / "one.h5", b"2")
    w = SourceWatcher([str(tmp_path / "run*"), str(tmp_path / "one.h5")], "out", use_inotify=False)
    try:
        w.poll()
        assert sorted(f.rel for f in w.poll()) == ["out/one.h5", "out/run1/x.h5"]
    finally:
        w.close()


def test_tree_lister_rechecks_waiting_files_in_unchanged_directories(tmp_path):
    _write(tmp_path / "a", b"1")
    lister = TreeLister([str(tmp_path)], use_inotify=False)
    assert [f.rel for f in lister.scan()] == ["a"]
    assert lister.scan() == []  # directory unchanged: nothing listed again
    assert [f.path for f in lister.scan(recheck=[str(tmp_path / "a")])] == [str(tmp_path / "a")]
    assert lister.scan(recheck=[str(tmp_path / "missing")]) == []


def test_watch_path_accepts_a_directory_or_a_glob(tmp_path):
    _write(tmp_path / "d" / "a.h5", b"1")
    _write(tmp_path / "d" / "b.txt", b"2")
    for path, want in ((str(tmp_path / "d"), ["a.h5", "b.txt"]), (str(tmp_path / "d" / "*.h5"), ["a.h5"])):
        w = watch_path(path, use_inotify=False)
        try:
            w.poll()
            assert sorted(f.rel for f in w.poll()) == want
            assert w.poll() == []
        finally:
            w.close()


def test_apoll_runs_the_same_loop_on_an_event_loop(tmp_path):
    _write(tmp_path / "a", b"1", mtime=1.0)
    w = watch_path(str(tmp_path), min_age=60, use_inotify=False)  # old file: complete on the first look

    async def twice():
        return await w.apoll(), await w.apoll()

    first, second = asyncio.run(twice())
    assert [f.rel for f in first] == ["a"] and second == []
    w.close()


def test_one_shot_listing_keeps_paths_relative_whatever_the_root_spelling(tmp_path):
    """The listing cuts the root off each walked path (issue 13, instead of relpath); a root written with
    trailing slashes must not leave a leading one (an absolute destination path)."""
    from fstream_provider.watch.sources import expand_sources

    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "x").write_bytes(b"1")
    (tmp_path / "d" / "y").write_bytes(b"2")
    for root in (f"{tmp_path}/d", f"{tmp_path}/d/", f"{tmp_path}/d//"):
        assert sorted(f.rel for f in expand_sources([root], "in")) == ["in/sub/x", "in/y"], root
