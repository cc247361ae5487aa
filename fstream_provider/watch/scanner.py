"""Finding source files: one-shot expansion of paths/dirs/globs, and a watcher for streaming mode.

Placement follows ``rsync -a SRC/ DEST/``: a directory's contents land under the destination
path with their relative paths; a file (or a glob match that is a file) lands directly under
it; a glob match that is a directory lands as ``DEST/<dirname>/...``.

The watcher reports only files that stopped growing: either closed after writing or moved
into place (inotify ``IN_CLOSE_WRITE``/``IN_MOVED_TO``, for local directories), or with the
same size and mtime across two scans. Its cost per scan grows with what changed: directories
whose mtime did not change are not listed again, and with inotify only the named files are
looked at.
"""

from __future__ import annotations

import glob
import logging
import os
import stat
from dataclasses import dataclass
from typing import Iterable, Iterator

from fstream_provider.tuning.base import FileInfo

log = logging.getLogger("fstream.scanner")


@dataclass
class SrcFile:
    """A source file and where it goes.

    :param src: absolute source path.
    :param rel: destination path relative to the receiver root.
    :param size: size in bytes when found.
    :param mtime_ns: modification time when found.
    """

    src: str
    rel: str
    size: int
    mtime_ns: int
    cluster: str = "all"
    tries: int = 0  # counted failures (checksum mismatch)
    retries: int = 0  # every retry, for the backoff
    retry_since: float = 0.0  # monotonic time of the first retryable refusal
    retry_at: float = 0.0  # monotonic time before which it is not sent again

    @property
    def info(self) -> FileInfo:
        ext = os.path.splitext(self.src)[1].lstrip(".").lower()
        return FileInfo(self.src, self.size, ext)


def _join(prefix: str, rel: str) -> str:
    return f"{prefix.rstrip('/')}/{rel}" if prefix.strip("/") else rel


def _roots(sources: Iterable[str], dest_prefix: str) -> Iterator[tuple[str, str, bool]]:
    """Yield (path, destination prefix, is_dir) for each source after glob expansion."""
    for s in sources:
        matches = sorted(glob.glob(s, recursive=True)) if glob.has_magic(s) else [s]
        if not matches and glob.has_magic(s):
            continue
        for m in matches:
            path = os.path.abspath(m)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                raise FileNotFoundError(f"source {m!r}: no such file or directory") from None
            if stat.S_ISDIR(st.st_mode):
                prefix = dest_prefix if (m == s and not glob.has_magic(s)) else _join(dest_prefix, os.path.basename(path))
                yield path, prefix, True
            elif stat.S_ISREG(st.st_mode):
                yield path, dest_prefix, False
            else:
                raise ValueError(f"source {m!r}: not a regular file or directory")


def _walk(root: str) -> Iterator[os.DirEntry]:
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=True):
                        yield e
        except FileNotFoundError:
            continue


def expand_sources(sources: Iterable[str], dest_prefix: str) -> list[SrcFile]:
    """All files the sources name now, with their destination paths (one-shot mode)."""
    out: list[SrcFile] = []
    for path, prefix, is_dir in _roots(sources, dest_prefix):
        if is_dir:
            for e in _walk(path):
                st = e.stat()
                out.append(SrcFile(e.path, _join(prefix, os.path.relpath(e.path, path).replace(os.sep, "/")),
                                   st.st_size, st.st_mtime_ns))
        else:
            st = os.stat(path)
            out.append(SrcFile(path, _join(prefix, os.path.basename(path)), st.st_size, st.st_mtime_ns))
    return out


