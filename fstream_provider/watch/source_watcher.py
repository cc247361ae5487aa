"""The agent's ``fstream send --watch``: new, complete source files as ``SrcFile``s, each once, with scan cost.

A :class:`~fstream_provider.watch.watcher.Watcher` over the inotify-assisted
:class:`~fstream_provider.watch.tree.TreeLister` with an in-memory seen store: a file is reported
once it was closed or moved in (inotify), or kept its size and mtime across two scans; a file
rewritten after it was shipped is shipped again. With a landed journal
(:mod:`fstream_provider.watch.landed_journal`) the files that landed in an earlier run of the same stream
count as shipped from the first scan on, so a restart lists them without a stat and moves new files at once.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from fstream_provider.watch.landed_journal import LandedJournal
from fstream_provider.watch.seen import MemorySeenStore
from fstream_provider.watch.sources import SrcFile
from fstream_provider.watch.tree import TreeLister
from fstream_provider.watch.watcher import Watcher


class SourceWatcher:
    """Report new, complete files under the sources, each once.

    :param sources: files, directories or globs.
    :param dest_prefix: destination path relative to the receiver root.
    :param use_inotify: use inotify for local directories when available.
    :param include_hidden: also ship dot-files (see :class:`~fstream_provider.watch.tree.TreeLister`).
    :param journal: the stream's landed journal: its files count as shipped; :meth:`landed` adds to it.
    """

    def __init__(self, sources: list[str], dest_prefix: str, *, use_inotify: bool = True,
                 include_hidden: bool = False, journal: Path | None = None) -> None:
        self.sources = list(sources)
        self.dest_prefix = dest_prefix
        self._shipped = MemorySeenStore()
        self.journal = LandedJournal(journal) if journal is not None else None
        self.journal_loaded = 0
        if self.journal is not None:
            t0 = time.perf_counter()
            self.journal_loaded = self._shipped.add_records(self.journal.load())
            if self.journal_loaded:
                logging.getLogger(__name__).info(
                    "%s: %d landed file(s) of an earlier run skipped (%.2f s); remove the file to offer them "
                    "again", self.journal.path, self.journal_loaded, time.perf_counter() - t0)
        # the first scan after loading a journal stats the journaled files: one rewritten while the stream was
        # down (another size or mtime) is offered again; later scans skip known paths without a stat
        self._check_journal = bool(self.journal_loaded)
        self._lister = TreeLister(self.sources, dest_prefix, use_inotify=use_inotify, include_hidden=include_hidden,
                                  known=self._known)
        self._watcher = Watcher(self._lister, store=self._shipped)
        self.last_scan_seconds = 0.0
        self.last_scan_listed = 0

    def close(self) -> None:
        self._watcher.close()
        if self.journal is not None:
            self.journal.close()
            self.journal.compact(len(self._shipped))

    def _known(self, path: str) -> bool:
        if path not in self._shipped:
            return False
        if not self._check_journal:
            return True
        try:
            st = os.stat(path)
        except OSError:
            return True  # gone since: nothing to offer
        return self._shipped.same(path, st.st_size, st.st_mtime_ns)

    def landed(self, sf: SrcFile) -> None:
        """``sf`` reached the destination (committed or already there): a restart need not offer it."""
        if self.journal is not None:
            self.journal.landed(sf.src, sf.size, sf.mtime_ns)

    def poll(self, limit: int | None = None) -> list[SrcFile]:
        """One scan: return files that became complete since the last call.

        :param limit: take at most this many files, and list at most this many new ones (issue 43: a stream started
            on a backlog of a million files holds a window of them, not the million; :attr:`backlog` says that
            the listing has more).
        """
        t0 = time.perf_counter()
        if self.journal is not None:
            self.journal.flush()
        ready = [SrcFile(f.path, f.rel, f.size, f.mtime_ns) for f in self._watcher.poll(max_files=limit,
                                                                                          scan_limit=limit)]
        self._check_journal = self._check_journal and self._lister.more  # until the first pass is complete
        self.last_scan_seconds = time.perf_counter() - t0
        self.last_scan_listed = self._lister.last_listed
        ready.sort(key=lambda f: f.src)
        return ready

    @property
    def backlog(self) -> bool:
        """A bounded scan left part of its pass for the next ones: more files may be ready now."""
        return self._lister.more

    @property
    def pending_candidates(self) -> int:
        return self._watcher.pending + self._lister.more
