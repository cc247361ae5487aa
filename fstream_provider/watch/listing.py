"""The listing layer: what a lister is, the full local listing, and the polling backend for remote hosts.

A lister's ``scan(recheck)`` returns the current :class:`FileStat` of the files it can see; an
incremental lister (the agent's :class:`~fstream_provider.watch.tree.TreeLister`) also re-stats the
``recheck`` paths (files still waiting to be complete) that it did not list again. The remote backend
polls any object with paramiko's ``listdir_attr`` (:class:`RemoteDir`), opened by a callable the
caller supplies, so this room never imports paramiko: ``fstream_provider.hooks.sftp`` supplies it.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import stat as statmod
from typing import Any, Callable, Collection, Protocol

from fstream_provider.watch.location import Location
from fstream_provider.watch.stability import FileStat


class Lister(Protocol):
    """Something that lists files to watch."""

    def scan(self, recheck: Collection[str] = ()) -> list[FileStat]: ...

    def close(self) -> None: ...


class RemoteDir(Protocol):
    """A remote directory session (``paramiko.SFTPClient`` has this shape)."""

    def listdir_attr(self, path: str) -> list[Any]: ...

    def close(self) -> None: ...


def matches(rel: str, pattern: str) -> bool:
    """``pattern`` matches the relative path or the file name."""
    return fnmatch.fnmatchcase(rel, pattern) or fnmatch.fnmatchcase(posixpath.basename(rel), pattern)


def hidden_or_partial(name: str) -> bool:
    """Dot-files include our own ".NAME.<job>.<attempt>.part" temps and most writers' temp files."""
    return name.startswith(".") or name.endswith((".part", ".tmp", ".swp"))


def list_local(directory: str, pattern: str = "*", recursive: bool = False) -> list[FileStat]:
    """Regular files under ``directory`` matching ``pattern`` (on the relative path or the name)."""
    out: list[FileStat] = []
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"watch directory {directory!r} does not exist or is not a directory")
    stack = [directory]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except FileNotFoundError:
            continue  # removed while scanning
        for e in entries:
            if hidden_or_partial(e.name):
                continue
            try:
                if e.is_dir(follow_symlinks=False):
                    if recursive:
                        stack.append(e.path)
                    continue
                if not e.is_file(follow_symlinks=False):
                    continue
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            rel = os.path.relpath(e.path, directory)
            if matches(rel, pattern):
                out.append(FileStat(path=e.path, size=st.st_size, mtime=st.st_mtime, mtime_ns=st.st_mtime_ns,
                                    rel=rel.replace(os.sep, "/")))
    out.sort(key=lambda f: (f.mtime, f.path))
    return out


def list_remote(fs: RemoteDir, directory: str, pattern: str = "*", recursive: bool = False) -> list[FileStat]:
    """Like :func:`list_local` over a remote directory session (SFTP)."""
    out: list[FileStat] = []
    stack = [directory]
    while stack:
        d = stack.pop()
        try:
            attrs = fs.listdir_attr(d)
        except FileNotFoundError:
            if d == directory:
                raise FileNotFoundError(f"remote watch directory {directory!r} does not exist") from None
            continue
        for a in attrs:
            if hidden_or_partial(a.filename):
                continue
            path = posixpath.join(d, a.filename)
            mode = a.st_mode or 0
            if statmod.S_ISDIR(mode):
                if recursive:
                    stack.append(path)
                continue
            if not statmod.S_ISREG(mode):
                continue
            rel = posixpath.relpath(path, directory)
            if matches(rel, pattern):
                out.append(FileStat(path=path, size=int(a.st_size or 0), mtime=float(a.st_mtime or 0), rel=rel))
    out.sort(key=lambda f: (f.mtime, f.path))
    return out


class LocationLister:
    """Lists a :class:`Location` in full each scan: locally, or over one reused remote session (polling).

    :param location: where to look.
    :param pattern: glob on the relative path or the file name.
    :param recursive: descend into subdirectories.
    :param connect: opens a :class:`RemoteDir` for a remote location (called again after a broken
        session); ``None`` for local locations only.
    """

    def __init__(self, location: Location, *, pattern: str = "*", recursive: bool = False,
                 connect: Callable[[], RemoteDir] | None = None) -> None:
        self.location = location
        self.pattern = pattern
        self.recursive = recursive
        self.connect = connect
        self._remote: RemoteDir | None = None

    def scan(self, recheck: Collection[str] = ()) -> list[FileStat]:
        """Every matching file now (a full listing: ``recheck`` needs no extra work)."""
        if not self.location.is_remote:
            return list_local(self.location.directory, self.pattern, self.recursive)
        if self._remote is None:
            if self.connect is None:
                raise ValueError(f"{self.location.url()}: a remote location needs a connect callable")
            self._remote = self.connect()
        try:
            return list_remote(self._remote, self.location.directory, self.pattern, self.recursive)
        except FileNotFoundError:
            raise
        except Exception as exc:  # OSError, EOFError, paramiko.SSHException: the session is broken
            self.close()  # reconnect on the next scan
            raise ConnectionError(f"SFTP {self.location.url()}: listing failed ({type(exc).__name__}: {exc})") from exc

    def close(self) -> None:
        if self._remote is not None:
            remote, self._remote = self._remote, None
            remote.close()
