"""CPU seconds a process spends inside calls that release the GIL (issue 29, the road to 100 Gbit/s).

Only one thread of a Python process runs Python at a time: the CPU a side spends holding the GIL is the part
that more cores cannot speed up. CPython exposes no GIL accounting, so the data path times its own GIL-free
calls (the native receive loop and read-back, ``sendfile``, the checksum's reads and hash updates) on the
calling thread's CPU clock and adds them here; a side's CPU minus this sum is an upper bound of its GIL-held
CPU (every other syscall and C call is counted as held, whether it released the GIL or not).
``fstream bench gil`` reports both per GB and per 1,000 files.

Each thread adds into a counter of its own (no lock on the data path, issue 42); ``free_seconds`` sums them.
A thread's counter is registered once, at its first ``add``; the counters of threads that ended are folded
into one total then, so a long-lived daemon that starts threads per session keeps a bounded list.
"""

from __future__ import annotations

import threading
import time

clock = time.thread_time_ns


class _Counter:
    """One thread's nanoseconds; only that thread writes ``ns``."""

    __slots__ = ("ns", "thread")

    def __init__(self, thread: threading.Thread) -> None:
        self.ns = 0
        self.thread = thread


_mine = threading.local()
_lock = threading.Lock()  # guards the registry below: taken once per thread and on each read, never per add
_counters: list[_Counter] = []
_ended_ns = 0  # what threads that ended had counted


def _register() -> _Counter:
    """This thread's counter, made and listed at its first ``add``; ended threads' counters are folded now."""
    global _ended_ns
    mine = _mine.counter = _Counter(threading.current_thread())
    with _lock:
        alive = []
        for c in _counters:
            if c.thread.is_alive():
                alive.append(c)
            else:
                _ended_ns += c.ns  # it ended: nothing writes this counter any more
        alive.append(mine)
        _counters[:] = alive
    return mine


def add(ns: int) -> None:
    """Count ``ns`` nanoseconds of one thread's CPU spent in a call that released the GIL."""
    mine = getattr(_mine, "counter", None) or _register()
    mine.ns += ns


def free_ns() -> int:
    """Nanoseconds counted by ``add`` in this process so far (every thread's, exactly)."""
    with _lock:
        return _ended_ns + sum(c.ns for c in _counters)


def free_seconds() -> float:
    """CPU seconds counted by ``add`` in this process so far."""
    return free_ns() / 1e9
