"""A data stream counts the bytes of a file it sent once per block (issue 42: ``f.lock`` was taken per ``sendfile``
or ``pread`` call), and a block cut short still counts what left. TLS streams send a block in 1 MiB calls, so the
number of calls per block is known here."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_channel_settle import _Control

from transfer_agent.sending.channel import TLS_CHUNK, Channel
from transfer_agent.sending.inflight import InFlight

MiB = 1 << 20

pytestmark = pytest.mark.skipif(subprocess.run(["which", "openssl"], capture_output=True).returncode != 0,
                                reason="openssl CLI not installed (needed to make a test certificate)")


class _CountingLock:
    """A real lock that counts how often it was taken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = 0

    def __enter__(self) -> bool:
        self._lock.acquire()
        self.taken += 1
        return True

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    d = tmp_path_factory.mktemp("cert")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=rx",
                    "-keyout", str(d / "k.pem"), "-out", str(d / "c.pem")], check=True, capture_output=True)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(d / "c.pem", d / "k.pem")
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(d / "c.pem")
    return server, client


def _send_block(tmp_path: Path, tls: tuple[ssl.SSLContext, ssl.SSLContext], length: int,
                read_upto: int | None = None) -> tuple[InFlight, _CountingLock, Channel, _Control, bytes, bytes]:
    """One block of ``length`` bytes sent by a channel's TLS stream to a reader that takes ``read_upto`` bytes (the
    whole block when None) and then closes; returns the file, its counting lock, the channel, its control, what
    was sent, what was read."""
    data = os.urandom(length)
    src = tmp_path / f"src-{length}"
    src.write_bytes(data)
    fd = os.open(src, os.O_RDONLY)
    f = InFlight(None, 1, fd, length, 0)  # type: ignore[arg-type]
    f.blocks_left = 1
    lock = f.lock = _CountingLock()  # type: ignore[assignment]
    control = _Control()
    pool = SimpleNamespace(control=control, stopping=threading.Event(), pace=lambda n: 0.0, count=lambda f, n: None)
    ours, theirs = socket.socketpair()
    got = bytearray()

    def reader() -> None:
        with tls[0].wrap_socket(theirs, server_side=True) as s:
            while len(got) < (length if read_upto is None else read_upto):
                b = s.recv(1 << 16)
                if not b:
                    return
                got.extend(b)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    ch = Channel(0, 1, pool)  # type: ignore[arg-type]
    with tls[1].wrap_socket(ours, server_hostname="rx") as s:
        ch.blocks.put((f, 0, length))
        ch.blocks.put(None)
        ch._stream_loop(s)
        t.join(10)
    os.close(fd)
    return f, lock, ch, control, data, bytes(got)


def test_the_file_lock_is_taken_per_block_not_per_call(tmp_path: Path, tls) -> None:
    """A 1 MiB block goes in one call, a 4 MiB block in four: both take the file's lock the same number of times
    (hold, one count of the block, release), and the file counts every byte."""
    taken = {}
    for length in (TLS_CHUNK, 4 * TLS_CHUNK):
        f, lock, ch, control, data, got = _send_block(tmp_path, tls, length)
        assert not control.failed.is_set(), control.error
        assert got[-length:] == data and f.bytes_sent == length == ch.moved
        assert control.sent == [f] and f.blocks_left == 0  # the block was counted whole: its COMMIT may go
        taken[length] = lock.taken
    assert taken[TLS_CHUNK] == taken[4 * TLS_CHUNK] == 3, taken


def test_a_block_cut_short_counts_what_left(tmp_path: Path, tls) -> None:
    """The receiver goes away after 2 MiB of an 8 MiB block: the file counts the bytes that left, the block is not
    counted as sent (no COMMIT), and the stream reports the lost connection."""
    f, _lock, ch, control, _data, got = _send_block(tmp_path, tls, 8 * MiB, read_upto=2 * MiB)
    assert control.failed.is_set() and "lost" in str(control.error)
    assert f.bytes_sent == ch.moved and 2 * MiB <= f.bytes_sent < 8 * MiB
    assert control.sent == [] and f.blocks_left == 1
