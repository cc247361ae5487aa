"""The landed journal of a ``--watch`` stream: which files reached the destination, so a restart skips them.

Without it a restarted stream offers every file again and each one costs a round trip and a hash on both
sides (the receiver answers "already here" only after hashing its copy): a million landed files kept a
restarted stream from moving new bytes for minutes. With it, the restarted watcher loads the journal into
its seen map (:class:`~fstream_provider.watch.packed_seen.PackedSeen`) and never even stats those files.

One file per stream under the state dir, ``<state>/streams/<id>.landed``, where ``<id>`` names the
stream's sources and destination. Each landed file (committed, or skipped as already there) appends one
24-byte record (:func:`~fstream_provider.watch.packed_seen.record`: path digest, size-and-mtime digest)
with ``O_APPEND``, in batches. A torn last record (a crash mid-write) is ignored; a record lost with it
only means that file is offered again, and the receiver skips it after comparing digests. A rewritten
source file has a new signature, so it is new again. When the file holds more than twice as many records
as distinct files, it is rewritten (to a temporary name, fsynced, renamed).

Not kept: files the destination lost after landing (a consumer deleted them). Landed is landed: a restart
does not re-send them. Remove the journal (its path is logged when it is loaded) to have everything
offered again and checked against the destination.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from fstream_provider.model.statedir import state_dir
from fstream_provider.watch.packed_seen import RECORD, record

SUFFIX = ".landed"


def stream_id(sources: list[str], destination: str) -> str:
    """A stable name for a stream: its sources (in order) and its destination URL or path."""
    text = json.dumps({"sources": list(sources), "destination": destination}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def journal_path(sources: list[str], destination: str, base: Path | None = None) -> Path:
    return (base or state_dir()) / "streams" / f"{stream_id(sources, destination)}{SUFFIX}"


class LandedJournal:
    """Append-only landed records of one stream; thread-safe.

    :param path: the journal file (its directory is created, mode 0700).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._buf: list[bytes] = []

    def load(self) -> bytes:
        """Every whole record in the file (a torn last record is dropped)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return b""
        return data[: len(data) - len(data) % RECORD]

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            size = os.fstat(self._fd).st_size
            if size % RECORD:  # a torn record from a crash: cut it off so the next ones line up
                os.ftruncate(self._fd, size - size % RECORD)
        return self._fd

    def landed(self, path: str, size: int, mtime_ns: int) -> None:
        """Record one landed file (buffered; :meth:`flush` writes)."""
        rec = record(path, (size, mtime_ns))
        with self._lock:
            self._buf.append(rec)
            if len(self._buf) >= 256:
                self._flush_locked()

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._buf:
            blob, self._buf = b"".join(self._buf), []
            os.write(self._open(), blob)

    def compact(self, distinct: int) -> bool:
        """Rewrite the file when it holds more than twice ``distinct`` records; return whether it did."""
        with self._lock:
            self._flush_locked()
            blob = self.load()
            if len(blob) // RECORD <= 2 * max(distinct, 1):
                return False
            last: dict[bytes, bytes] = {}
            for i in range(0, len(blob), RECORD):
                last[blob[i:i + 16]] = blob[i + 16:i + RECORD]
            tmp = self.path.with_name(self.path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, b"".join(k + v for k, v in last.items()))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            return True

    def close(self) -> None:
        with self._lock:
            self._flush_locked()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
