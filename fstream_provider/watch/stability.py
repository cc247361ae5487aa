"""The one stability rule: a file is complete once it held still (or inotify saw it closed or moved in)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable


@dataclass(frozen=True)
class FileStat:
    """One file seen by a listing.

    :param path: absolute path on the host that holds it.
    :param size: bytes.
    :param mtime: modification time (UNIX seconds).
    :param mtime_ns: modification time in nanoseconds when the backend knows it (local), else ``0``.
    :param rel: path relative to what is watched (the agent's destination path), when the backend sets it.
    :param closed: the writer closed it or it was moved into place (inotify ``IN_CLOSE_WRITE``/``IN_MOVED_TO``):
        complete without a second look.
    """

    path: str
    size: int
    mtime: float
    mtime_ns: int = field(default=0, compare=False)
    rel: str = field(default="", compare=False)
    closed: bool = field(default=False, compare=False)

    @property
    def signature(self) -> tuple[int, float]:
        """What must not change between two looks: size and mtime (nanoseconds where known)."""
        return (self.size, self.mtime_ns or self.mtime)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "mtime": self.mtime}


class StabilityTracker:
    """Keeps the previous look at each file; a file is complete once size and mtime held still.

    A file is complete when any of these holds: its signature (size, mtime) is the same as at the
    previous look (and, with ``stable_for``, has been for at least that long); inotify saw it closed
    or moved in; its mtime is at least ``min_age`` seconds old. A file missing from a look is
    forgotten (it vanished, or the caller filtered it out as already seen).

    :param min_age: a file whose mtime is at least this many seconds old counts as complete on the
        first look (so a restarted watcher does not wait for a second scan of old files); ``0``
        always requires two looks.
    :param stable_for: seconds the signature must have held still, measured between looks (``0``:
        two looks with the same signature suffice, whatever the time between them).
    """

    def __init__(self, *, min_age: float = 0.0, stable_for: float = 0.0) -> None:
        self.min_age = min_age
        self.stable_for = stable_for
        self._last: dict[str, tuple[tuple[int, float], float]] = {}  # path -> (signature, first seen with it)

    @property
    def pending(self) -> list[str]:
        """Paths seen at the last look that are not yet complete or not yet claimed."""
        return list(self._last)

    def observe(self, files: Iterable[FileStat], now: float | None = None) -> list[FileStat]:
        """Record this look; return the files that are complete."""
        now = time.time() if now is None else now
        current: dict[str, tuple[tuple[int, float], float]] = {}
        stable: list[FileStat] = []
        for f in files:
            sig = f.signature
            prev = self._last.get(f.path)
            since = prev[1] if prev is not None and prev[0] == sig else now
            current[f.path] = (sig, since)
            held = prev is not None and prev[0] == sig and now - since >= self.stable_for
            if f.closed or held or (self.min_age > 0 and now - f.mtime >= self.min_age):
                stable.append(f)
        self._last = current
        return stable

    def forget(self, paths: Iterable[str]) -> None:
        for p in paths:
            self._last.pop(p, None)
        if not self._last:
            self._last = {}  # a dict never shrinks: after a look at a million files, let its table go

    def export(self, limit: int | None = None) -> dict[str, list]:
        """The previous look as JSON-able data (path -> [size, mtime, since]), for a watcher that
        does not live between looks (a rescheduled sensor: a new process per poke).

        :param limit: keep at most this many files, the first seen (listings come oldest first); a file
            left out only needs one more look.
        """
        items = list(self._last.items())[:limit] if limit is not None else self._last.items()
        return {path: [sig[0], sig[1], since] for path, (sig, since) in items}

    def load(self, data: dict[str, list] | None) -> None:
        """Resume from :meth:`export`'s data (entries that do not parse are dropped: one more look)."""
        self._last = {}
        for path, v in (data or {}).items():
            try:
                self._last[str(path)] = ((int(v[0]), v[1]), float(v[2]))
            except (TypeError, ValueError, IndexError):
                continue
