"""Pre-authentication bounds: one watchdog thread enforcing handshake deadlines, and connection caps.

Issue 8, defect 3 (DESIGN.md "Pre-authentication bounds"): an unauthenticated peer gets a
*total* handshake deadline — not a per-recv timeout that a byte every few seconds restarts —
and there are at most ``max_total`` unauthenticated connections (``max_per_addr`` from one
source address). One thread serves every deadline from a heap; when a deadline passes, the
connection is shut down (``shutdown(2)``), which wakes the handler blocked in ``recv`` and lets
it close its own socket. A connection that authenticates in time cancels its deadline.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import socket
import threading
import time

log = logging.getLogger("fstream.receiver")


class Deadlines:
    """A heap of (deadline, connection) served by one daemon thread.

    ``add(fd, seconds)`` returns a token; ``cancel(token)`` must be called before the fd is
    closed (the watchdog shuts the fd down under the same lock, so a closed fd number reused by
    another connection is never touched).
    """

    def __init__(self, name: str = "fstream-recv-watchdog") -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._live: dict[int, int] = {}  # token -> fd
        self._seq = itertools.count(1)
        self._stopped = False
        self.expired = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, fd: int, seconds: float) -> int:
        token = next(self._seq)
        with self._cond:
            self._live[token] = fd
            heapq.heappush(self._heap, (time.monotonic() + seconds, token))
            if self._heap[0][1] == token:
                self._cond.notify()
        return token

    def cancel(self, token: int) -> None:
        with self._cond:
            self._live.pop(token, None)  # its heap entry is skipped when it comes up

    def expire(self, token: int) -> bool:
        """Shut the connection of ``token`` down now (evicted); False if it already finished."""
        with self._cond:
            fd = self._live.pop(token, None)
            if fd is not None:
                _shutdown_fd(fd)
            return fd is not None

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                while self._heap and (self._heap[0][0] <= now or self._heap[0][1] not in self._live):
                    _when, token = heapq.heappop(self._heap)
                    fd = self._live.pop(token, None)
                    if fd is not None:
                        self.expired += 1
                        _shutdown_fd(fd)
                self._cond.wait(self._heap[0][0] - now if self._heap else None)


def _shutdown_fd(fd: int) -> None:
    """Shut the connection behind ``fd`` down (works whether or not a TLS wrapper now owns the fd)."""
    try:
        s = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        s.detach()  # the handler owns and closes the fd


class PreAuthLimits:
    """Counts unauthenticated connections, in total and per source address.

    Over ``max_per_addr`` a newcomer is refused. When the total is full, a newcomer from an
    address holding fewer connections than the busiest address evicts the oldest connection of
    that busiest address instead of being refused: a flood from a few addresses cannot lock a
    sender on another address out (only a flood spread evenly over many addresses can, until
    handshake deadlines free slots).
    """

    def __init__(self, max_total: int, max_per_addr: int) -> None:
        self.max_total, self.max_per_addr = max_total, max_per_addr
        self._lock = threading.Lock()
        self._total = 0
        self._per_addr: dict[str, list[int]] = {}  # address -> tokens of its connections, oldest first
        self.refused = 0
        self.evicted = 0

    def admit(self, addr: str, token: int) -> tuple[bool, int | None]:
        """Count connection ``token`` from ``addr``: (admitted, token of a connection to evict or None)."""
        with self._lock:
            mine = self._per_addr.get(addr, [])
            victim = None
            if len(mine) >= self.max_per_addr:
                self.refused += 1
                return False, None
            if self._total >= self.max_total:
                heavy = max(self._per_addr, key=lambda a: len(self._per_addr[a]))
                if len(self._per_addr[heavy]) <= len(mine) + 1:
                    self.refused += 1
                    return False, None
                victim = self._per_addr[heavy].pop(0)  # no longer counted; its handler's release is a no-op
                self._total -= 1
                self.evicted += 1
            self._total += 1
            self._per_addr.setdefault(addr, []).append(token)
            return True, victim

    def release(self, addr: str, token: int) -> None:
        with self._lock:
            tokens = self._per_addr.get(addr)
            if tokens is None or token not in tokens:
                return  # evicted, already uncounted
            tokens.remove(token)
            self._total -= 1
            if not tokens:
                del self._per_addr[addr]

    @property
    def total(self) -> int:
        with self._lock:
            return self._total
