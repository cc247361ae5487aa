"""BLAKE3 from blocks as they arrive (issue 29): the native subtree hashing gives exactly blake3(file), keyed or
not, for any file size and any block layout; the receiver uses it and reads nothing back for aligned blocks; the
package works the same without the native module (FSTREAM_NATIVE=0)."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import socket
import subprocess
import sys
import threading
from pathlib import Path

import blake3
import pytest

from transfer_agent.sending.inflight import ALIGN, cut_blocks
from transfer_agent.storage import tree_hash
from transfer_agent.storage.hash_plan import TREE_MIN

KiB, MiB = 1 << 10, 1 << 20

if os.environ.get("FSTREAM_REQUIRE_NATIVE") == "1":
    assert tree_hash.NATIVE, ("FSTREAM_REQUIRE_NATIVE=1 but transfer_agent.storage._blake3tree did not import: the "
                              "Rust extension was not built (is cargo on PATH when `make` installs the package?)")
native = pytest.mark.skipif(not tree_hash.NATIVE, reason="the native module _blake3tree is not built here")

SIZES = [0, 1, 1023, 1024, 1025, 2048, 3000, 64 * KiB, 64 * KiB + 1, MiB - 1, MiB, MiB + 1, 3 * MiB + 777,
         7 * MiB + 512 * KiB, 9 * MiB]


def _reference(data: bytes, key: bytes | None) -> str:
    return (blake3.blake3(data, key=key) if key else blake3.blake3(data)).hexdigest()


def _digest(tmp_path: Path, data: bytes, key: bytes | None, cuts: list[int], order: list[int]) -> tuple[str, int]:
    """Hash ``data`` as blocks [cuts[i], cuts[i+1]) fed in ``order``; returns (digest, bytes covered by pieces)."""
    tree = tree_hash.TreeDigest(len(data), key)
    for i in order:
        a, b = cuts[i], cuts[i + 1]
        block = tree.block(a, b - a)
        block.feed(memoryview(data)[a:b])
        tree.add(block.take())
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        return tree.digest(fd), tree.bytes_hashed
    finally:
        os.close(fd)


@native
@pytest.mark.parametrize("keyed", [False, True])
def test_any_block_layout_in_any_order_gives_the_files_blake3(tmp_path: Path, keyed: bool) -> None:
    rng = random.Random(29)
    key = os.urandom(32) if keyed else None
    for size in SIZES:
        data = rng.randbytes(size)
        for _ in range(4):
            cuts = sorted({0, size, *(rng.randrange(0, size + 1) for _ in range(rng.randrange(0, 6)))})
            order = list(range(len(cuts) - 1))
            rng.shuffle(order)
            got, _ = _digest(tmp_path, data, key, cuts, order)
            assert got == _reference(data, key), (size, cuts)


@native
def test_the_senders_block_layout_is_hashed_whole_without_reading_back(tmp_path: Path) -> None:
    # cut_blocks' grid makes every block whole nodes of the tree: the commit reads nothing back
    rng = random.Random(7)
    key = os.urandom(32)
    for size, p, bs in [(3 * MiB, 4, 4 * MiB), (9 * MiB + 5, 4, 4 * MiB), (300 * KiB, 8, 4 * MiB), (5 * MiB + 3, 3, MiB)]:
        data = rng.randbytes(size)
        blocks = cut_blocks([(0, size)], p, bs)
        assert all(n % ALIGN == 0 or o + n == size for o, n in blocks)
        cuts = [o for o, _n in blocks] + [size]
        got, covered = _digest(tmp_path, data, key, cuts, list(reversed(range(len(blocks)))))
        assert got == _reference(data, key)
        assert covered == size
    # a resumed range that starts off the grid: its first block ends on the grid, the rest are aligned
    blocks = cut_blocks([(100_000, 9 * MiB)], 2, 4 * MiB)
    assert blocks[0][0] == 100_000 and (blocks[0][0] + blocks[0][1]) % ALIGN == 0
    assert all(o % ALIGN == 0 for o, _n in blocks[1:])
    assert sum(n for _o, n in blocks) == 9 * MiB - 100_000


@contextlib.contextmanager
def _streaming(tmp_path: Path, data: bytes):
    """``data`` sent into one end of a socket pair by a thread; yields (the other end's fd, an open part file's fd,
    its path, a function that waits for the sender), and closes them all afterwards."""
    a, b = socket.socketpair()
    sender = threading.Thread(target=a.sendall, args=(data,))
    sender.start()
    path = tmp_path / "part"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        yield b.fileno(), fd, path, sender.join
    finally:
        os.close(fd)
        a.close()
        b.close()


@native
def test_a_block_pumped_from_a_socket_is_written_and_hashed(tmp_path: Path) -> None:
    data = random.Random(3).randbytes(5 * MiB + 123)
    key = os.urandom(32)
    tree = tree_hash.TreeDigest(len(data), key)
    with _streaming(tmp_path, data) as (sock, fd, path, sent):
        block, got = tree.block(0, len(data)), 0
        while got < len(data):
            n, written, werr, rerr = block.pump(sock, fd, len(data) - got)
            assert (written, werr, rerr) == (n, 0, 0)
            tree.add(block.take())
            got += n
        sent()
        assert path.read_bytes() == data
        assert tree.bytes_hashed == len(data)
        assert tree.digest(fd) == _reference(data, key)


@native
def test_a_peer_that_closes_mid_block_is_reported_and_what_arrived_is_written(tmp_path: Path) -> None:
    a, b = socket.socketpair()
    a.sendall(b"x" * 5000)
    a.close()
    fd = os.open(tmp_path / "part", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        block = tree_hash.TreeDigest(MiB, None).block(0, MiB)
        n, written, werr, rerr = block.pump(b.fileno(), fd, MiB)
        assert (n, written, werr, rerr) == (5000, 5000, 0, -1)
        assert os.pread(fd, 6000, 0) == b"x" * 5000
    finally:
        os.close(fd)
        b.close()


@native
def test_bad_arguments_are_refused_with_the_reason() -> None:
    tree = tree_hash.TreeDigest(10, None)
    with pytest.raises(ValueError, match="beyond the file"):
        tree.block(5, 10)
    with pytest.raises(ValueError, match="32 bytes"):
        tree_hash.TreeDigest(10, b"short").block(0, 10)


def test_without_the_native_module_the_receiver_reads_back_and_gets_the_same_files(tmp_path: Path) -> None:
    """FSTREAM_NATIVE=0: ``NATIVE`` is False, no ``TreeDigest`` is made, and a keyed transfer still verifies."""
    code = ("from transfer_agent.storage import tree_hash; "
            "assert not tree_hash.NATIVE and not tree_hash.usable('blake3-keyed'); print('fallback')")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "FSTREAM_NATIVE": "0"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "fallback"


@native
def test_a_keyed_transfer_is_verified_from_blocks_as_they_arrive(tmp_path: Path, secret: Path) -> None:
    from agentkit import make_files, send, start_receiver, trees_identical

    sizes = {"big.bin": 9 * MiB + 5, "mid.bin": 3 * MiB, "odd.bin": 300 * KiB + 7} | {f"s{i}.dat": 1000 + i for i in range(20)}
    src = make_files(tmp_path / "src", sizes)
    rx = start_receiver(tmp_path / "dst", secret)
    try:
        res = send(src, rx.port, secret, cc=2, p=4, block_size=MiB)
        assert res.ok and res.verified_files == len(sizes), res.failures[:3]
        assert trees_identical(src, tmp_path / "dst" / "out")
        # every byte of the files from TREE_MIN on was hashed on its way to disk, nothing of them read back; the
        # smaller ones are hashed once at commit (no TreeDigest: not counted here)
        big = sum(n for n in sizes.values() if n >= TREE_MIN)
        assert big == 12 * MiB + 5
        assert rx.stats["bytes_hashed_arriving"] == big
        assert rx.stats["bytes_hashed_read_back"] == 0
        assert rx.stats["files_checksum_mismatch"] == 0
    finally:
        rx.stop()


@native
def test_where_splice_is_missing_the_native_loop_receives_writes_and_hashes(tmp_path: Path, secret: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from agentkit import make_files, send, start_receiver, trees_identical
    from transfer_agent.receiving import data

    monkeypatch.delattr(data.os, "splice")  # the receiver's data loop falls back to recv; the sender uses sendfile
    sizes = {"big.bin": 6 * MiB + 3, "small.bin": 4000}
    src = make_files(tmp_path / "src", sizes)
    rx = start_receiver(tmp_path / "dst", secret)
    try:
        res = send(src, rx.port, secret, cc=1, p=3, block_size=MiB)
        assert res.ok and res.verified_files == 2, res.failures[:3]
        assert trees_identical(src, tmp_path / "dst" / "out")
        assert rx.stats["bytes_hashed_arriving"] == sizes["big.bin"]
        assert rx.stats["bytes_hashed_read_back"] == 0
    finally:
        rx.stop()


@native
def test_a_spliced_block_lands_in_the_file_and_is_hashed_on_the_way(tmp_path: Path) -> None:
    from transfer_agent.receiving.data import _pipe

    data = random.Random(5).randbytes(3 * MiB + 17)
    key = os.urandom(32)
    tree = tree_hash.TreeDigest(len(data), key)
    r, w = _pipe()
    try:
        with _streaming(tmp_path, data) as (sock, fd, path, sent):
            block, got = tree.block(0, len(data)), 0
            while got < len(data):
                n, written, werr, rerr = block.splice(sock, r, w, fd, len(data) - got)
                assert (written, werr, rerr) == (n, 0, 0)
                tree.add(block.take())
                got += n
            sent()
            assert path.read_bytes() == data
            assert tree.bytes_hashed == len(data) and tree.digest(fd) == _reference(data, key)
    finally:
        os.close(r)
        os.close(w)


@native
def test_a_chunk_not_written_stops_the_blocks_hashing_and_the_commit_reads_it_back(tmp_path: Path) -> None:
    data = random.Random(6).randbytes(2 * MiB)
    tree = tree_hash.TreeDigest(len(data), None)
    with _streaming(tmp_path, data) as (sock, fd, _path, sent):
        block = tree.block(0, len(data))
        n1, w1, _, _ = block.pump(sock, -1, 64 * KiB)  # a file given up: read and dropped, not written
        assert (n1, w1) == (64 * KiB, 0)
        got = n1
        while got < len(data):
            n, written, _, _ = block.pump(sock, fd, len(data) - got)
            assert written == n
            tree.add(block.take())
            got += n
        sent()
        assert tree.bytes_hashed == 0  # nothing after the dropped chunk was kept as a piece
        os.pwrite(fd, data[:64 * KiB], 0)  # the bytes a resumed session would have written
        assert tree.digest(fd) == _reference(data, None)  # read back whole


@native
@pytest.mark.parametrize("how", ["pump", "splice"])
def test_a_write_that_fails_is_reported_with_its_errno_and_nothing_after_it_is_hashed(tmp_path: Path,
                                                                                       how: str) -> None:
    """The native write loops (``io_all``: pwrite, splice out of the pipe) report the syscall's errno, not a
    short count alone; the block's bytes still leave the socket (read and dropped) and none is kept as a piece."""
    from transfer_agent.receiving.data import _pipe

    data = random.Random(7).randbytes(MiB + 5)
    tree = tree_hash.TreeDigest(len(data), None)
    r, w = _pipe()
    try:
        with _streaming(tmp_path, data) as (sock, _fd, path, sent):
            ro = os.open(path, os.O_RDONLY)  # the write into it fails with EBADF
            try:
                block, got, errs = tree.block(0, len(data)), 0, set()
                while got < len(data):
                    call = block.pump(sock, ro, len(data) - got) if how == "pump" else \
                        block.splice(sock, r, w, ro, len(data) - got)
                    n, written, werr, rerr = call
                    assert (written, rerr) == (0, 0) and n > 0
                    errs.add(werr)
                    tree.add(block.take())
                    got += n
                sent()
            finally:
                os.close(ro)
        assert errs == {errno.EBADF}
        assert got == len(data) and tree.bytes_hashed == 0 and path.stat().st_size == 0
    finally:
        os.close(r)
        os.close(w)


