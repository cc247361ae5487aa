"""A ``--watch`` stream takes a backlog a window at a time (issue 43: a stream started on 1,000,000 files already
present held them all, 1.5 GB of sender memory): bounded scans that go on where they stopped, and a sender that
takes new files only while its window has room."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentkit import make_files, send
from fstream_provider.watch.source_watcher import SourceWatcher
from fstream_provider.watch.sources import listing_progress
from fstream_provider.watch.tree import TreeLister
from transfer_agent.receiving.receiver import Receiver
from transfer_agent.sending import watch_window

KiB = 1024


def _tree(root: Path, dirs: int, per_dir: int) -> set[str]:
    paths = set()
    for d in range(dirs):
        (root / f"d{d}").mkdir(parents=True)
        for i in range(per_dir):
            p = root / f"d{d}" / f"f{i:03d}.dat"
            p.write_bytes(b"x")
            paths.add(str(p))
    (root / "d0" / ".hidden.part").write_bytes(b"temp")  # a writer's temp file: never listed
    return paths


def test_bounded_scans_list_one_pass_in_windows_each_file_once(tmp_path: Path) -> None:
    every = _tree(tmp_path / "src", dirs=3, per_dir=50)
    lister = TreeLister([str(tmp_path / "src")], "out", use_inotify=False)
    ticks: list[int] = []
    seen: list[str] = []
    sizes = []
    try:
        with listing_progress(lambda: ticks.append(1)):
            while True:
                got = lister.scan(limit=40)
                sizes.append(len(got))
                seen += [f.path for f in got]
                assert all(f.rel == "out/" + os.path.relpath(f.path, tmp_path / "src") for f in got)
                if not lister.more:
                    break
        assert sizes == [40, 40, 40, 30], sizes  # 150 files, 40 at a time, the pass going on where it stopped
        assert sorted(seen) == sorted(every), "every file once, none twice, no temp file"
        assert ticks, "a bounded pass still feeds the watchdog as it lists"
        assert lister.scan(limit=40) == [] and not lister.more  # nothing changed: the next pass lists nothing
    finally:
        lister.close()


def test_a_directory_that_changes_while_its_listing_is_suspended_is_listed_again(tmp_path: Path) -> None:
    _tree(tmp_path / "src", dirs=1, per_dir=30)
    lister = TreeLister([str(tmp_path / "src")], "", use_inotify=False)
    try:
        first = {f.path for f in lister.scan(limit=10)}
        assert lister.more and len(first) == 10
        late = tmp_path / "src" / "d0" / "late.dat"
        late.write_bytes(b"late")  # written while the pass stands in the middle of d0
        os.utime(late.parent, ns=(0, late.parent.stat().st_mtime_ns + 10**9))  # its mtime moves on, for sure
        rest: set[str] = set()
        while lister.more:
            rest |= {f.path for f in lister.scan(limit=10)}
        again = {f.path for f in lister.scan(limit=100)}  # the next pass: d0 changed, so it is listed again
        assert str(late) in rest | again
        assert len(first | rest) == 30 + (str(late) in rest)
    finally:
        lister.close()


def test_source_watcher_keeps_offering_a_backlog_until_the_pass_is_done(tmp_path: Path) -> None:
    every = _tree(tmp_path / "src", dirs=2, per_dir=25)
    w = SourceWatcher([str(tmp_path / "src")], "out", use_inotify=False)
    taken: list[str] = []
    try:
        for _ in range(40):
            got = w.poll(limit=8)
            assert len(got) <= 8
            taken += [sf.src for sf in got]
            if not w.pending_candidates:
                break
        assert sorted(taken) == sorted(every)
        assert not w.backlog and w.pending_candidates == 0
    finally:
        w.close()


def test_watch_stream_on_a_backlog_bigger_than_its_window(tmp_path: Path, secret: Path, rx: Receiver,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A real stream over loopback, with a window of 60 files, on a backlog of 300 already present: every file
    lands once, and no look took more than the room the window had."""
    monkeypatch.setattr(watch_window, "QUEUE_MAX", 60)
    monkeypatch.setattr(watch_window, "REFILL", 15)
    src = make_files(tmp_path / "src", {f"d{i // 100}/f{i:03d}.dat": 2 * KiB for i in range(300)})
    looks: list[tuple[int | None, int]] = []
    poll = SourceWatcher.poll

    def recorded(self: SourceWatcher, limit: int | None = None) -> list:
        got = poll(self, limit)
        looks.append((limit, len(got)))
        return got

    monkeypatch.setattr(SourceWatcher, "poll", recorded)
    res = send(src, rx.port, secret, watch=True, interval="0.1s", idle_exit="0.5s")
    assert res.ok and res.verified_files == 300, res.error
    out = tmp_path / "dst" / "out"
    assert sorted(p.relative_to(out) for p in out.rglob("*.dat")) == sorted(p.relative_to(src)
                                                                          for p in src.rglob("*.dat"))
    assert all(limit is not None and 15 <= limit <= 60 and n <= limit for limit, n in looks), looks
    assert sum(n for _, n in looks) == 300
    assert sum(1 for _, n in looks if n) >= 5, looks  # the backlog came in windows, not at once
