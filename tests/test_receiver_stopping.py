"""A receiver that is stopping never refuses a file for good (found by issue 29's full run): the OPEN it takes while
its root is being closed is answered retryable, and stopping ends the control connections too, so no OPEN is taken
after ``stop()``. (A ``--watch`` stream gave a file up for ever after a terminal "Bad file descriptor" refusal.)"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from agentkit import start_receiver, wait_until
from transfer_agent.receiving.state import Session
from transfer_agent.wire.protocol import Frame


class _Control:
    def send(self, *a) -> None:
        pass


def test_an_open_taken_while_the_receiver_stops_is_refused_retryably(tmp_path: Path, secret: Path) -> None:
    rx = start_receiver(tmp_path / "dst", secret)
    session = Session("s" * 32, "job", 1, _Control(), "127.0.0.1:1")
    rx.stop()  # its root descriptor is closed now
    rtype, body = rx._open_reply(session, 1, {"path": "a.dat", "size": 10, "mtime_ns": 0, "algo": "blake3-keyed"})
    assert rtype == Frame.ERROR
    assert body["retryable"] is True and "stopping" in body["message"], body


def test_stopping_ends_the_control_connection_of_an_open_session(tmp_path: Path, secret: Path) -> None:
    rx = start_receiver(tmp_path / "dst", secret)
    a, b = socket.socketpair()
    session = Session("t" * 32, "job", 1, _Control(), "127.0.0.1:1")
    session.sock = b
    with rx._lock:
        rx._sessions[session.id] = session
    rx.stop()
    a.settimeout(5)
    assert a.recv(1) == b""  # the receiver's side shut down: the peer reads end of stream
    a.close()
    b.close()


def test_an_abort_while_the_flush_persists_ranges_leaves_no_sidecar(tmp_path):
    """The flush loop persists a file's ranges (``.part.meta``) while an ABORT removes the file: the flush had
    borrowed the fd before the abort and wrote the sidecar after the abort had unlinked it, so an orphan
    ``.meta`` stayed until the hourly sweep (seen under load in test_faults_source_modified). The abort marks the
    file failed under its lock first; the flush, which checks that under the same lock, writes nothing."""
    import threading

    from transfer_agent.receiving.receiver import Receiver
    from transfer_agent.receiving.state import RecvFile
    from transfer_agent.storage.ranges import RangeSet

    root = tmp_path / "root"
    root.mkdir()
    rcv = Receiver(root=str(root), secret=b"s" * 32)  # not started: its store's methods, called directly
    dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)  # the file's: closed with it
    tmp = ".data.bin.job.1.part"
    fd = os.open(root / tmp, os.O_RDWR | os.O_CREAT, 0o600)
    ranges = RangeSet()
    ranges.add(0, 4096)
    session = type("S", (), {"job": "job", "attempt": 1})()
    f = RecvFile(file_id=1, relpath="data.bin", dir_fd=dir_fd, base="data.bin", tmp=tmp, size=8192, mtime_ns=0,
                 algo="blake3", fd=fd, ranges=ranges, session=session, dirty=True)
    borrowed, aborted = threading.Event(), threading.Event()
    real_acquire = f.acquire

    def acquire() -> int:  # the flush has the fd: the abort comes now, before it writes the ranges
        out = real_acquire()
        borrowed.set()
        aborted.wait(10)
        return out

    f.acquire = acquire
    flush = threading.Thread(target=rcv._flush, args=(f,))
    flush.start()
    try:
        assert borrowed.wait(10)
        rcv._discard(f, remove=True)  # what an ABORT (or a failed file) does
        aborted.set()
        flush.join(10)
        assert sorted(p.name for p in root.iterdir()) == []  # neither the part nor a sidecar
    finally:
        aborted.set()
        flush.join(10)