def test_without_the_native_module_a_keyed_transfer_verifies_by_reading_back(tmp_path: Path, secret: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback in one process: ``NATIVE`` off, the receiver makes no ``TreeDigest`` and verifies each file by
    reading it back (``PrefixHasher`` for the large one, ``hash_fd`` at commit for the others): same files."""
    from agentkit import make_files, send, start_receiver, trees_identical

    from transfer_agent.receiving import commit
    from transfer_agent.storage.checksum import PrefixHasher

    monkeypatch.setattr(tree_hash, "NATIVE", False)
    read_back: list[str] = []
    real_hash_fd, real_finish = commit.hash_fd, PrefixHasher.finish
    monkeypatch.setattr(commit, "hash_fd", lambda fd, size, *a: read_back.append("whole") or real_hash_fd(fd, size, *a))
    monkeypatch.setattr(PrefixHasher, "finish", lambda self, fd, size: read_back.append("prefix") or
                        real_finish(self, fd, size))
    sizes = {"big.bin": 40 * MiB + 3, "mid.bin": 3 * MiB, "s.dat": 1000}
    src = make_files(tmp_path / "src", sizes)
    rx = start_receiver(tmp_path / "dst", secret)
    try:
        res = send(src, rx.port, secret, cc=1, p=4, block_size=MiB)
        assert res.ok and res.verified_files == 3, res.failures[:3]
        assert trees_identical(src, tmp_path / "dst" / "out")
        assert rx.stats["files_committed"] == 3
        # each file was verified by reading it back: the large one hashed ahead (PrefixHasher), the others at commit
        assert sorted(read_back) == ["prefix", "whole", "whole"]
        assert rx.stats["bytes_hashed_arriving"] == 0  # and no TreeDigest was made
    finally:
        rx.stop()
