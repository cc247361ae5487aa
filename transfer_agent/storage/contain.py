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
* ``SourceRoots.check_fd``: the file actually opened, read back from its descriptor (issue 32's gate).

Path checks are not a boundary (issue 40): a hard link inside a root to a file elsewhere, a bind mount, and
a link swapped in after the check (followed by ``open`` before the check saw it: a FIFO's writer outside was
woken) all passed. ``Guard.open`` is the gate now: each file is opened beneath its root's directory
descriptor (``storage.beneath``: openat2 with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
| RESOLVE_NO_XDEV``, or a walk of ``O_NOFOLLOW`` opens), as ``O_PATH`` first, so nothing is opened for I/O
before ``fstat`` says it is a regular file with one link (unless the policy allows hard links) on the root's
own mount (unless the root spans mounts); then the same inode is reopened for reading.
"""

from __future__ import annotations

import glob
import os
import stat
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from transfer_agent.errors import RefusedError
from transfer_agent.storage.beneath import LINK, Crossing, have_proc_fd, open_path, reopen, use_openat2

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
    span_mounts: frozenset[str] = frozenset()  # the roots declared to span mounts (the others stay on their own)
    allow_hardlinks: bool | None = None  # files with several links: None says nothing (a Guard's default: refuse)

    def __post_init__(self) -> None:
        object.__setattr__(self, "roots", tuple(self.roots))
        object.__setattr__(self, "span_mounts", frozenset(self.span_mounts))
        for root in self.roots:
            if not os.path.isabs(root) or os.path.normpath(root) != root or root.startswith("//"):
                raise ValueError(f"source root {root!r}: not an absolute, normalised path (use SourceRoots.of)")

    @classmethod
    def of(cls, paths: Iterable[Any], *, allow_hardlinks: bool | None = None) -> SourceRoots:
        """Resolve each path (``os.path.realpath``) and keep it; ``ValueError`` naming a path that is no directory.

        A path is a string (or ``PathLike``), or a policy root entry: a mapping or an object with ``path`` and
        ``span_mounts`` (``{ path = "/data", span_mounts = true }``).
        """
        roots: list[str] = []
        spans: set[str] = set()
        for entry in paths:
            path, span = _entry(entry)
            given = os.fspath(path)
            real = os.path.realpath(given)
            why = "does not exist" if not os.path.exists(real) else None if os.path.isdir(real) else "not a directory"
            if why:
                raise ValueError(f"source root {given!r}: {why}" + (f" (resolves to {real!r})" if real != given else ""))
            if real not in roots:
                roots.append(real)
            if span:
                spans.add(real)
        return cls(tuple(roots), frozenset(spans), allow_hardlinks)

    def innermost(self, resolved: str) -> str | None:
        """The deepest root containing ``resolved`` (as ``contains`` judges), or None."""
        inside = [r for r in self.roots if self.contains_under(resolved, r)]
        return max(inside, key=len) if inside else None

    @staticmethod
    def contains_under(resolved: str, root: str) -> bool:
        return resolved == root or resolved.startswith(root if root == "/" else root + "/")

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
        return any(self.contains_under(resolved, root) for root in self.roots)

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


def _entry(entry: Any) -> tuple[Any, bool]:
    """(path, span_mounts) of a root as the policy gives it: a path, a mapping, or an object with ``path``."""
    if isinstance(entry, (str, os.PathLike)):
        return entry, False
    if isinstance(entry, dict):
        return entry["path"], bool(entry.get("span_mounts", False))
    return entry.path, bool(getattr(entry, "span_mounts", False))


def _close_all(fds: dict[str, int]) -> None:
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


class Guard:
    """The roots a job may read (the agent's, then the submitter's): checks each listed file, opens each source.

    ``admit`` resolves each listed file's directory once (and each listed file that is a link): what is outside
    fails unread. ``open`` is the boundary (module docstring): the file's resolved name is opened beneath the
    innermost root that holds it, through every root of the job (each opened beneath the one above it, the
    topmost beneath ``/``, all without following a link), so a link, mount or hard link swapped in since the
    listing is refused before anything is opened for I/O. Root descriptors are kept while the guard lives.

    :param roots: every one must hold a file (a submitter's roots lie within the agent's).
    :param openat2: None: ``beneath.use_openat2()``; False forces the walk of ``O_NOFOLLOW`` opens.
    """

    def __init__(self, *roots: SourceRoots, openat2: bool | None = None) -> None:
        self.roots = roots
        # the most specific set that says decides (a submitter's entry, then the agent's); refuse when none does
        self.allow_hardlinks = next((r.allow_hardlinks for r in reversed(roots) if r.allow_hardlinks is not None),
                                    False)
        self.openat2 = use_openat2() if openat2 is None else openat2
        self._dirs: dict[str, str | RefusedError] = {}  # directory -> its resolved name, or its refusal
        self._links: dict[str, str] = {}  # a listed file that is a link -> what it resolved to (within the roots)
        self._fds: dict[str, int] = {}  # innermost root -> its O_PATH descriptor
        self._at: dict[str, tuple[str, int, str, bool]] = {}  # listed directory -> where its files are opened
        self._fd_lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _close_all, self._fds)

    def close(self) -> None:
        """Close the root descriptors (also done when the guard is collected)."""
        self._finalizer()

    def check_path(self, path: str) -> str:
        """Refuse ``path`` unless every set of roots holds it; its resolved name."""
        resolved = path
        for r in self.roots:
            resolved = r.check_path(path)
        return resolved

    def check_fd(self, fd: int, path: str) -> None:
        for r in self.roots:
            r.check_fd(fd, path)

    def _resolved_dir(self, d: str) -> str:
        got = self._dirs.get(d)
        if got is None:
            try:
                got = self.check_path(d)
            except RefusedError as exc:
                got = exc
            if len(self._dirs) > 10_000:
                self._dirs.clear()
            self._dirs[d] = got
        if isinstance(got, RefusedError):
            raise got
        return got

    def admit(self, files: list[Any], refused: Any) -> list[Any]:
        """The listed files (``SrcFile``) that may be sent; ``refused(file, error)`` is called for each other.

        Each file's directory is resolved once (a glob match or a walked directory reached through a link that
        points out is refused with all its files: nothing in it is opened), and each file that is itself a
        link. The rest is left to ``open``, the boundary: resolving every file here cost ~8 µs CPU each
        (``fstream bench authz``)."""
        out = []
        for sf in files:
            try:
                try:
                    self._resolved_dir(os.path.dirname(sf.src))
                except RefusedError as exc:
                    raise RefusedError(f"{sf.src}: in {exc}") from None
                if os.path.islink(sf.src):
                    if len(self._links) > 10_000:
                        self._links.clear()
                    self._links[sf.src] = self.check_path(sf.src)
                out.append(sf)
            except RefusedError as exc:
                refused(sf, exc)
        return out

    def open(self, path: str) -> tuple[int, os.stat_result]:
        """Open the listed file ``path`` for reading beneath its roots: (descriptor, its ``fstat``).

        ``OutsideRootsError`` naming the file, the root and the reason (a link, a mount, not a regular file, hard
        links); ``FileNotFoundError`` when it is gone; other ``OSError`` as the kernel says.
        """
        link = self._links.get(path)
        if link is not None:
            root, dir_fd, rel, span = self._where(path, link)
        else:
            d, name = os.path.split(path)
            at = self._at.get(d)  # (root, its descriptor, the directory's name beneath it, span): once per directory
            if at is None:
                top = self._resolved_dir(d)
                at = self._where(path, top)
                if len(self._at) > 10_000:
                    self._at.clear()
                self._at[d] = at
            root, dir_fd, rel, span = at
            rel = f"{rel}/{name}" if rel else name
        try:
            pfd = open_path(dir_fd, rel, span_mounts=span, openat2_ok=self.openat2)
        except Crossing as c:
            raise self._refusal(path, root, f"it {c.reason}") from None
        try:
            st = os.fstat(pfd)
            if stat.S_ISLNK(st.st_mode):
                raise self._refusal(path, root, f"it {LINK}")
            if not stat.S_ISREG(st.st_mode):
                raise self._refusal(path, root, f"it is {_kind_of(st.st_mode)}, not a regular file, and only "
                                                "regular files are opened")
            if st.st_nlink > 1 and not self.allow_hardlinks:
                raise self._refusal(path, root, f"it has {st.st_nlink} hard links, so the same file may also be "
                                                "reached from outside the roots; hard-linked files are sent only "
                                                "where the policy says allow_hardlinks = true")
            if have_proc_fd():
                fd = reopen(pfd)
            else:  # no /proc: open by name again (no link followed) and make sure it is the same file
                fd = open_path(dir_fd, rel, span_mounts=span, openat2_ok=self.openat2,
                               flags=os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
                now = os.fstat(fd)
                if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                    os.close(fd)
                    raise self._refusal(path, root, "it was replaced while it was being opened")
        except Crossing as c:
            raise self._refusal(path, root, f"it {c.reason}") from None
        finally:
            os.close(pfd)
        return fd, st

    def _where(self, path: str, resolved: str) -> tuple[str, int, str, bool]:
        """Where ``resolved`` is opened: its innermost root, that root's descriptor, the name beneath it, and
        whether every root holding it spans mounts."""
        chain = self._chain(path, resolved)
        root = chain[-1][0]
        return root, self._root_fd(path, chain), resolved[len(root):].lstrip("/"), all(s for _, s in chain)

    def _refusal(self, path: str, root: str, why: str) -> OutsideRootsError:
        return OutsideRootsError(f"file {path!r} refused: {why} (source root {root})")

    def _chain(self, path: str, resolved: str) -> list[tuple[str, bool]]:
        """The innermost root of each set holding ``resolved``, outermost first, each with its span_mounts."""
        chain: dict[str, bool] = {}
        for r in self.roots:
            root = r.innermost(resolved)
            if root is None:
                raise r._refuse("file", path, resolved)
            chain[root] = chain.get(root, True) and root in r.span_mounts
        return sorted(chain.items(), key=lambda kv: len(kv[0]))

    def _root_fd(self, path: str, chain: list[tuple[str, bool]]) -> int:
        """The innermost root's descriptor: the outermost opened beneath ``/`` following no link, each next one
        beneath the one before (crossing a mount only where every root above spans mounts)."""
        innermost = chain[-1][0]
        fd = self._fds.get(innermost)
        if fd is not None:
            return fd
        with self._fd_lock:
            if innermost in self._fds:
                return self._fds[innermost]
            cur, above, span = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), "/", True
            try:
                for root, root_span in chain:
                    try:
                        nxt = open_path(cur, root[len(above):].lstrip("/"), span_mounts=span, openat2_ok=self.openat2)
                    except Crossing as c:
                        raise OutsideRootsError(f"file {path!r} refused: source root {root} {c.reason} (beneath "
                                                f"{above}; changed since the policy was loaded?)") from None
                    except OSError as exc:
                        raise OutsideRootsError(f"file {path!r} refused: source root {root} cannot be opened "
                                                f"({exc.strerror})") from None
                    os.close(cur)
                    cur, above, span = nxt, root, span and root_span
                    mode = os.fstat(cur).st_mode
                    if not stat.S_ISDIR(mode):
                        why = LINK if stat.S_ISLNK(mode) else "is not a directory"
                        raise OutsideRootsError(f"file {path!r} refused: source root {root} {why} (changed since "
                                                "the policy was loaded?)")
            except BaseException:
                os.close(cur)
                raise
            self._fds[innermost] = cur
            return cur
