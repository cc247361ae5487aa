"""The local backend: an incremental, inotify-assisted listing of files, directories and globs.

Its cost per scan grows with what changed: directories whose mtime did not change are not listed
again, and with inotify only the named files are looked at. Files a local writer closed or moved
into place (inotify ``IN_CLOSE_WRITE``/``IN_MOVED_TO``) come back marked ``closed``. Files that
vanish between listing and stat are skipped, never an error. A scan can be bounded (``limit``): a
backlog of a million files already present is then listed a window at a time, never whole (issue 43).
"""

from __future__ import annotations

import logging
import os
import select
import stat
from typing import Callable, Collection, Iterator

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
        self._listed = 0  # directory entries listed so far, by all scans
        self._ticker: Callable[[], object] | None = None  # the scan's ``listing_progress`` tick
        self._rest: Iterator[tuple[str, os.stat_result, str]] | None = None  # a pass a bounded scan left

    def close(self) -> None:
        if self._rest is not None:
            self._rest.close()
            self._rest = None
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

    def _tick(self) -> None:
        if self._ticker is not None:
            self._ticker()

    def _walk(self, path: str, prefix: str) -> Iterator[tuple[str, os.stat_result, str]]:
        """The files under ``path`` in directories whose mtime changed, as (path, stat, destination path).

        A generator that a bounded scan leaves suspended (``scan(limit=)``): the next scan goes on from the entry
        where it stopped, with at most one directory open meanwhile. A directory's mtime is noted before it is
        listed, so one that changes while its listing is suspended is listed again by the next pass."""
        cut = len(path) + (0 if path.endswith(os.sep) else 1)  # every listed path starts with the root
        stack = [path]
        while stack:
            d = stack.pop()
            self._tick()
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
                        self._listed += 1
                        if not self._listed % PROGRESS_EVERY:
                            self._tick()
                        if e.is_dir(follow_symlinks=False):
                            subdirs.append(e.path)
                            stack.append(e.path)
                        elif (self.include_hidden or not e.name.startswith(".")) and not self.known(e.path) \
                                and e.is_file():
                            try:
                                st = e.stat()
                            except FileNotFoundError:
                                continue  # removed since it was listed
                            yield e.path, st, join_dest(prefix, e.path[cut:].replace(os.sep, "/"))
            except FileNotFoundError:
                continue

    def _pass(self) -> Iterator[tuple[str, os.stat_result, str]]:
        """One pass over every source: the files of :meth:`_walk`, and the sources that are files."""
        for path, prefix, is_dir in source_roots(self.sources, self.dest_prefix):
            if is_dir:
                yield from self._walk(path, prefix)
            else:
                yield path, os.stat(path), join_dest(prefix, os.path.basename(path))

    @property
    def more(self) -> bool:
        """A bounded scan stopped before the end of its pass: the next scan goes on with it."""
        return self._rest is not None

    def scan(self, recheck: Collection[str] = (), limit: int | None = None) -> list[FileStat]:
        """Files that are new or changed since the last scan, and the ``recheck`` paths that still exist.

        :param limit: list at most this many new files (besides inotify's news and ``recheck``); the rest of
            the pass waits for the next scans (:attr:`more`), so a backlog of millions of files is never held
            at once (issue 43). ``None``: the whole pass.
        """
        found: dict[str, tuple[os.stat_result, str]] = {}
        closed: set[str] = set()
        self._ticker = listing_tick()
        listed = self._listed
        if self._inotify is not None and self._wd_dir:
            self._events(found, closed)
        walk, self._rest = self._rest or self._pass(), None
        try:
            for p, st, rel in walk:
                found[p] = (st, rel)
                if limit is not None and len(found) >= limit:
                    self._rest = walk
                    break
        finally:
            self._ticker = None
        for p in recheck:  # not re-listed this time but still waiting: look at them again
            root_prefix = self._dir_root.get(os.path.dirname(p))
            if p in found or root_prefix is None:
                continue
            try:
                found[p] = (os.stat(p), self._rel(root_prefix[0], root_prefix[1], p))
            except FileNotFoundError:
                continue
        self.last_listed = self._listed - listed
        return [FileStat(p, st.st_size, st.st_mtime, mtime_ns=st.st_mtime_ns, rel=rel, closed=p in closed)
                for p, (st, rel) in found.items()
                if self.include_hidden or not os.path.basename(p).startswith(".")]
