"""Opening a path beneath a directory descriptor as a filesystem boundary (issue 40): openat2, or a walk.

``open_path(dir_fd, rel, span_mounts=...)`` returns an ``O_PATH`` descriptor of ``rel`` below ``dir_fd``
without following any symbolic link (not one in the middle, not the last one: a last component that is a
link comes back as a descriptor of the link itself), without ``..`` climbing out, and, unless
``span_mounts``, without crossing into another mount (a bind mount counts). An ``O_PATH`` descriptor opens
nothing for I/O: a FIFO's writer is not woken, a device's driver is not called, an HSM file is not recalled.

Two ways, the same answer:

* ``openat2(2)`` (Linux 5.6+) with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`` (and
  ``RESOLVE_NO_XDEV``): one system call, the kernel enforces it (syscall 437 through ``ctypes``; Python 3.11
  has no binding);
* a walk of ``O_PATH | O_NOFOLLOW`` opens, one component at a time from ``dir_fd``, each checked with
  ``fstat`` (a link is refused) and, for the mount rule, its device and mount id (``/proc/self/fdinfo``;
  a bind mount of the same file system keeps ``st_dev``) against ``dir_fd``'s.

``FSTREAM_OPENAT2=0`` in the environment forces the walk (tests run both).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import stat

SYS_OPENAT2 = 437  # the same number on every architecture (the unified syscall table, Linux 5.6)
RESOLVE_NO_XDEV, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x01, 0x02, 0x04, 0x08
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_BOUNDARY = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS


class Crossing(Exception):
    """``rel`` leaves the boundary: ``reason`` says how (a symbolic link, a mount, ``..``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


LINK = "is or passes through a symbolic link, which a root boundary does not follow"
MOUNT = "crosses a mount point (a root reads only its own file system unless it is declared with span_mounts = true)"
DOTDOT = "has a '..' component"


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


@functools.cache
def _syscall():  # noqa: ANN202 - a ctypes function
    fn = ctypes.CDLL(None, use_errno=True).syscall
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
    return fn


@functools.cache
def _how(flags: int, resolve: int) -> tuple[_OpenHow, int]:
    """A ``struct open_how`` (kept alive here: the kernel only reads it) and its address."""
    how = _OpenHow(flags, 0, resolve)
    return how, ctypes.addressof(how)


_HOW_SIZE = ctypes.sizeof(_OpenHow)


def openat2(dir_fd: int, path: str, flags: int, resolve: int) -> int:
    """``openat2(dir_fd, path, {flags, 0, resolve})``: a descriptor, or ``OSError`` with the kernel's errno."""
    call, (_, how), raw = _syscall(), _how(flags, resolve), os.fsencode(path)
    for _ in range(8):  # EAGAIN: a rename or mount raced the lookup; the kernel asks to try again
        fd = call(SYS_OPENAT2, dir_fd, raw, how, _HOW_SIZE)
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            raise OSError(err, os.strerror(err), path)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)


@functools.cache
def kernel_has_openat2() -> bool:
    """True when this kernel answers ``openat2`` (not ``ENOSYS``, nor a seccomp filter's ``EPERM``)."""
    try:
        os.close(openat2(os.open("/", os.O_PATH | os.O_CLOEXEC), ".", _PATH_FLAGS, RESOLVE_BENEATH))
    except OSError:
        return False
    return True


def use_openat2() -> bool:
    """``openat2`` unless the kernel lacks it or ``FSTREAM_OPENAT2=0`` asks for the walk."""
    return os.environ.get("FSTREAM_OPENAT2", "1") != "0" and kernel_has_openat2()


def mount_id(fd: int) -> int | None:
    """The mount a descriptor's file is on (``mnt_id`` of ``/proc/self/fdinfo``), or None without ``/proc``."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
            for line in f:
                if line.startswith(b"mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def open_path(dir_fd: int, rel: str, *, span_mounts: bool = False, openat2_ok: bool | None = None,
              flags: int = _PATH_FLAGS) -> int:
    """An ``O_PATH`` descriptor of ``rel`` beneath ``dir_fd`` (module docstring), or ``Crossing`` saying why not.

    ``OSError`` for the rest (``ENOENT``: it is not there; ``ENOTDIR``; ``EACCES``). ``openat2_ok`` None: as
    ``use_openat2()`` says. ``flags`` other than the default open the last component for I/O (only for a host
    without ``/proc``, where ``reopen`` cannot be used; it must hold ``O_NOFOLLOW``).
    """
    parts = rel.split("/")
    if ".." in parts:
        raise Crossing(DOTDOT)
    if rel.startswith("/"):
        raise Crossing("is an absolute name, not one beneath the root")
    if use_openat2() if openat2_ok is None else openat2_ok:
        try:
            return openat2(dir_fd, rel or ".", flags, _BOUNDARY if span_mounts else _BOUNDARY | RESOLVE_NO_XDEV)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Crossing(LINK) from None
            if exc.errno == errno.EXDEV:  # no '..' and no link: only a mount crossing leaves a BENEATH lookup
                raise Crossing(MOUNT) from None
            raise
    parts = [p for p in parts if p and p != "."]
    if not parts:
        return os.open(".", _PATH_FLAGS, dir_fd=dir_fd)
    return _walk(dir_fd, parts, span_mounts, flags)


def _walk(dir_fd: int, parts: list[str], span_mounts: bool, flags: int) -> int:
    """The fallback: one ``O_PATH | O_NOFOLLOW`` open per component, each checked before the next."""
    top = os.fstat(dir_fd)
    top_mnt = None if span_mounts else mount_id(dir_fd)
    cur = dir_fd
    try:
        for i, comp in enumerate(parts):
            fd = os.open(comp, flags if i == len(parts) - 1 else _PATH_FLAGS, dir_fd=cur)
            if cur != dir_fd:
                os.close(cur)
            cur = fd
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode) and i < len(parts) - 1:  # a last link comes back as itself, as openat2's
                raise Crossing(LINK)
            if not span_mounts and (st.st_dev != top.st_dev or (top_mnt is not None and mount_id(fd) != top_mnt)):
                raise Crossing(MOUNT)
            if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), "/".join(parts[:i + 1]))
    except BaseException:
        if cur != dir_fd:
            os.close(cur)
        raise
    return cur


@functools.cache
def have_proc_fd() -> bool:
    """``/proc/self/fd`` is there (``reopen`` works)."""
    return os.path.isdir("/proc/self/fd")


def reopen(path_fd: int, flags: int = os.O_RDONLY | os.O_CLOEXEC) -> int:
    """Open for I/O the very file an ``O_PATH`` descriptor holds (through its ``/proc/self/fd`` entry: no
    lookup by name, so nothing swapped in since can be opened instead). ``OSError`` without ``/proc``."""
    return os.open(f"/proc/self/fd/{path_fd}", flags)
