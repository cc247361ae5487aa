"""A seen map for millions of files in 24 bytes each: path digest -> signature digest, in sorted arrays.

A ``--watch`` stream or a channel remembers every file it reported (and the size and mtime it reported
it with, so a rewrite is new again). Kept as ``dict[str, tuple]`` that costs about 300 bytes per file
in CPython, and ~1 KiB of resident memory once the allocator's fragmentation is counted (BENCHMARKS
§16: 128 MiB at 100,000 files). Here each file is a 128-bit BLAKE2b digest of its path (two ``Q``
words) and a 64-bit digest of its signature, in three sorted ``array('Q')`` columns searched with
``bisect``; files added since the last merge wait in a second, smaller set of columns, inserted into the
base (numpy ``searchsorted`` + ``insert``, one column at a time: no Python object per file, and at most
one extra column's memory) once it holds an eighth of the base.

Why digests are safe: a new file is wrongly taken for a reported one only if its 128-bit path digest
equals another path's, about n² / 2¹²⁹ (10⁻²⁶ for a million files); the signature digest only
decides whether a known path was rewritten. The same 24-byte records are what the landed journal
(:mod:`fstream_provider.watch.landed_journal`) stores, so a restarted stream loads them in one step.
"""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_left
from typing import Any


def _np() -> Any:
    try:
        import numpy  # here, not at import: a plain ``fstream send`` never needs it (start-up time)
    except ImportError as exc:  # a provider-only install (issue 39)
        from fstream_provider.extras import agent_only

        raise agent_only(exc, "a seen set held in this process (send --watch, a channel's watch_path)") from exc

    return numpy

RECORD = 24  # bytes per file: path digest (16) + signature digest (8)
_MIN_RECENT = 65536


def path_digest(path: str) -> bytes:
    return hashlib.blake2b(path.encode("utf-8", "surrogateescape"), digest_size=16).digest()


def sig_digest(signature: tuple[int, float]) -> int:
    size, mtime = signature
    return int.from_bytes(hashlib.blake2b(f"{int(size)}:{mtime!r}".encode(), digest_size=8).digest(), "little")


def record(path: str, signature: tuple[int, float]) -> bytes:
    """The 24-byte record of one file (what the journal stores)."""
    return path_digest(path) + sig_digest(signature).to_bytes(8, "little")


class _Columns:
    """Sorted (hi, lo) -> sig columns; searched with ``bisect``, rebuilt by numpy (no object per file)."""

    def __init__(self) -> None:
        self.hi, self.lo, self.sig = array("Q"), array("Q"), array("Q")

    def __len__(self) -> int:
        return len(self.hi)

    def find(self, hi: int, lo: int) -> int:
        i = bisect_left(self.hi, hi)
        n = len(self.hi)
        while i < n and self.hi[i] == hi:
            if self.lo[i] == lo:
                return i
            i += 1
        return -1

    def numpy(self):  # noqa: ANN201
        np = _np()
        return tuple(np.frombuffer(c, dtype=np.uint64) if len(c) else np.empty(0, np.uint64)
                     for c in (self.hi, self.lo, self.sig))

    def _replace(self, columns) -> None:  # noqa: ANN001 - numpy arrays, one per column
        np = _np()
        out = []
        for c in columns:
            a = array("Q")
            a.frombytes(memoryview(np.ascontiguousarray(c)).cast("B") if len(c) else b"")
            out.append(a)
        self.hi, self.lo, self.sig = out

    def insert(self, hi, lo, sig) -> None:  # noqa: ANN001 - numpy arrays
        """Insert rows whose (hi, lo) are not here yet: one column at a time, so the extra memory is one column.

        Rows are ordered by ``hi`` only; :meth:`find` scans a run of equal ``hi`` whatever its ``lo`` order.
        """
        np = _np()
        order = np.argsort(hi, kind="stable")
        hi, lo, sig = hi[order], lo[order], sig[order]
        pos = np.searchsorted(self.numpy()[0], hi) if len(self.hi) else np.zeros(len(hi), dtype=np.intp)
        for name, new in (("hi", hi), ("lo", lo), ("sig", sig)):
            old = getattr(self, name)
            view = np.frombuffer(old, dtype=np.uint64) if len(old) else np.empty(0, np.uint64)
            merged = np.insert(view, pos, new)
            del view
            a = array("Q")
            a.frombytes(memoryview(merged).cast("B") if len(merged) else b"")
            setattr(self, name, a)
            del merged, old

    def merged(self, hi, lo, sig) -> None:  # noqa: ANN001 - numpy arrays
        """Merge rows that may repeat each other or rows here (a journal): the last of each (hi, lo) wins."""
        np = _np()
        old = self.numpy()
        all_hi, all_lo, all_sig = (np.concatenate([a, np.asarray(b, dtype=np.uint64)])
                                   for a, b in zip(old, (hi, lo, sig)))
        del old
        order = np.lexsort((np.arange(len(all_hi)), all_lo, all_hi))  # by hi, lo, then position
        all_hi, all_lo, all_sig = all_hi[order], all_lo[order], all_sig[order]
        if len(all_hi):
            last = np.ones(len(all_hi), dtype=bool)  # keep the last of each (hi, lo) run
            last[:-1] = (all_hi[1:] != all_hi[:-1]) | (all_lo[1:] != all_lo[:-1])
            all_hi, all_lo, all_sig = all_hi[last], all_lo[last], all_sig[last]
        self.hi = self.lo = self.sig = array("Q")
        self._replace((all_hi, all_lo, all_sig))


