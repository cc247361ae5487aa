"""End-to-end checksums read through one reused buffer per thread (issue 13): the digest is the
digest of the file's bytes at every size around the buffer's, with hashers running concurrently,
and a file shorter than promised is an error, not a short digest."""

from __future__ import annotations

import os
import threading

import blake3
import pytest
import xxhash

from transfer_agent.storage import checksum
from transfer_agent.storage.checksum import CHUNK, PrefixHasher, hash_fd, hash_fd_also

KEY = bytes(range(32))


def _file(tmp_path, name: str, data: bytes) -> int:
    p = tmp_path / name
    p.write_bytes(data)
    return os.open(p, os.O_RDONLY)


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 12345])
def test_digest_is_the_digest_of_the_bytes(tmp_path, size):
    data = os.urandom(size)
    fd = _file(tmp_path, "f", data)
    try:
        keyed, public = hash_fd_also(fd, size, "blake3-keyed", KEY, "xxh3_128")
        assert keyed == blake3.blake3(data, key=KEY).hexdigest()
        assert public == xxhash.xxh3_128(data).hexdigest()
        assert hash_fd(fd, size, "blake3") == blake3.blake3(data).hexdigest()
    finally:
        os.close(fd)


def test_prefix_hasher_in_steps_equals_one_pass(tmp_path):
    data = os.urandom(2 * CHUNK + 777)
    fd = _file(tmp_path, "f", data)
    try:
        h = PrefixHasher("blake3-keyed", KEY, len(data))
        for upto in (100, CHUNK + 5, CHUNK + 5, 2 * CHUNK):
            h.advance(fd, upto)
        assert h.finish(fd, len(data)) == blake3.blake3(data, key=KEY).hexdigest()
    finally:
        os.close(fd)


def test_concurrent_hashers_do_not_share_a_buffer(tmp_path):
    """Each thread reads into its own buffer: with one shared buffer, two files hashed at once mix."""
    files = [os.urandom(4 * CHUNK + i) for i in range(4)]
    fds = [_file(tmp_path, f"f{i}", d) for i, d in enumerate(files)]
    got: dict[int, str] = {}
    start = threading.Barrier(len(fds))

    def run(i: int) -> None:
        start.wait()
        for _ in range(5):
            got[i] = hash_fd(fds[i], len(files[i]), "xxh3_128")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for fd in fds:
        os.close(fd)
    assert got == {i: xxhash.xxh3_128(d).hexdigest() for i, d in enumerate(files)}


def test_short_file_is_an_error(tmp_path):
    fd = _file(tmp_path, "f", b"x" * 10)
    try:
        with pytest.raises(EOFError, match="10 of 11 bytes"):
            hash_fd(fd, 11, "blake3-keyed", KEY)
    finally:
        os.close(fd)


def test_threads_only_for_large_inputs_with_cpus_to_spare(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert not checksum._threads_pay(256 << 10)
    assert not checksum._threads_pay(None)
    assert checksum._threads_pay(checksum.THREADED_MIN)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1})  # pinned to one CPU
    assert not checksum._threads_pay(1 << 30)
