"""Issue 43, "Disk": with fsync on, a receiver starts a large part's writeback while the file still arrives
(``storage.writeback``), so the commit's ``fdatasync`` has little left; advice only, never the durability itself."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from agentkit import make_files, send, start_receiver, wait_until
from transfer_agent.storage import writeback
from transfer_agent.storage.writeback import KICK, Writeback

MiB = 1 << 20
LINUX = writeback.available()


class _File:
    """What ``Writeback`` needs of a file: ``acquire``/``unuse`` around one borrowed fd (-1 once closing)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.users, self.borrowed = fd, 0, threading.Event()

    def acquire(self) -> int:
        if self.fd >= 0:
            self.users += 1
            self.borrowed.set()
        return self.fd

    def unuse(self) -> None:
        self.users -= 1


@pytest.mark.skipif(not LINUX, reason="sync_file_range is Linux's")
def test_start_asks_the_kernel_and_a_bad_fd_is_an_errno(tmp_path: Path) -> None:
    p = tmp_path / "f"
    with open(p, "wb") as fh:
        fh.write(os.urandom(4 * MiB))
        fh.flush()
        assert writeback.start(fh.fileno()) == 0
    assert writeback.start(10_000) == 9  # EBADF: said, never raised
    assert p.stat().st_size == 4 * MiB


@pytest.mark.skipif(not LINUX, reason="sync_file_range is Linux's")
def test_the_thread_kicks_queued_files_skips_closing_ones_and_drops_when_full(tmp_path: Path) -> None:
    wb = Writeback(kick=MiB)
    try:
        assert wb.due(MiB) and not wb.due(MiB - 1)
        with open(tmp_path / "a", "wb") as fh:
            fh.write(b"x" * MiB)
            f = _File(fh.fileno())
            wb.start_file(f)
            assert f.borrowed.wait(10), "the writeback thread never borrowed the file's fd"
            closing = _File(-1)
            wb.start_file(closing)
            wb.start_file(f)
            deadline = 100
            while wb.kicks < 2 and deadline:
                threading.Event().wait(0.05)
                deadline -= 1
            assert wb.kicks == 2 and wb.skipped == 1 and wb.failed == 0 and f.users == 0
    finally:
        wb.close()
    assert not wb.enabled and wb._thread is None
    full = Writeback(enabled=False)
    assert not full.due(10 * KICK)  # off: never due
    full._q.maxsize = 1
    full.start_file(_File(-1))
    full.start_file(_File(-1))
    assert full.dropped == 1


def test_off_where_the_call_is_missing(monkeypatch) -> None:
    monkeypatch.setattr(writeback, "_SYNC_FILE_RANGE", None)
    assert not writeback.available() and writeback.start(0) == 38
    wb = Writeback(enabled=True)
    assert not wb.enabled and wb._thread is None and not wb.due(10 * KICK)


@pytest.mark.skipif(not LINUX, reason="sync_file_range is Linux's")
@pytest.mark.parametrize("fsync", [True, False], ids=["fsync", "no-fsync"])
def test_a_receiver_with_fsync_starts_a_large_files_writeback_as_it_arrives(tmp_path: Path, secret: Path,
                                                                            fsync: bool) -> None:
    """A 64 MiB file into a real receiver: with fsync on, its writeback is started every 16 MiB received (3 kicks:
    the fourth 16 MiB completes the file, whose commit flushes it); with --no-fsync never. The file lands whole."""
    size = 64 * MiB
    src = make_files(tmp_path / "src", {"big.bin": size})
    rx = start_receiver(tmp_path / "dst", secret, fsync=fsync)
    try:
        res = send(src / "big.bin", rx.port, secret, cc=1, p=1, block_size="4MiB")
        assert res.ok, res.error
        if fsync:
            wb = rx._writeback
            # a kick queued just before the last bytes may find the file committed and closed: skipped, not lost.
            # The fourth 16 MiB kicks too when it is written before the sender's commit request is read (the file is
            # not yet ready then): seen on a loaded CI host, 4 handled where 3 were awaited.
            handled = wait_until(lambda: (n := wb.kicks + wb.dropped + wb.skipped) >= size // KICK - 1 and n,
                                 what="three kicks handled")
            assert handled in (size // KICK - 1, size // KICK), handled
            assert wb.enabled and wb.kicks >= 1 and wb.failed == 0
        else:
            assert not rx._writeback.enabled and rx._writeback.kicks == 0 and rx._writeback._thread is None
    finally:
        rx.stop()
    assert (tmp_path / "dst" / "out" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    assert rx._writeback._thread is None  # stopped with the receiver
