"""Source containment (issue 32, "Authorization"): an agent sends only files under its configured source roots.

The threat: a job on the bus names a source the agent's operator never meant to serve. It may say so
plainly (``/etc/shadow``), climb out with ``..`` (``/data/lcls/../../etc/passwd``), go through a
symbolic link inside a root that points outside (a directory link, a file link, a relative
``../../outside``, a chain of links), or be a file that was inside when the job was accepted and is
swapped for a link to somewhere else before the agent opens it.

Three checks, each on the name the kernel would really follow (``os.path.realpath`` resolves links
before it applies ``..``, as the kernel does; a lexical ``abspath`` first would not), compared with
the roots component by component (``/data/lc`` does not contain ``/data/lcls/x``):

* ``SourceRoots.check_source``: a job's source as written, before anything is listed;
* ``SourceRoots.check_path``: each concrete file the listing found;
* ``SourceRoots.check_fd``: the file actually opened, read back from its descriptor. A name can be
  swapped between a check and an ``open`` (TOCTOU); a descriptor cannot, so this one is the gate.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from transfer_agent.errors import RefusedError

_PROC_FD = "/proc/self/fd"  # where the kernel names each open descriptor's file (Linux)


class OutsideRootsError(RefusedError):
    """A job's source, a listed file or an opened file lies outside the agent's source roots (terminal)."""

    kind = "outside roots"


def _kind_of(mode: int) -> str:
    """What a non-regular file is, in words, for the refusal message."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def literal_part(source: str) -> str:
    """The part of ``source`` before its first component holding a glob magic character (all of it if none).

    ``/data/run42/*.h5`` -> ``/data/run42``; ``/data/**/x.h5`` -> ``/data``; ``/*`` -> ``/``.
    """
    parts = source.split("/")
    for i, comp in enumerate(parts):
        if glob.has_magic(comp):
            return "/".join(parts[:i]) or ("/" if source.startswith("/") else "")
    return source


@dataclass(frozen=True)
class SourceRoots:
    """The directories this agent serves, each absolute and symlink-resolved; no roots serve nothing.

    Build it with ``SourceRoots.of(paths)``, which resolves and validates the paths.
    """

    roots: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "roots", tuple(self.roots))
        for root in self.roots:
            if not os.path.isabs(root) or os.path.normpath(root) != root or root.startswith("//"):
                raise ValueError(f"source root {root!r}: not an absolute, normalised path (use SourceRoots.of)")

    @classmethod
    def of(cls, paths: Iterable[str | os.PathLike]) -> SourceRoots:
        """Resolve each path (``os.path.realpath``) and keep it; ``ValueError`` naming a path that is no directory."""
        roots: list[str] = []
        for path in paths:
            given = os.fspath(path)
            real = os.path.realpath(given)
            why = "does not exist" if not os.path.exists(real) else None if os.path.isdir(real) else "not a directory"
            if why:
                raise ValueError(f"source root {given!r}: {why}" + (f" (resolves to {real!r})" if real != given else ""))
            if real not in roots:
                roots.append(real)
        return cls(tuple(roots))

    def describe(self) -> str:
        """The roots for a message: ``/a, /b``, or ``none configured``."""
        return ", ".join(self.roots) if self.roots else "none configured"

    def contains(self, resolved: str) -> bool:
        """True when ``resolved`` (absolute, normalised, links resolved) is a root or lies under one.

        Component-wise, not a string prefix: root ``/data/lc`` does not contain ``/data/lcls/x``.
        Anything not absolute and normalised (``pipe:[7]``, ``/a/../b``) is contained by nothing.
        """
        if not resolved.startswith("/") or resolved.startswith("//") or os.path.normpath(resolved) != resolved:
            return False
        for root in self.roots:
            if resolved == root or resolved.startswith(root if root == "/" else root + "/"):
                return True
        return False

    def _refuse(self, what: str, name: str, resolved: str | None, verb: str = "resolves to") -> OutsideRootsError:
        """The one message shape: what was named, what it really is, the roots allowed."""
        if not self.roots:
            return OutsideRootsError(f"{what} {name!r} refused: no source roots are configured on this agent, "
                                     "so it serves no files")
        where = f" {verb} {resolved!r}," if resolved is not None and resolved != name else " is"
        return OutsideRootsError(f"{what} {name!r}{where} outside this agent's source roots ({self.describe()})")

    def _resolve(self, what: str, name: str, literal: str | None = None) -> str:
        """``os.path.realpath`` of ``literal`` (default ``name``); a relative name or a NUL byte is refused."""
        if not self.roots:
            raise self._refuse(what, name, None)
        if not isinstance(name, str) or not name.startswith("/"):
            raise OutsideRootsError(f"{what} {name!r} refused: a job's sources must be absolute paths "
                                    f"(this agent's source roots: {self.describe()})")
        try:
            return os.path.realpath(name if literal is None else literal)
        except ValueError:  # an embedded NUL or an unencodable character: no file has that name
            raise OutsideRootsError(f"{what} {name!r} refused: not a valid path (a NUL byte or an "
                                    "unencodable character)") from None

    def check_source(self, source: str) -> str:
        """Refuse a job's source (file, directory or glob) unless its literal part resolves within a root.

        The literal part is the path before the first component with a glob magic character; it is
        resolved as the kernel would (links first, then ``..``); a part that does not exist yet is
        resolved as far as it exists. A ``..`` after a wildcard cannot be judged before listing and is
        refused. Returns the resolved literal part.
        """
        literal = literal_part(source) if isinstance(source, str) else source
        resolved = self._resolve("source", source, literal)
        if ".." in source[len(literal):].split("/"):
            raise OutsideRootsError(f"source {source!r} refused: a '..' after a wildcard cannot be checked "
                                    f"before listing (this agent's source roots: {self.describe()})")
        if not self.contains(resolved):
            raise self._refuse("source", source, resolved)
        return resolved

    def check_path(self, path: str) -> str:
        """Refuse a concrete file found by listing unless it resolves within a root; returns the resolved path."""
        resolved = self._resolve("file", path)
        if not self.contains(resolved):
            raise self._refuse("file", path, resolved)
        return resolved

    def check_fd(self, fd: int, path: str) -> None:
        """Refuse the file just opened as ``path`` unless it lies within a root and is a regular file.

        Reads what the descriptor really is (``/proc/self/fd``), so a link swapped in after the job was
        accepted is caught whatever the name says now. Without ``/proc``: the descriptor's (device,
        inode) must be those of ``realpath(path)``, and that must lie within a root.
        """
        if not self.roots:
            raise self._refuse("file", path, None)
        st = os.fstat(fd)
        try:
            opened = os.readlink(f"{_PROC_FD}/{fd}")
        except OSError:
            opened = None
        if opened is None:
            opened = os.path.realpath(path)
            try:
                now = os.stat(opened)
            except OSError:
                raise OutsideRootsError(f"file {path!r} opened a file no longer found at {opened!r} "
                                        f"(this agent's source roots: {self.describe()})") from None
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise OutsideRootsError(f"file {path!r} opened a file that is not the one at {opened!r} "
                                        f"(replaced after it was opened?; source roots: {self.describe()})")
        if not self.contains(opened):
            raise self._refuse("file", path, opened, verb="opened")
        if not stat.S_ISREG(st.st_mode):
            raise OutsideRootsError(f"file {path!r} opened {opened!r}, which is {_kind_of(st.st_mode)}, "
                                    "not a regular file")
