"""End-to-end checksums, read with pread in large chunks (DESIGN.md "Rules for never losing data").

* ``xxh3_128`` (default without a shared secret): fast, unkeyed; catches corruption, not an attacker
  who rewrites data and digest together (TLS protects the path in that mode).
* ``blake3``: unkeyed BLAKE3.
* ``blake3-keyed``: BLAKE3 keyed with the control connection's digest key (``secure.SessionKeys.digest``),
  used whenever a shared secret is configured: only the two authenticated ends can compute it, so
  data and digest rewritten together in transit are caught at commit.
"""

from __future__ import annotations

import os
import threading

import xxhash

CHUNK = 8 << 20
ALGORITHMS = ("xxh3_128", "blake3", "blake3-keyed")
KEYED = ("blake3-keyed",)
THREADED_MIN = 8 << 20  # blake3 hashes chunks this large on several threads


def _blake3(key: bytes | None = None):
    try:
        import blake3
    except ImportError:
        raise ValueError("checksum blake3: the blake3 package is not installed") from None
    if key is None:
        return blake3.blake3(max_threads=blake3.blake3.AUTO)
    return blake3.blake3(key=key, max_threads=blake3.blake3.AUTO)


def new_hasher(algo: str = "xxh3_128", key: bytes | None = None):
    """A hasher for ``algo``; keyed algorithms need the 32-byte ``key`` (unkeyed ones refuse one)."""
    if algo in KEYED:
        if key is None or len(key) != 32:
            raise ValueError(f"checksum {algo}: needs a 32-byte session key (shared-secret mode only)")
        return _blake3(key)
    if key is not None:
        raise ValueError(f"checksum {algo!r} is not keyed; a key was given")
    if algo == "xxh3_128":
        return xxhash.xxh3_128()
    if algo == "blake3":
        return _blake3()
    raise ValueError(f"checksum {algo!r}: unknown algorithm (use {', '.join(ALGORITHMS)})")


def hash_fd(fd: int, size: int, algo: str = "xxh3_128", key: bytes | None = None) -> str:
    """Hash the first ``size`` bytes of an open file; raises ``EOFError`` if it is shorter."""
    return hash_fd_also(fd, size, algo, key)[0]


def hash_fd_also(fd: int, size: int, algo: str = "xxh3_128", key: bytes | None = None,
                 also: str | None = None) -> tuple[str, str | None]:
    """:func:`hash_fd`, plus the unkeyed ``also`` digest of the same bytes from the same read pass.

    A keyed digest proves the bytes to the receiver but means nothing to anyone else; a manifest
    or a flow record needs a digest others can check (``fstream send --manifest``). Both come from
    one read, so they describe the same bytes even if the source changes afterwards.
    """
    h = new_hasher(algo, key)
    extra = new_hasher(also) if also else None
    off = 0
    while off < size:
        chunk = os.pread(fd, min(CHUNK, size - off), off)
        if not chunk:
            raise EOFError(f"file shorter than expected ({off} of {size} bytes)")
        h.update(chunk)
        if extra is not None:
            extra.update(chunk)
        off += len(chunk)
    return h.hexdigest(), extra.hexdigest() if extra is not None else None


class PrefixHasher:
    """Hashes a file's bytes in order while the rest is still arriving, so the commit only reads the tail.

    Whoever extends the contiguous prefix calls ``advance``; if another thread is already hashing,
    it returns at once. ``finish`` hashes what is left and returns the digest. Bytes are always read
    back from disk (a part taken over from an earlier session is hashed with this session's key).
    """

    def __init__(self, algo: str = "xxh3_128", key: bytes | None = None) -> None:
        self._h = new_hasher(algo, key)
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


def hash_path(path: str, algo: str = "xxh3_128", key: bytes | None = None) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return hash_fd(fd, os.fstat(fd).st_size, algo, key)
    finally:
        os.close(fd)
