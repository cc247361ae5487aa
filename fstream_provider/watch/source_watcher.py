"""The agent's ``fstream send --watch``: new, complete source files as ``SrcFile``s, each once, with scan cost.

A :class:`~fstream_provider.watch.watcher.Watcher` over the inotify-assisted
:class:`~fstream_provider.watch.tree.TreeLister` with an in-memory seen store: a file is reported
once it was closed or moved in (inotify), or kept its size and mtime across two scans; a file
rewritten after it was shipped is shipped again.
"""

from __future__ import annotations

import time

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
    """

    def __init__(self, sources: list[str], dest_prefix: str, *, use_inotify: bool = True,
                 include_hidden: bool = False) -> None:
        self.sources = list(sources)
        self.dest_prefix = dest_prefix
        self._shipped = MemorySeenStore()
        self._lister = TreeLister(self.sources, dest_prefix, use_inotify=use_inotify, include_hidden=include_hidden,
                                  known=self._shipped.__contains__)
        self._watcher = Watcher(self._lister, store=self._shipped)
        self.last_scan_seconds = 0.0
        self.last_scan_listed = 0

    def close(self) -> None:
        self._watcher.close()

    def poll(self) -> list[SrcFile]:
        """One scan: return files that became complete since the last call."""
        t0 = time.perf_counter()
        ready = [SrcFile(f.path, f.rel, f.size, f.mtime_ns) for f in self._watcher.poll()]
        self.last_scan_seconds = time.perf_counter() - t0
        self.last_scan_listed = self._lister.last_listed
        ready.sort(key=lambda f: f.src)
        return ready

    @property
    def pending_candidates(self) -> int:
        return self._watcher.pending
