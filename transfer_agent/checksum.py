"""End-to-end checksums (xxh3-128 by default, blake3 optional), read with pread in large chunks."""

from __future__ import annotations

import os
import threading

import xxhash

CHUNK = 8 << 20
ALGORITHMS = ("xxh3_128", "blake3")


def new_hasher(algo: str = "xxh3_128"):
    if algo == "xxh3_128":
        return xxhash.xxh3_128()
    if algo == "blake3":
        try:
            import blake3
        except ImportError:
            raise ValueError("checksum blake3: the blake3 package is not installed") from None
        return blake3.blake3()
    raise ValueError(f"checksum {algo!r}: unknown algorithm (use {', '.join(ALGORITHMS)})")


def hash_fd(fd: int, size: int, algo: str = "xxh3_128") -> str:
    """Hash the first ``size`` bytes of an open file; raises ``EOFError`` if it is shorter."""
    h = new_hasher(algo)
    off = 0
    while off < size:
        chunk = os.pread(fd, min(CHUNK, size - off), off)
        if not chunk:
            raise EOFError(f"file shorter than expected ({off} of {size} bytes)")
        h.update(chunk)
        off += len(chunk)
    return h.hexdigest()


class PrefixHasher:
    """Hashes a file's bytes in order while the rest is still arriving, so the commit only reads the tail.

    Whoever extends the contiguous prefix calls ``advance``; if another thread is already hashing,
    it returns at once. ``finish`` hashes what is left and returns the digest.
    """

    def __init__(self, algo: str = "xxh3_128") -> None:
        self._h = new_hasher(algo)
        self.done_upto = 0
        self._lock = threading.Lock()

    def _run(self, fd: int, upto: int) -> None:
        while self.done_upto < upto:
            chunk = os.pread(fd, min(CHUNK, upto - self.done_upto), self.done_upto)
            if not chunk:
                raise EOFError(f"file shorter than expected ({self.done_upto} of {upto} bytes)")
            self._h.update(chunk)
            self.done_upto += len(chunk)

    def advance(self, fd: int, upto: int) -> None:
        if self._lock.acquire(blocking=False):
            try:
                self._run(fd, upto)
            finally:
                self._lock.release()

    def finish(self, fd: int, size: int) -> str:
        with self._lock:
            self._run(fd, size)
            return self._h.hexdigest()


def hash_path(path: str, algo: str = "xxh3_128") -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return hash_fd(fd, os.fstat(fd).st_size, algo)
    finally:
        os.close(fd)
