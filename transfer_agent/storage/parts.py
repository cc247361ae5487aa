"""An index of resumable part files per destination directory, so opening a file never lists its directory;
and the age-based sweep that reclaims orphaned parts.

Each directory is listed once per receiver process (to find parts left by an earlier run);
after that the receiver records every part it creates, renames or removes. Opening N files in
one directory costs O(N) in all instead of O(N²).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from typing import Callable

from transfer_agent.storage.paths import stem_of

log = logging.getLogger("fstream.receiver")


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
        names = os.listdir(dir_fd)
        remove_orphan_sidecars(dir_fd, names)
        for name in names:
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

    def forget(self, key: tuple[int, int], part: str) -> None:
        """Forget the part named ``part`` of the directory ``key`` (removed by the sweep)."""
        stem = part_stem(part)
        with self._lock:
            names = self._dirs.get(key, {}).get(stem or "")
            if names is not None:
                names.discard(part)
                if not names:
                    del self._dirs[key][stem or ""]


def _part_of(name: str) -> str | None:
    """The part name a file belongs to: the part itself, its ``.meta`` sidecar or a sidecar's ``.meta.tmp``."""
    for suffix in (".meta.tmp", ".meta", ""):
        if name.endswith(".part" + suffix):
            part = name[:len(name) - len(suffix)] if suffix else name
            return part if part_stem(part) is not None else None
    return None


def remove_orphan_sidecars(dir_fd: int, names: list[str]) -> list[str]:
    """Remove the ``.part.meta``/``.part.meta.tmp`` sidecars in ``names`` (a listing of ``dir_fd``) whose ``.part``
    is gone, whatever their age: a sidecar without its part describes no bytes (a receiver killed between a
    commit's rename and the sidecar's removal leaves one; issue 8, fault row "receiver SIGKILL mid-rename").
    A sidecar is only ever written while its part exists, so the part is looked up again right before the
    removal. Returns the names removed."""
    present = set(names)
    removed: list[str] = []
    for name in names:
        part = _part_of(name)
        if part is None or part == name or part in present:
            continue
        try:
            os.stat(part, dir_fd=dir_fd, follow_symlinks=False)
            continue  # it exists after all (created since the listing)
        except FileNotFoundError:
            pass
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            continue
        log.info("removed %s: a ranges sidecar whose part is gone (committed or removed before a crash)", name)
        removed.append(name)
    return removed


def sweep_parts(root_fd: int, max_age: float, is_busy: Callable[[tuple[int, int], str], bool] | None = None,
                index: PartIndex | None = None, now: float | None = None,
                lock: threading.Lock | None = None) -> list[str]:
    """Remove orphaned parts (``.part``, ``.part.meta``, ``.part.meta.tmp``) anywhere under ``root_fd`` whose
    newest file was last modified more than ``max_age`` seconds ago (issue 8, defect 7: parts of failed
    attempts are reclaimed), and at once any sidecar whose part is gone (``remove_orphan_sidecars``). Final names are never touched; symbolic links are not followed.

    ``is_busy((dev, ino), stem)`` tells whether a live session holds the file; busy parts are never touched.
    The check and the removal run under ``lock`` (the receiver's, under which sessions claim files), so a
    part cannot be claimed between them. Returns the removed paths, relative to the root.
    """
    now = time.time() if now is None else now
    removed: list[str] = []
    for dirpath, _dirs, files, dfd in os.fwalk(".", dir_fd=root_fd, follow_symlinks=False):
        removed += sweep_dir(dfd, dirpath, max_age, files, is_busy, index, now, lock)
    return removed


def sweep_dir(dfd: int, dirpath: str, max_age: float, names: list[str] | None = None,
              is_busy: Callable[[tuple[int, int], str], bool] | None = None, index: PartIndex | None = None,
              now: float | None = None, lock: threading.Lock | None = None) -> list[str]:
    """``sweep_parts`` for the one directory ``dfd`` (``dirpath`` relative to the root, for the result)."""
    now = time.time() if now is None else now
    names = os.listdir(dfd) if names is None else list(names)
    removed = [os.path.normpath(os.path.join(dirpath, n)) for n in remove_orphan_sidecars(dfd, names)]
    groups: dict[str, list[tuple[str, float]]] = {}
    for name in names:
        part = _part_of(name)
        if part is None:
            continue
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            groups.setdefault(part, []).append((name, st.st_mtime))
    if not groups:
        return removed
    dst = os.fstat(dfd)
    dkey = (dst.st_dev, dst.st_ino)
    for part, members in sorted(groups.items()):
        if now - max(m for _n, m in members) < max_age:
            continue
        stem = part_stem(part) or ""
        with lock if lock is not None else contextlib.nullcontext():
            if is_busy is not None and is_busy(dkey, stem):
                continue
            for name, _m in members:
                try:
                    os.unlink(name, dir_fd=dfd)
                except FileNotFoundError:
                    continue
                removed.append(os.path.normpath(os.path.join(dirpath, name)))
            if index is not None:
                index.forget(dkey, part)
    return removed
