"""Early writeback (issue 43, "Disk"): start writing a part's dirty pages to the disk while the file still arrives.

With fsync on, a file is made durable at its commit (``durable.sync_files``: ``fdatasync``). Left alone, the kernel
writes a large part's pages back late, so the commit waits for most of the file to reach the disk after its last
byte arrived: on this project's VM disk a 1 GiB file took 1.09–1.41 s with fsync against 0.73–0.79 s without it.
``Writeback`` asks the kernel to start writing a file back (``sync_file_range(SYNC_FILE_RANGE_WRITE)``: it starts
I/O on the dirty pages not already under writeback and does not wait for it) every ``KICK`` bytes received, from
one thread of its own, so the disk works while the network does and the commit's ``fdatasync`` has little left
(the same file then took 0.76–0.97 s with fsync in the development runs).

It is advice, never a guarantee: durability still comes only from the commit's ``fdatasync``, and a kernel or libc
without ``sync_file_range`` (another OS, a seccomp filter) turns it off (``available``). Files smaller than ``KICK``
are never kicked (their group commit flushes them together). The queue is bounded: a kick that finds it full is
dropped, and the commit still flushes everything.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import queue
import sys
import threading
from typing import Any, Callable

KICK = 16 << 20  # bytes received into one file between two kicks of its writeback
QUEUE_MAX = 256  # files waiting for a kick at most (a kick that finds the queue full is dropped)
SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of dirty pages not under writeback; do not wait

log = logging.getLogger("fstream.writeback")


def _syscall() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _syscall()


def available() -> bool:
    """True when this system can start a file's writeback early."""
    return _SYNC_FILE_RANGE is not None


def start(fd: int) -> int:
    """Start writeback of ``fd``'s dirty pages (the whole file) without waiting: 0, or the errno it failed with
    (ENOSYS where there is no such call)."""
    if _SYNC_FILE_RANGE is None:
        return 38  # ENOSYS
    if _SYNC_FILE_RANGE(fd, 0, 0, SYNC_FILE_RANGE_WRITE) == 0:
        return 0
    return ctypes.get_errno()


class Writeback:
    """Kicks the writeback of files as they arrive, from one daemon thread (data streams call ``start_file`` when
    ``due`` says a file has gathered ``kick`` bytes since its last kick; the count lives on the file).

    A file is any object with ``acquire() -> fd`` (-1 once closing) and ``unuse()``, the receiver's ``RecvFile``.
    ``kicks`` counts kicks made, ``dropped`` kicks refused by a full queue, ``skipped`` those whose file had closed
    meanwhile (committed or given up), ``failed`` calls that returned an error (after an error that says the call
    can never work here, the thread stops kicking).
    """

    def __init__(self, enabled: bool = True, kick: int = KICK) -> None:
        self.enabled = enabled and available()
        self.kick = kick
        self.kicks = self.dropped = self.skipped = self.failed = 0
        self._q: queue.Queue[Any] = queue.Queue(maxsize=QUEUE_MAX)
        self._thread: threading.Thread | None = None
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="fstream-writeback", daemon=True)
            self._thread.start()

    def due(self, unkicked: int) -> bool:
        """True when a file with ``unkicked`` bytes received since its last kick should be kicked now."""
        return self.enabled and unkicked >= self.kick

    def start_file(self, f: Any) -> None:
        """Queue ``f``'s writeback (the caller counts its bytes: ``due``); dropped if the queue is full."""
        try:
            self._q.put_nowait(f)
        except queue.Full:
            self.dropped += 1

    def close(self) -> None:
        """Stop the thread (kicks still queued are dropped: the commits flush everything anyway)."""
        if self._thread is None:
            return
        self.enabled = False
        while True:
            try:
                self._q.get_nowait()
            except queue.Empty:
                break
        self._q.put(None)
        self._thread.join(5)
        self._thread = None

    def _run(self) -> None:
        while True:
            f = self._q.get()
            if f is None:
                return
            fd = f.acquire()
            if fd < 0:
                self.skipped += 1
                continue
            try:
                err = start(fd)
            finally:
                f.unuse()
            if err == 0:
                self.kicks += 1
                continue
            self.failed += 1
            if err in (38, 22, 95):  # ENOSYS, EINVAL, EOPNOTSUPP: this filesystem or system never will
                log.info("early writeback off: sync_file_range failed (errno %d); commits still flush", err)
                self.enabled = False
