"""A file's BLAKE3 digest from its blocks as they arrive: subtree values merged at commit (issue 29).

BLAKE3 hashes a binary tree of 1 KiB chunks (BLAKE3 paper, section 2.1). Each data block the receiver
takes in is cut into nodes of the file's tree (``native/src/lib.rs``, ``next_piece``) and hashed while
its bytes pass through memory on their way to disk; the commit merges the 32-byte chaining values into
the root along the tree's shape (``left_len``) and reads back only what no block covered: a part taken
over from an earlier session (hashed then with another session's key), a block edge that is not on a
chunk boundary. The result is exactly ``blake3(file)``, keyed or not: no second read of the file.

The native module (``_blake3tree``, Rust, built by setuptools-rust from ``native/``) does the hashing,
the receive loop and the read-back with the GIL released. Without it (no cargo where the package was
built, or ``FSTREAM_NATIVE=0``) ``NATIVE`` is False and the receiver keeps the old path, a read of each
file back at commit (``checksum.PrefixHasher``/``hash_fd``), which gives the same digests. Which way a file
is hashed is decided in one place: ``hash_plan.plan``.
"""

from __future__ import annotations

import bisect
import os
import threading

from transfer_agent.storage import gil_meter

TREE_ALGOS = ("blake3", "blake3-keyed")

_native = None
WHY_NOT = "FSTREAM_NATIVE=0"
"""Why ``NATIVE`` is False (empty when it is True): what the start line and ``fstream doctor`` say."""
if os.environ.get("FSTREAM_NATIVE", "1") != "0":
    try:
        from transfer_agent.storage import _blake3tree as _native  # type: ignore[no-redef]
        WHY_NOT = ""
    except ModuleNotFoundError:
        WHY_NOT = "module transfer_agent.storage._blake3tree not installed: the package was built without it"
    except ImportError as exc:  # present but not loadable (another platform's build, a broken file)
        WHY_NOT = f"module transfer_agent.storage._blake3tree does not load: {exc}"
NATIVE = _native is not None


def native_status() -> dict[str, object]:
    """Whether this process hashes received blocks natively, and if not why and what it costs (JSON-able)."""
    if NATIVE:
        return {"in_use": True, "why_not": None, "read_back_per_file": False}
    return {"in_use": False, "why_not": WHY_NOT, "read_back_per_file": True}


def native_line() -> str:
    """One line for a daemon's start and ``fstream doctor``: native hashing in use, or not, why, and the cost."""
    if NATIVE:
        return "native BLAKE3 tree hashing in use: received files are verified from their blocks as they land"
    return (f"native BLAKE3 tree hashing not in use ({WHY_NOT}): each received file is read back once at commit "
            "to verify it")
CHUNK = 1024


def left_len(n: int) -> int:
    """The length of the left subtree of a node of ``n`` > 1024 bytes: the largest power of two below ``n``
    in whole chunks (the ``blake3`` crate's ``hazmat::left_subtree_len``)."""
    return 1 << ((n + 1) // 2 - 1).bit_length()


def usable(algo: str) -> bool:
    """Whether ``algo`` digests can be computed from blocks as they arrive in this process."""
    return NATIVE and algo in TREE_ALGOS


class TreeDigest:
    """The pieces of one file's tree hashed so far, and the digest they give at commit.

    :param size: the file's length in bytes.
    :param key: the 32-byte key for ``blake3-keyed``; None for ``blake3``.
    """

    def __init__(self, size: int, key: bytes | None) -> None:
        if _native is None:
            raise RuntimeError("TreeDigest needs the native module (transfer_agent.storage._blake3tree)")
        self.size, self.key = size, key
        self._pieces: dict[int, tuple[int, bytes]] = {}  # start -> (length, value)
        self._lock = threading.Lock()
        self.bytes_hashed = 0  # bytes covered by pieces (what the commit will not read back)

    def block(self, offset: int, length: int):
        """A native ``BlockTree`` for one block of this file: ``pump`` it from a socket or ``feed`` it bytes,
        then hand its ``take()`` to ``add``."""
        return _native.BlockTree(offset, length, self.size, self.key)

    def add(self, pieces) -> None:
        """Keep finished pieces (start, length, value, is root) of a block."""
        if not pieces:
            return
        with self._lock:
            for start, length, value, _root in pieces:
                self._pieces[start] = (length, value)
                self.bytes_hashed += length

    def digest(self, fd: int) -> str:
        """The file's hex digest: the pieces merged, the uncovered nodes read back from ``fd``."""
        with self._lock:
            pieces = dict(self._pieces)
        starts = sorted(pieces)
        if self.size == 0:
            return _native.subtree_fd(fd, 0, 0, 0, self.key).hex()

        def covered(start: int, length: int) -> bool:
            i = bisect.bisect_left(starts, start + length) - 1  # the last piece starting before the node's end
            return i >= 0 and starts[i] + pieces[starts[i]][0] > start

        def node(start: int, length: int, root: bool) -> bytes:
            got = pieces.get(start)
            if got is not None and got[0] == length:
                return got[1]
            if length <= CHUNK or not covered(start, length):
                t = gil_meter.clock()
                value = _native.subtree_fd(fd, start, length, self.size, self.key)
                gil_meter.add(gil_meter.clock() - t)
                return value
            left = left_len(length)
            return _native.merge(node(start, left, False), node(start + left, length - left, False), self.key, root)

        return node(0, self.size, True).hex()
