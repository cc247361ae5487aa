"""End-to-end checksums, read with preadv into one reused buffer (DESIGN.md "Rules for never losing data").

Cost per byte (issue 13, BENCHMARKS §12): a 1 MiB buffer read again and again stays in the CPU's
cache, so the hash reads what the copy just wrote (0.27 CPU-s per GiB for keyed BLAKE3 against 0.33
with a fresh 8 MiB ``bytes`` per chunk); BLAKE3 uses several threads only for a large input on a
process allowed more than one CPU (on one CPU the threads only add hand-offs: 67 against 37 us for
a 256 KiB file). Never ``mmap``: a source truncated while it is hashed would kill the process with
SIGBUS instead of failing the file.

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

from transfer_agent.storage import gil_meter

CHUNK = 1 << 20  # bytes per read: the buffer stays in cache between the copy and the hash
ALGORITHMS = ("xxh3_128", "blake3", "blake3-keyed")
KEYED = ("blake3-keyed",)
THREADED_MIN = 64 << 20  # blake3 hashes inputs this large on several threads, when there are CPUs for them
_buffers = threading.local()


def _threads_pay(size: int | None) -> bool:
    """Several hashing threads help only for a large input on a process allowed more than one CPU."""
    if size is None or size < THREADED_MIN:
        return False
    try:
        return len(os.sched_getaffinity(0)) > 1
    except (AttributeError, OSError):
        return (os.cpu_count() or 1) > 1


def _blake3(key: bytes | None = None, size: int | None = None):
    try:
        import blake3
    except ImportError:
        raise ValueError("checksum blake3: the blake3 package is not installed") from None
    threads = blake3.blake3.AUTO if _threads_pay(size) else 1
    if key is None:
        return blake3.blake3(max_threads=threads)
    return blake3.blake3(key=key, max_threads=threads)


def new_hasher(algo: str = "xxh3_128", key: bytes | None = None, size: int | None = None):
    """A hasher for ``algo``; keyed algorithms need the 32-byte ``key`` (unkeyed ones refuse one).
    ``size`` (the input's length, if known) decides whether BLAKE3 may use several threads."""
    if algo in KEYED:
        if key is None or len(key) != 32:
            raise ValueError(f"checksum {algo}: needs a 32-byte session key (shared-secret mode only)")
        return _blake3(key, size)
    if key is not None:
        raise ValueError(f"checksum {algo!r} is not keyed; a key was given")
    if algo == "xxh3_128":
        return xxhash.xxh3_128()
    if algo == "blake3":
        return _blake3(None, size)
    raise ValueError(f"checksum {algo!r}: unknown algorithm (use {', '.join(ALGORITHMS)})")


def _buffer() -> memoryview:
    """This thread's reusable read buffer (hash threads run concurrently, each with its own)."""
    buf = getattr(_buffers, "view", None)
    if buf is None:
        buf = _buffers.view = memoryview(bytearray(CHUNK))
    return buf


def read_range(fd: int, start: int, end: int):
    """Yield ``fd``'s bytes ``[start, end)`` as views of one reused buffer (valid until the next one);
    raises ``EOFError`` if the file ends first."""
    buf = _buffer()
    off = start
    while off < end:
        n = os.preadv(fd, [buf[:min(CHUNK, end - off)]], off)
        if n == 0:
            raise EOFError(f"file shorter than expected ({off} of {end} bytes)")
        yield buf[:n]
        off += n


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
    h = new_hasher(algo, key, size)
    extra = new_hasher(also) if also else None
    t = gil_meter.clock()
    for chunk in read_range(fd, 0, size):  # preadv and both packages' update release the GIL
        h.update(chunk)
        if extra is not None:
            extra.update(chunk)
    gil_meter.add(gil_meter.clock() - t)
    return h.hexdigest(), extra.hexdigest() if extra is not None else None


class PrefixHasher:
    """Hashes a file's bytes in order while the rest is still arriving, so the commit only reads the tail.

    Whoever extends the contiguous prefix calls ``advance``; if another thread is already hashing,
    it returns at once. ``finish`` hashes what is left and returns the digest. Bytes are always read
    back from disk (a part taken over from an earlier session is hashed with this session's key).
    """

    def __init__(self, algo: str = "xxh3_128", key: bytes | None = None, size: int | None = None) -> None:
        self._h = new_hasher(algo, key, size)
        self.done_upto = 0
        self._lock = threading.Lock()

    def _run(self, fd: int, upto: int) -> None:
        t = gil_meter.clock()
        for chunk in read_range(fd, self.done_upto, upto):
            self._h.update(chunk)
            self.done_upto += len(chunk)
        gil_meter.add(gil_meter.clock() - t)

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
