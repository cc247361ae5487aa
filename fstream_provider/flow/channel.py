"""Channel factories, Nextflow's ``channel.*`` in Python: ``from fstream_provider.flow import channel``.

- ``channel.of(*values)`` and ``channel.from_iterable(it)``: a channel of given values;
- ``channel.from_path(glob)``: the files a glob matches now, in path order, then the channel ends;
- ``channel.watch_path(glob, interval=..., stable_for=...)``: files as they arrive, each once and only
  once complete, until the subscription stops (``.take``, ``.until``, a ``break``).

Files come out as :class:`pathlib.Path`. Globs read as in Nextflow (:mod:`fstream_provider.watch.pattern`):
``*`` stays in one directory, ``**`` crosses them. Both file factories run the one file watcher of
the code base (:mod:`fstream_provider.watch`), which the agent's ``--watch`` and the Airflow sensor
and trigger also run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from fstream_provider.flow.core import Channel, from_iterable
from fstream_provider.flow.pipe import END, Pipe, Subscription
from fstream_provider.watch.pattern import PatternLister, list_matching
from fstream_provider.watch.seen import MemorySeenStore
from fstream_provider.watch.watcher import Watcher

__all__ = ["of", "from_iterable", "from_path", "watch_path", "Channel"]


def of(*values: Any) -> Channel:
    """A channel of ``values``, in order."""
    return from_iterable(list(values), "of")


class FileSource:
    """Where a file channel's paths come from: the glob, its base directory (``transfer`` places each
    file at its path relative to it) and whether it keeps watching."""

    def __init__(self, pattern: str, base: str) -> None:
        self.pattern = pattern
        self.base = base
        self._prefix = base.rstrip(os.sep) + os.sep

    def rel(self, path: str | os.PathLike) -> str:
        """``path`` relative to the base, or its name when it is elsewhere (a ``map`` moved it)."""
        p = os.fspath(path)
        if not p.startswith(self._prefix) or "/." in p or "//" in p:  # not plainly under the base: normalise
            p = os.path.abspath(p)
        if p.startswith(self._prefix):
            return p[len(self._prefix):].replace(os.sep, "/")
        return os.path.basename(p)


def from_path(pattern: str, *, hidden: bool = False, capacity: int = 256) -> Channel:
    """The files ``pattern`` matches when the channel is subscribed, in path order; then it ends.

    :param hidden: also emit dot-files (left out by default, as in Nextflow).
    :raises FileNotFoundError: when subscribed, if the pattern's base directory does not exist.
    """
    lister = PatternLister(pattern, use_inotify=False, include_hidden=hidden)  # checks the base now
    lister.close()

    def opener(sub: Subscription) -> Pipe:
        out = Pipe(sub, capacity)

        def run() -> None:
            for p in list_matching(pattern, include_hidden=hidden):
                if not out.put(Path(p)):
                    return
            out.put(END)

        sub.spawn("from_path", run, out)
        return out

    return Channel(opener, "from_path", capacity, FileSource(pattern, lister.base))


def watch_path(pattern: str, *, interval: float = 1.0, stable_for: float = 0.0, existing: bool = True,
               use_inotify: bool = True, hidden: bool = False, capacity: int = 256) -> Channel:
    """Files matching ``pattern`` as they become complete, each once, until the subscription stops.

    A file is complete when its writer closed it or moved it into place (inotify, where the
    directory is local) or when its size and modification time held still between two looks
    ``interval`` seconds apart (and for at least ``stable_for`` seconds). With inotify the watcher
    looks again as soon as the directory changes; without it, every ``interval`` seconds (1 s is
    Nextflow's ``watchPath`` polling). A rewritten file is emitted again.

    :param existing: also emit the files already there when the subscription starts (Nextflow's
        ``watchPath`` does not; ``existing=False`` matches it).
    :param use_inotify: False to poll even where inotify works (network file systems need it).
    :param hidden: also emit dot-files (writers' temp names are usually dot-files).
    :param capacity: files waiting for the next stage before the watcher stops looking (backpressure).
    """
    if interval <= 0:
        raise ValueError(f"watch_path(interval={interval}): must be a positive number of seconds")
    if stable_for < 0:
        raise ValueError(f"watch_path(stable_for={stable_for}): must be >= 0")
    probe = PatternLister(pattern, use_inotify=False, include_hidden=hidden)
    probe.close()

    def opener(sub: Subscription) -> Pipe:
        out = Pipe(sub, capacity)

        def run() -> None:
            store = MemorySeenStore()
            lister = PatternLister(pattern, use_inotify=use_inotify, include_hidden=hidden, known=store.__contains__)
            # a file no close event vouches for must hold still for a whole interval, however often
            # other files' events wake the loop
            quiet = max(stable_for, interval)  # a file untouched this long is complete at the first look
            watcher = Watcher(lister, store=store, stable_for=quiet, min_age=quiet)
            try:
                if not existing:
                    store.claim(lister.scan())  # what is there now counts as seen
                while not sub.stop.is_set() and not out.closed.is_set():
                    for f in watcher.poll():
                        if not out.put(Path(f.path)):
                            return
                    _wait(lister, interval, sub, out)
            finally:
                watcher.close()

        sub.spawn("watch_path", run, out)
        return out

    return Channel(opener, "watch_path", capacity, FileSource(pattern, probe.base))



def _wait(lister: PatternLister, interval: float, sub: Subscription, out: Pipe) -> None:
    """Until the directory changes (inotify) or ``interval`` passed, looking at the stop flags every 0.25 s."""
    end = time.monotonic() + interval
    while not (sub.stop.is_set() or out.closed.is_set()):
        left = end - time.monotonic()
        if left <= 0 or lister.wait(min(left, 0.25)):
            return
