"""Byte-range bookkeeping: which parts of a file have arrived, persisted so a restart resumes exactly."""

from __future__ import annotations

import bisect
import json
import os
from typing import Iterable


class RangeSet:
    """A set of half-open byte ranges ``[start, end)``, kept merged and sorted."""

    __slots__ = ("_starts", "_ends")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for s, e in ranges:
            self.add(s, e)

    def add(self, start: int, end: int) -> None:
        if start < 0 or end < start:
            raise ValueError(f"bad range [{start}, {end})")
        if start == end:
            return
        i = bisect.bisect_left(self._ends, start)  # first range that ends at/after start
        j = bisect.bisect_right(self._starts, end)  # ranges starting after end are untouched
        if i < j:
            start = min(start, self._starts[i])
            end = max(end, self._ends[j - 1])
        self._starts[i:j] = [start]
        self._ends[i:j] = [end]

    def total(self) -> int:
        return sum(e - s for s, e in zip(self._starts, self._ends))

    def overlaps(self, start: int, end: int) -> bool:
        """True if any byte of ``[start, end)`` is already present."""
        if start >= end:
            return False
        i = bisect.bisect_right(self._ends, start)  # first range ending after start
        return i < len(self._starts) and self._starts[i] < end

    def prefix(self) -> int:
        """Length of the contiguous run of bytes from offset 0."""
        return self._ends[0] if self._starts and self._starts[0] == 0 else 0

    def covers(self, size: int) -> bool:
        if size == 0:
            return True
        return len(self._starts) == 1 and self._starts[0] == 0 and self._ends[0] >= size

    def missing(self, size: int) -> list[tuple[int, int]]:
        """The ranges of ``[0, size)`` not yet present."""
        out: list[tuple[int, int]] = []
        pos = 0
        for s, e in zip(self._starts, self._ends):
            if s >= size:
                break
            if s > pos:
                out.append((pos, s))
            pos = max(pos, e)
        if pos < size:
            out.append((pos, size))
        return out

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RangeSet) and self.ranges() == other.ranges()

    def __repr__(self) -> str:
        return f"RangeSet({self.ranges()})"


def write_meta(dir_fd: int, name: str, meta: dict) -> None:
    """Atomically write a JSON sidecar ``name`` in ``dir_fd`` (temp, rename)."""
    tmp = name + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        try:
            os.write(fd, json.dumps(meta, separators=(",", ":")).encode())
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError:
        try:  # disk full mid-write: leave no half-written sidecar temp behind
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def read_meta(dir_fd: int, name: str) -> dict | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        raw = b""
        while chunk := os.read(fd, 1 << 16):
            raw += chunk
    finally:
        os.close(fd)
    try:
        meta = json.loads(raw)
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None
