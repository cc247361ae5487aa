"""The one file watcher: a lister, the stability rule and a seen/claim store, polled sync or async.

Each poll lists (full or incremental), drops what the store has seen, keeps what held still
(:class:`~fstream_provider.watch.stability.StabilityTracker`), and, once at least ``min_files`` are
complete, claims the oldest ``max_files`` in the store and returns the ones this caller won. The
agent's ``--watch`` (:mod:`fstream_provider.watch.source_watcher`), the Airflow sensor (``poll``)
and trigger (``apoll``) and the channels' ``watch_path`` all run this loop. This is the thesis'
"streaming data finder" (fstream-thesis ch. 2).
"""

from __future__ import annotations

from typing import Any

from fstream_provider.watch.listing import Lister
from fstream_provider.watch.seen import AsyncSeenStore, MemorySeenStore, SeenStore
from fstream_provider.watch.stability import FileStat, StabilityTracker
from fstream_provider.watch.pattern import PatternLister


def select_batch(candidates: list[FileStat], max_files: int | None) -> list[FileStat]:
    """The first ``max_files`` (listings come oldest first), or all."""
    return candidates[:max_files] if max_files else list(candidates)


def batch_payload(files: list[FileStat], *, scope: str, location: str) -> dict[str, Any]:
    """The XCom / TriggerEvent body for a batch of new files."""
    total = sum(f.size for f in files)
    return {
        "status": "success",
        "message": f"{len(files)} new complete file(s), {total} bytes, in {location}",
        "files": [f.path for f in files],
        "details": [f.to_dict() for f in files],
        "bytes": total,
        "scope": scope,
        "location": location,
    }


class Watcher:
    """Report new, complete files, each once.

    :param lister: what to list (:class:`~fstream_provider.watch.tree.TreeLister` locally,
        :class:`~fstream_provider.watch.listing.LocationLister` for a directory or SFTP).
    :param store: the seen/claim store; ``poll`` needs a sync one, ``apoll`` an async one.
    :param min_age: files older than this many seconds count as complete on the first look.
    :param stable_for: seconds a file's size and mtime must have held still (``0``: two looks).
    """

    def __init__(self, lister: Lister, *, store: SeenStore | AsyncSeenStore | None = None, min_age: float = 0.0,
                 stable_for: float = 0.0) -> None:
        self.lister = lister
        self.store = store if store is not None else MemorySeenStore()
        self.tracker = StabilityTracker(min_age=min_age, stable_for=stable_for)
        self.last_complete = 0  # complete, unseen files found by the last poll

    @property
    def pending(self) -> int:
        """Files seen but not yet complete (or complete but not yet claimed)."""
        return len(self.tracker.pending)

    def _complete(self, fresh: list[FileStat], min_files: int, max_files: int | None) -> list[FileStat]:
        stable = self.tracker.observe(fresh)
        self.last_complete = len(stable)
        return select_batch(stable, max_files) if len(stable) >= min_files else []

    def poll(self, min_files: int = 1, max_files: int | None = None, scan_limit: int | None = None) -> list[FileStat]:
        """One look: the files this caller claimed (oldest first), or ``[]``.

        :param scan_limit: list at most this many new files in this look (a lister with ``scan(limit=)``,
            :class:`~fstream_provider.watch.tree.TreeLister`); the rest of its pass comes with the next looks.
        """
        pending = self.tracker.pending
        files = self.lister.scan(pending) if scan_limit is None else self.lister.scan(pending, limit=scan_limit)
        batch = self._complete(self.store.unseen(files), min_files, max_files)
        won = self.store.claim(batch) if batch else []
        self.tracker.forget(f.path for f in won)
        return won

    async def apoll(self, min_files: int = 1, max_files: int | None = None) -> list[FileStat]:
        """:meth:`poll` for an event loop: lists in a thread (file system and SFTP block), async store."""
        import asyncio  # here, not at import: `fstream send` never awaits, and asyncio costs every run ~10 ms

        files = await asyncio.to_thread(self.lister.scan, self.tracker.pending)
        batch = self._complete(await self.store.aunseen(files), min_files, max_files)
        won = await self.store.aclaim(batch) if batch else []
        self.tracker.forget(f.path for f in won)
        return won

    def close(self) -> None:
        self.lister.close()


def watch_path(path: str, *, stable_for: float = 0.0, min_age: float = 0.0, include_hidden: bool = False,
               use_inotify: bool = True, store: SeenStore | AsyncSeenStore | None = None) -> Watcher:
    """A watcher of local files named by a glob or a directory (what ``channel.watch_path`` needs).

    The glob is read the way Nextflow reads it (:mod:`fstream_provider.watch.pattern`): its base
    directory is listed incrementally with inotify where available, and each file's ``rel`` is its
    path relative to that base.
    """
    store = store if store is not None else MemorySeenStore()
    known = store.__contains__ if isinstance(store, MemorySeenStore) else None  # skip shipped files while listing
    lister = PatternLister(path, use_inotify=use_inotify, include_hidden=include_hidden, known=known)
    return Watcher(lister, store=store, min_age=min_age, stable_for=stable_for)
