"""Durable commits on the destination: group fsync (syncfs when many), rename, one directory fsync."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_libc = None


def _syncfs_fn():
    global _libc  # cached handle to libc, not state: safe to share between receivers
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return getattr(_libc, "syncfs", None)


def syncfs(fd: int) -> bool:
    """Flush the whole filesystem holding ``fd`` in one call; False if unsupported."""
    fn = _syncfs_fn()
    if fn is None:
        return False
    if fn(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return True


def free_bytes(dir_fd: int) -> int:
    st = os.fstatvfs(dir_fd)
    return st.f_bavail * st.f_frsize


def reserve(fd: int, size: int) -> None:
    """Reserve space for the whole file so a full disk is found before data flows."""
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (95, 22):  # EOPNOTSUPP / EINVAL: filesystem cannot preallocate
            return
        raise
