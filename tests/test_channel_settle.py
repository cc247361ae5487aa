"""A file settled (refused, aborted) while a data stream is sending one of its blocks: the stream finishes that
block on a still-open descriptor and the session goes on (it used to hit EBADF and fail the whole session)."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

from transfer_agent.sending.channel import Channel
from transfer_agent.sending.inflight import InFlight, settle

MiB = 1024 * 1024


class _Control:
    def __init__(self) -> None:
        self.failed = threading.Event()
        self.error: Exception | None = None
        self.sent: list[InFlight] = []

    def fail(self, exc: Exception) -> None:
        self.error = exc
        self.failed.set()

    def all_sent(self, f: InFlight, keep: bool = False) -> None:
        self.sent.append(f)

    def flush_commits(self, age: float = 0.0) -> None:
        pass


def test_settling_a_file_mid_block_does_not_pull_the_descriptor_from_under_the_stream(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(os.urandom(MiB))
    fd = os.open(src, os.O_RDONLY)
    f = InFlight(None, 7, fd, MiB, 0)  # type: ignore[arg-type]
    f.blocks_left = 1
    control = _Control()

    def pace(nbytes: int) -> float:
        settle(f)  # the control thread's refusal lands after the stream took the block, before it is sent
        return 0.0

    pool = SimpleNamespace(control=control, stopping=threading.Event(), pace=pace, count=lambda f, n: None)
    ours, theirs = socket.socketpair()
    got = bytearray()
    reader = threading.Thread(target=lambda: [got.extend(b) for b in iter(lambda: theirs.recv(1 << 16), b"")],
                              daemon=True)
    reader.start()
    ch = Channel(0, 1, pool)  # type: ignore[arg-type]
    ch.blocks.put((f, 0, MiB))
    ch.blocks.put(None)
    try:
        ch._stream_loop(ours)
        assert not control.failed.is_set(), f"the stream failed the session: {control.error}"
        ours.shutdown(socket.SHUT_WR)
        reader.join(10)
        assert bytes(got[-MiB:]) == src.read_bytes(), "the block was not sent whole from the right file"
        try:
            os.fstat(fd)
            still_open = True
        except OSError:
            still_open = False
        assert not still_open, "the descriptor must be closed once the stream let go of it"
        assert f.finished.is_set()
    finally:
        ours.close()
        theirs.close()
