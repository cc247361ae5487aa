"""CPU seconds a process spends inside calls that release the GIL (issue 29, the road to 100 Gbit/s).

Only one thread of a Python process runs Python at a time: the CPU a side spends holding the GIL is the part
that more cores cannot speed up. CPython exposes no GIL accounting, so the data path times its own GIL-free
calls (the native receive loop and read-back, ``sendfile``, the checksum's reads and hash updates) on the
calling thread's CPU clock and adds them here; a side's CPU minus this sum is an upper bound of its GIL-held
CPU (every other syscall and C call is counted as held, whether it released the GIL or not).
``fstream bench gil`` reports both per GB and per 1,000 files.
"""

from __future__ import annotations

import threading
import time

_lock = threading.Lock()
_free_ns = 0
clock = time.thread_time_ns


def add(ns: int) -> None:
    """Count ``ns`` nanoseconds of one thread's CPU spent in a call that released the GIL."""
    global _free_ns
    with _lock:
        _free_ns += ns


def free_seconds() -> float:
    """CPU seconds counted by ``add`` in this process so far."""
    return _free_ns / 1e9
