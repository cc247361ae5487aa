"""An index of resumable part files per destination directory, so opening a file never lists its directory.

Each directory is listed once per receiver process (to find parts left by an earlier run);
after that the receiver records every part it creates, renames or removes. Opening N files in
one directory costs O(N) in all instead of O(N²).
"""

from __future__ import annotations

import os
import threading

from transfer_agent.paths import stem_of


def part_stem(name: str) -> str | None:
    """``.STEM.<job>.<attempt>.part`` → STEM (None for other names)."""
    if not (name.startswith(".") and name.endswith(".part")):
        return None
    parts = name[1:-len(".part")].rsplit(".", 2)
    return parts[0] if len(parts) == 3 and parts[2].isdigit() else None


class PartIndex:
    """Part-file names per (device, inode) of a directory, grouped by the stem of the final name."""

    def __init__(self) -> None:
        self._dirs: dict[tuple[int, int], dict[str, set[str]]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def dir_key(dir_fd: int) -> tuple[int, int]:
        st = os.fstat(dir_fd)
        return st.st_dev, st.st_ino

    def _index(self, dir_fd: int, key: tuple[int, int]) -> dict[str, set[str]]:
        with self._lock:
            idx = self._dirs.get(key)
        if idx is not None:
            return idx
        idx = {}
        for name in os.listdir(dir_fd):
            stem = part_stem(name)
            if stem is not None:
                idx.setdefault(stem, set()).add(name)
        with self._lock:
            return self._dirs.setdefault(key, idx)

    def candidates(self, dir_fd: int, base: str, key: tuple[int, int] | None = None) -> list[str]:
        """Existing part names for final name ``base`` in this directory."""
        idx = self._index(dir_fd, key or self.dir_key(dir_fd))
        with self._lock:
            return sorted(idx.get(stem_of(base), ()))

    def add(self, dir_fd: int, base: str, name: str, key: tuple[int, int] | None = None) -> None:
        idx = self._index(dir_fd, key or self.dir_key(dir_fd))
        with self._lock:
            idx.setdefault(stem_of(base), set()).add(name)

    def remove(self, key: tuple[int, int], base: str, name: str) -> None:
        """Forget a part of the directory ``key`` = (dev, ino) (renamed into place, or deleted)."""
        with self._lock:
            names = self._dirs.get(key, {}).get(stem_of(base))
            if names is not None:
                names.discard(name)
                if not names:
                    del self._dirs[key][stem_of(base)]
