"""The agent's source files (``SrcFile``) and where each goes: rsync-style placement and one-shot expansion.

Placement follows ``rsync -a SRC/ DEST/``: a directory's contents land under the destination
path with their relative paths; a file (or a glob match that is a file) lands directly under
it; a glob match that is a directory lands as ``DEST/<dirname>/...``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import stat
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from fstream_provider.tuning.base import FileInfo


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


def join_dest(prefix: str, rel: str) -> str:
    """``rel`` under the destination ``prefix`` (no prefix: ``rel`` itself)."""
    return f"{prefix.rstrip('/')}/{rel}" if prefix.strip("/") else rel


def source_roots(sources: Iterable[str], dest_prefix: str) -> Iterator[tuple[str, str, bool]]:
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
                prefix = dest_prefix if (m == s and not glob.has_magic(s)) else join_dest(dest_prefix,
                                                                                         os.path.basename(path))
                yield path, prefix, True
            elif stat.S_ISREG(st.st_mode):
                yield path, dest_prefix, False
            else:
                raise ValueError(f"source {m!r}: not a regular file or directory")


# what a listing calls as it goes on (``listing_progress``): set per thread (a context variable), unset by default
_progress: ContextVar[Callable[[], object] | None] = ContextVar("fstream_listing_progress", default=None)
PROGRESS_EVERY = 1024  # entries of one directory between two calls (and one call per directory)


@contextlib.contextmanager
def listing_progress(tick: Callable[[], object]) -> Iterator[None]:
    """Within this block, on this thread, listings call ``tick()`` as they go: once per directory and every
    ``PROGRESS_EVERY`` entries. A daemon's loop that lists sources (a job's files, their size for the scheduler)
    keeps systemd's watchdog fed this way, so a listing of millions of files on a slow file system is not taken
    for a hung loop (issue 39); the tick itself decides whether a ping is due."""
    token = _progress.set(tick)
    try:
        yield
    finally:
        _progress.reset(token)


def listing_tick() -> Callable[[], object] | None:
    """The ``listing_progress`` tick of this thread, if any (what a listing loop calls as it goes)."""
    return _progress.get()


def walk_files(root: str) -> Iterator[os.DirEntry]:
    """Regular files under ``root`` (symlinks to files too), directories not followed; vanished ones skipped."""
    tick = _progress.get()
    stack = [root]
    while stack:
        d = stack.pop()
        if tick is not None:
            tick()
        try:
            with os.scandir(d) as it:
                for n, e in enumerate(it, 1):
                    if tick is not None and not n % PROGRESS_EVERY:
                        tick()
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=True):
                        yield e
        except FileNotFoundError:
            continue


def expand_sources(sources: Iterable[str], dest_prefix: str) -> list[SrcFile]:
    """All files the sources name now, with their destination paths (one-shot mode)."""
    out: list[SrcFile] = []
    for path, prefix, is_dir in source_roots(sources, dest_prefix):
        if is_dir:
            # every walked path starts with the root: cut it off (relpath cost 15 us a file)
            cut = len(path) + (0 if path.endswith(os.sep) else 1)
            for e in walk_files(path):
                st = e.stat()
                out.append(SrcFile(e.path, join_dest(prefix, e.path[cut:].replace(os.sep, "/")), st.st_size,
                                   st.st_mtime_ns))
        else:
            st = os.stat(path)
            out.append(SrcFile(path, join_dest(prefix, os.path.basename(path)), st.st_size, st.st_mtime_ns))
    return out
