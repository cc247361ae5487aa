"""The local backend: an incremental, inotify-assisted listing of files, directories and globs.

Its cost per scan grows with what changed: directories whose mtime did not change are not listed
again, and with inotify only the named files are looked at. Files a local writer closed or moved
into place (inotify ``IN_CLOSE_WRITE``/``IN_MOVED_TO``) come back marked ``closed``. Files that
vanish between listing and stat are skipped, never an error.
"""

from __future__ import annotations

import logging
import os
import select
import stat
from typing import Callable, Collection

from fstream_provider.watch.sources import PROGRESS_EVERY, join_dest, listing_tick, source_roots
from fstream_provider.watch.stability import FileStat

log = logging.getLogger("fstream.scanner")


class TreeLister:
    """Lists the files under sources (files, directories or globs), each with its destination path.

    :param sources: files, directories or globs (globs are expanded again at every scan).
    :param dest_prefix: destination path the files' ``rel`` starts with (rsync-style placement).
    :param use_inotify: use inotify for local directories when available.
    :param include_hidden: also list dot-files; off by default because producers that write a
        hidden temp name and rename it into place (rsync, most DAQ writers, our own ``.part``
        files) would otherwise have their half-finished temp files reported.
    :param known: paths for which a re-listed directory entry needs no stat (already reported);
        inotify events still stat them, so a rewritten file is seen.
    """

    def __init__(self, sources: list[str], dest_prefix: str = "", *, use_inotify: bool = True,
                 include_hidden: bool = False, known: Callable[[str], bool] | None = None) -> None:
        self.sources = list(sources)
        self.dest_prefix = dest_prefix
        self.include_hidden = include_hidden
        self.known = known or (lambda _path: False)
        self._dir_mtimes: dict[str, int] = {}
        self._dir_root: dict[str, tuple[str, str]] = {}  # dir -> (root, prefix)
        self._subdirs: dict[str, list[str]] = {}
        self._inotify = None
        self._wd_dir: dict[int, str] = {}
        if use_inotify:
            try:
                from inotify_simple import INotify
                self._inotify = INotify()
            except (ImportError, OSError) as exc:
                log.debug("inotify unavailable (%s); polling only", exc)
        self.last_listed = 0

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None

    @property
    def notifying(self) -> bool:
        """True when inotify watches the listed directories (``wait`` can return as soon as something changes)."""
        return self._inotify is not None and bool(self._wd_dir)

    def wait(self, timeout: float) -> bool:
        """Block until inotify has news for the next ``scan`` or ``timeout`` seconds pass; True on news.

        Without inotify it just sleeps: a polling watcher looks again after ``timeout``.
        """
        if not self.notifying:
            select.select([], [], [], max(0.0, timeout))
            return False
        ready, _, _ = select.select([self._inotify.fileno()], [], [], max(0.0, timeout))
        return bool(ready)

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
        return join_dest(prefix, os.path.relpath(path, root).replace(os.sep, "/"))

    def _events(self, found: dict[str, tuple[os.stat_result, str]], closed: set[str]) -> None:
        """Read pending inotify events: stat the files they name, note the ones closed or moved in."""
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
                    found[p] = (st, self._rel(root_prefix[0], root_prefix[1], p))

    def _list_dirs(self, path: str, prefix: str, found: dict[str, tuple[os.stat_result, str]]) -> int:
        """List the directories under ``path`` whose mtime changed; return how many entries were listed."""
        listed = 0
        stack = [path]
        tick = listing_tick()
        while stack:
            d = stack.pop()
            if tick is not None:
                tick()
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
                        if tick is not None and not listed % PROGRESS_EVERY:
                            tick()
                        if e.is_dir(follow_symlinks=False):
                            subdirs.append(e.path)
                            stack.append(e.path)
                        elif not self.known(e.path) and e.is_file():
                            found[e.path] = (e.stat(), self._rel(path, prefix, e.path))
            except FileNotFoundError:
                continue
        return listed

    def scan(self, recheck: Collection[str] = ()) -> list[FileStat]:
        """Files that are new or changed since the last scan, and the ``recheck`` paths that still exist."""
        listed = 0
        found: dict[str, tuple[os.stat_result, str]] = {}
        closed: set[str] = set()
        if self._inotify is not None and self._wd_dir:
            self._events(found, closed)
        for path, prefix, is_dir in source_roots(self.sources, self.dest_prefix):
            if is_dir:
                listed += self._list_dirs(path, prefix, found)
            else:
                found[path] = (os.stat(path), join_dest(prefix, os.path.basename(path)))
        for p in recheck:  # not re-listed this time but still waiting: look at them again
            root_prefix = self._dir_root.get(os.path.dirname(p))
            if p in found or root_prefix is None:
                continue
            try:
                found[p] = (os.stat(p), self._rel(root_prefix[0], root_prefix[1], p))
            except FileNotFoundError:
                continue
        self.last_listed = listed
        return [FileStat(p, st.st_size, st.st_mtime, mtime_ns=st.st_mtime_ns, rel=rel, closed=p in closed)
                for p, (st, rel) in found.items()
                if self.include_hidden or not os.path.basename(p).startswith(".")]
