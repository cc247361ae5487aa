"""A channel closed by a layout change while its driver is still queueing a file's blocks sends every block of
that file before its streams end.

Found on the emulated WAN (issue #16, w3 backlogged, default tuner): at the tail the large cluster's p dropped
from 5 to 1, the pool closed channels mid-file, ``stop()`` put the streams' end markers into the block queue
while the driver was still putting the file's blocks behind them, the streams ended and the rest of the file
was never sent: the transfer moved nothing for 60 s until the stall detector resumed it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from transfer_agent.sending.channel import Channel
from transfer_agent.sending.inflight import MIN_STRIPE, InFlight

MiB = 1024 * 1024


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(1 << 16):
            pass
    except OSError:
        pass


class _Pool:
    """What a channel asks of its pool, with slow streams so the driver is mid-file when the channel closes."""

    def __init__(self, f: InFlight) -> None:
        self.stopping = threading.Event()
        self.block_size = MIN_STRIPE
        self.sent: list[InFlight] = []
        self.requeued: list[InFlight] = []
        self.moved = 0
        self.first_block = threading.Event()
        self._files = [f.sf]
        self._lock = threading.Lock()
        self._peers: list[socket.socket] = []
        self._readers: list[threading.Thread] = []
        failed = threading.Event()
        self.control = SimpleNamespace(open=lambda sf: f, all_sent=lambda f, keep=False: self.sent.append(f),
                                       flush_commits=lambda age=0.0: None, failed=failed, verify=True,
                                       fail=lambda exc: (setattr(self, "error", exc), failed.set()))
        self.connector = SimpleNamespace(connect_link=self._connect)
        self.error: Exception | None = None

    def _connect(self, **_: object) -> SimpleNamespace:
        ours, theirs = socket.socketpair()
        self._peers.append(theirs)
        t = threading.Thread(target=_drain, args=(theirs,), daemon=True)
        t.start()
        self._readers.append(t)
        return SimpleNamespace(link=SimpleNamespace(sock=ours), keys=None)

    def next_files(self, cluster: str, n: int):
        with self._lock:
            out, self._files = self._files[:n], self._files[n:]
            return out

    def unopenable(self, sf, exc) -> None:  # pragma: no cover - the file is readable
        raise AssertionError(f"{sf}: {exc}")

    def wait_for_work(self, timeout: float) -> None:
        time.sleep(min(timeout, 0.02))

    def requeue_unstarted(self, f: InFlight) -> None:
        self.requeued.append(f)

    def count(self, f: InFlight, n: int) -> None:
        with self._lock:
            self.moved += n
        self.first_block.set()

    def pace(self, nbytes: int) -> float:
        time.sleep(0.01)  # slow streams: the driver waits on a full block queue, mid-file
        return 0.0


def test_a_channel_closed_mid_file_sends_the_rest_of_that_file_before_its_streams_end(tmp_path: Path) -> None:
    size = 16 * MiB  # 64 blocks of 256 KiB; the queue holds 2 * p = 4
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(size))
    fd = os.open(src, os.O_RDONLY)
    f = InFlight(SimpleNamespace(cluster="large", src=str(src), rel="big.bin"), 1, fd, size, 0)  # type: ignore[arg-type]
    f.reply = {"missing": [[0, size]]}
    f.opened.set()
    pool = _Pool(f)
    ch = Channel(1, 2, pool)  # type: ignore[arg-type]
    ch.cluster, ch.pp = "large", 1
    ch.start()
    try:
        assert pool.first_block.wait(10), "the channel never sent a block"
        ch.stop()  # the tuner's new layout has no room for this channel: it closes while the file is half queued
        ch.join(timeout=10)
        assert all(not t.is_alive() for t in ch.threads), "the channel's threads did not end after stop()"
        assert pool.error is None, f"the session failed: {pool.error}"
        assert pool.moved == size, f"{pool.moved} of {size} bytes sent: blocks queued behind the end markers were lost"
        assert pool.sent == [f], "the file was never reported all-sent, so it could not commit"
    finally:
        pool.stopping.set()
        ch.kill()
        ch.join(timeout=5)
        for t in pool._readers:  # the channel closed its ends: the readers see end-of-stream
            t.join(5)
        for s in pool._peers:
            s.close()
        os.close(fd)


class _KeepingPool(_Pool):
    """Two small files; COMMITs are answered only once flushed (``flush_commits``), so a kept COMMIT stays; the
    tuner's layout turns pp to 0 while the first file is sent (``switch``)."""

    def __init__(self, files: list[InFlight], switch) -> None:
        super().__init__(files[0])
        self._files = [f.sf for f in files]
        by_sf = {id(f.sf): f for f in files}
        self.kept: list[InFlight] = []

        def all_sent(f: InFlight, keep: bool = False) -> None:
            self.sent.append(f)
            switch()
            if keep:
                self.kept.append(f)
            else:
                f.finished.set()

        def flush(age: float = 0.0) -> None:
            for k in self.kept:
                k.finished.set()
            self.kept.clear()

        self.control.all_sent, self.control.flush_commits = all_sent, flush
        self.control.open_many = lambda sfs, unopenable: [by_sf[id(sf)] for sf in sfs]

    def pace(self, nbytes: int) -> float:
        return 0.0


def test_a_one_stream_channel_at_pp_0_sends_a_kept_commit_before_it_waits(tmp_path: Path) -> None:
    """A file sent while the next was opened keeps its COMMIT; when the layout says pp = 0 meanwhile, the driver
    waits for that file's answer and must send the COMMIT first (CI, 2026-12-01: a deadline transfer stalled 2 s)."""
    files = []
    for i in range(2):
        src = tmp_path / f"f{i}.bin"
        src.write_bytes(b"x" * 1000)
        fd = os.open(src, os.O_RDONLY)
        f = InFlight(SimpleNamespace(cluster="small", src=str(src), rel=src.name), i + 1, fd, 1000, 0)  # type: ignore[arg-type]
        f.reply = {"missing": [[0, 1000]]}
        f.opened.set()
        files.append(f)
    ch = Channel(1, 1, None)  # type: ignore[arg-type]
    pool = _KeepingPool(files, switch=lambda: setattr(ch, "pp", 0))
    ch.pool = pool  # type: ignore[assignment]
    ch.cluster, ch.pp = "small", 1  # both files opened at once; the first one's COMMIT is kept
    ch.start()
    try:
        assert files[0].finished.wait(5) and files[1].finished.wait(5), "the driver waited on a COMMIT it kept"
        assert pool.sent == files and pool.error is None
    finally:
        pool.stopping.set()
        ch.kill()
        ch.join(timeout=5)
        for t in pool._readers:
            t.join(5)
        for s in pool._peers:
            s.close()
        for f in files:
            os.close(f.fd)