def _split(d: bytes) -> tuple[int, int]:
    return int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little")


class PackedSeen:
    """Path -> signature digest for many files: 24 bytes a file and no Python object per file.

    Two sorted column sets: the base, and the recent files, merged into the base once they are an
    eighth of it (so adding costs O(recent) per batch and O(n) only every n/8 files). Adding in
    batches (:meth:`set_many`) is what keeps it cheap: one numpy merge per batch.
    """

    def __init__(self) -> None:
        self._base = _Columns()
        self._recent = _Columns()

    def __len__(self) -> int:
        return len(self._base) + len(self._recent)

    def _where(self, d: bytes) -> tuple[_Columns | None, int]:
        hi, lo = _split(d)
        for cols in (self._recent, self._base):
            i = cols.find(hi, lo)
            if i >= 0:
                return cols, i
        return None, -1

    def contains_path(self, path: str) -> bool:
        return self._where(path_digest(path))[0] is not None

    def get(self, path: str) -> int | None:
        """The signature digest ``path`` was recorded with, or None."""
        cols, i = self._where(path_digest(path))
        return cols.sig[i] if cols is not None else None

    def set_many(self, items: list[tuple[bytes, int]]) -> None:
        """Record (path digest, signature digest) pairs; a known path gets its new signature in place."""
        fresh: dict[bytes, int] = {}
        for d, sig in items:
            cols, i = self._where(d)
            if cols is not None:
                cols.sig[i] = sig
            else:
                fresh[d] = sig  # the same path twice in one batch: the last one
        if fresh:
            self._add_blob(b"".join(d + sig.to_bytes(8, "little") for d, sig in fresh.items()))

    def set(self, path: str, signature: tuple[int, float]) -> None:
        self.set_many([(path_digest(path), sig_digest(signature))])

    def add_records(self, blob: bytes) -> int:
        """Add journal records (24 bytes each; a later record of a path wins); return how many were read."""
        n = len(blob) // RECORD
        if n:
            self.merge()  # one place per digest: the recent rows go to the base first
            np = _np()
            recs = np.frombuffer(blob, dtype=np.uint64, count=n * 3).reshape(n, 3)
            self._base.merged(recs[:, 0], recs[:, 1], recs[:, 2])
        return n

    def _add_blob(self, blob: bytes) -> None:
        np = _np()
        recs = np.frombuffer(blob, dtype=np.uint64).reshape(-1, 3)
        self._recent.insert(recs[:, 0], recs[:, 1], recs[:, 2])
        if len(self._recent) >= max(_MIN_RECENT, len(self._base) // 8):
            self.merge()

    def merge(self) -> None:
        """Fold the recent rows into the base."""
        if len(self._recent):
            self._base.insert(*(c.copy() for c in self._recent.numpy()))
            self._recent = _Columns()