class SourceWatcher:
    """Report new, complete files under the sources, each once.

    :param sources: files, directories or globs.
    :param dest_prefix: destination path relative to the receiver root.
    :param use_inotify: use inotify for local directories when available.
    :param include_hidden: also ship dot-files; off by default because producers that write a
        hidden temp name and rename it into place (rsync, most DAQ writers, our own ``.part``
        files) would otherwise have their half-finished temp files shipped.
    """

    def __init__(self, sources: list[str], dest_prefix: str, *, use_inotify: bool = True,
                 include_hidden: bool = False) -> None:
        self.sources = list(sources)
        self.include_hidden = include_hidden
        self.dest_prefix = dest_prefix
        self._shipped: dict[str, tuple[int, int]] = {}
        self._candidates: dict[str, tuple[int, int, str]] = {}  # src -> (size, mtime, rel)
        self._dir_mtimes: dict[str, int] = {}
        self._dir_root: dict[str, tuple[str, str]] = {}  # dir -> (root, prefix)
        self._subdirs: dict[str, list[str]] = {}
        self._inotify = None
        self._wd_dir: dict[int, str] = {}
        self._closed: set[str] = set()
        if use_inotify:
            try:
                from inotify_simple import INotify
                self._inotify = INotify()
            except (ImportError, OSError) as exc:
                log.debug("inotify unavailable (%s); polling only", exc)
        self.last_scan_seconds = 0.0
        self.last_scan_listed = 0

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None

    @property
    def shipped_count(self) -> int:
        return len(self._shipped)

    def _watch_dir(self, d: str) -> None:
        if self._inotify is None:
            return
        from inotify_simple import flags
        mask = flags.CLOSE_WRITE | flags.MOVED_TO | flags.CREATE | flags.ATTRIB
        try:
            wd = self._inotify.add_watch(d, mask)
            self._wd_dir[wd] = d
        except OSError as exc:
            log.debug("cannot watch %s: %s", d, exc)

    def _rel(self, root: str, prefix: str, path: str) -> str:
        return _join(prefix, os.path.relpath(path, root).replace(os.sep, "/"))

    def poll(self) -> list[SrcFile]:
        """One scan: return files that became complete since the last call."""
        import time as _time

        t0 = _time.perf_counter()
        listed = 0
        seen_now: dict[str, tuple[int, int, str]] = {}
        closed: set[str] = set()
        if self._inotify is not None and self._wd_dir:
            from inotify_simple import flags
            for ev in self._inotify.read(timeout=0):
                d = self._wd_dir.get(ev.wd)
                if d is None or not ev.name:
                    if ev.mask & flags.Q_OVERFLOW:
                        self._dir_mtimes.clear()  # rescan everything
                    continue
                p = os.path.join(d, ev.name)
                if ev.mask & flags.ISDIR:
                    self._dir_mtimes.pop(d, None)
                    continue
                if ev.mask & (flags.CLOSE_WRITE | flags.MOVED_TO):
                    closed.add(p)
                root_prefix = self._dir_root.get(d)
                if root_prefix is not None:
                    try:
                        st = os.stat(p)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        seen_now[p] = (st.st_size, st.st_mtime_ns, self._rel(root_prefix[0], root_prefix[1], p))
        for path, prefix, is_dir in _roots(self.sources, self.dest_prefix):
            if not is_dir:
                st = os.stat(path)
                seen_now[path] = (st.st_size, st.st_mtime_ns, _join(prefix, os.path.basename(path)))
                continue
            stack = [path]
            while stack:
                d = stack.pop()
                try:
                    dst = os.stat(d)
                except FileNotFoundError:
                    continue
                first = d not in self._dir_root
                self._dir_root[d] = (path, prefix)
                if first:
                    self._watch_dir(d)
                if self._dir_mtimes.get(d) == dst.st_mtime_ns and not first:
                    stack.extend(self._subdirs.get(d, ()))  # unchanged: only subdirectories can hold news
                    continue
                self._dir_mtimes[d] = dst.st_mtime_ns
                subdirs: list[str] = []
                self._subdirs[d] = subdirs
                try:
                    with os.scandir(d) as it:
                        for e in it:
                            listed += 1
                            if e.is_dir(follow_symlinks=False):
                                subdirs.append(e.path)
                                stack.append(e.path)
                            elif e.path not in self._shipped and e.is_file():
                                st = e.stat()
                                seen_now[e.path] = (st.st_size, st.st_mtime_ns, self._rel(path, prefix, e.path))
                except FileNotFoundError:
                    continue
        # files not re-listed this time but still candidates: look at them again
        for p, (_size, _mtime, rel) in list(self._candidates.items()):
            if p not in seen_now:
                try:
                    st = os.stat(p)
                except FileNotFoundError:
                    self._candidates.pop(p, None)
                    continue
                seen_now[p] = (st.st_size, st.st_mtime_ns, rel)
        ready: list[SrcFile] = []
        for p, (size, mtime, rel) in seen_now.items():
            if self._shipped.get(p) == (size, mtime):
                continue
            if not self.include_hidden and os.path.basename(p).startswith("."):
                continue
            prev = self._candidates.get(p)
            if p in closed or (prev is not None and prev[0] == size and prev[1] == mtime):
                self._candidates.pop(p, None)
                self._shipped[p] = (size, mtime)
                ready.append(SrcFile(p, rel, size, mtime))
            else:
                self._candidates[p] = (size, mtime, rel)
        self.last_scan_seconds = _time.perf_counter() - t0
        self.last_scan_listed = listed
        ready.sort(key=lambda f: f.src)
        return ready

    @property
    def pending_candidates(self) -> int:
        return len(self._candidates)
