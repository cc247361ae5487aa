"""Durable commits on the destination: a group of files flushed together, free space, preallocation."""

from __future__ import annotations

import os
from typing import Any


def sync_files(fds: list[int], pool: Any) -> None:
    """Make a group of files durable together: their ``fdatasync`` calls run concurrently, so the
    filesystem folds them into a few journal commits instead of one synchronous flush per file
    (``syncfs`` would also flush every other writer's dirty data on a shared disk)."""
    if len(fds) == 1:
        os.fdatasync(fds[0])
        return
    for fut in [pool.submit(os.fdatasync, fd) for fd in fds]:
        fut.result()


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
