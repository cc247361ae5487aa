"""Backpressure on OPENs: the receiver's open parts bounded by its descriptor limit (issue 43).

Every open file holds two descriptors (its part and its directory) from its OPEN until it is committed or given
up, and a sender frees a pipeline slot once a file's COMMIT has left, not once the file is committed. With a disk
or a CPU slower than the network, files waiting for their commit piled up: 13,000 descriptors on a 100,000-file
``--watch`` stream, until the receiver reached its limit and refused every further file as terminal.

``OpenGate`` bounds the parts held open at once by a budget from the soft ``RLIMIT_NOFILE`` (what the process may
open): ``(limit - reserve - descriptors held for anything else) // 2``. The descriptors held for anything else
(connections, pipes, directories, logs) are counted in ``/proc/self/fd`` at most every ``MEASURE_EVERY_S`` and
their peak over ``OTHERS_HELD_S`` is used; the reserve (``reserve_for``) covers what arrives after parts were
admitted. An OPEN that would go past the budget is *parked*, not refused: it is answered once parts are released,
in the order the OPENs came, across sessions. The sender sees a late OPEN_OK and its pipeline waits: backpressure.

A fair share between sessions: one sender's deep pipeline must not hold every slot while another waits behind it
(one tenant's backlog would stall every other tenant's files). While OPENs wait, a freed slot goes to the waiting
session that holds the fewest slots, and a session at or above its share (the budget over the sessions that hold or
wait for slots) parks its new OPENs whenever another session waits; with no one waiting, a session may use the whole
budget. A session's own OPENs are answered in the order it sent them.

No deadlock: once one of a session's OPENs is parked, every later OPEN of that session parks behind it, so every
file of a session admitted came before every file of it parked. A sender's channel sends its files in the order it
opened them, so an admitted file is never stuck behind a parked one of the same channel: it is sent, committed and
released, and the parked OPENs go on. Sessions wait on no one but the disk: another session's parked OPENs never
hold an admitted file back.

Bounded memory: a session parks at most ``PARKED_PER_SESSION`` OPENs and the receiver ``PARKED_MAX``; beyond, an
OPEN is refused as retryable ("busy"). Running out anyway (another process took the descriptors, or ENFILE, or
ENOMEM) is retryable too (``transient``): never a terminal refusal.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import resource
import threading
import time
from collections.abc import Callable
from typing import Any

FDS_PER_PART = 2  # the part and its directory's own descriptor
MEASURE_EVERY_S = 0.25  # /proc/self/fd is counted at most this often
OTHERS_HELD_S = 10.0  # the budget leaves room for the most descriptors held for anything else in this long
PARKED_PER_SESSION = 16384  # OPENs one session may have parked (an honest sender parks at most its pipeline)
PARKED_MAX = 65536  # OPENs parked over all sessions
WARN_EVERY_S = 60.0  # "at the budget" is logged at most this often
TRANSIENT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})  # out of descriptors or memory: try again later

ADMIT, PARK, FULL = "admit", "park", "full"


def transient(exc: OSError) -> bool:
    """Whether ``exc`` is a shortage that passes (descriptors, kernel file table, memory): retryable, never
    terminal."""
    return exc.errno in TRANSIENT


def fd_limit() -> int:
    """The soft descriptor limit (what this process may hold open now)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def fds_in_use() -> int | None:
    """Descriptors this process holds (None where ``/proc`` is missing)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself opened
    except OSError:
        return None


def reserve_for(limit: int) -> int:
    """Descriptors kept free of parts whatever was counted: for what arrives between two counts and after the
    parts were admitted (a tuner adding channels: three descriptors per data connection; sessions walking new
    directories; pre-authentication connections). A quarter of the limit: ``fstream bench fd-budget`` at 1,024
    reached the limit with a sixteenth (channels added after the parts had filled the budget)."""
    return max(64, limit // 4)


Key = tuple[Any, int]  # (session, file id)


class OpenGate:
    """Admit OPENs while fewer parts than the budget are open; park the rest until parts are released.

    ``admit`` decides for one OPEN: ``ADMIT`` (a slot is held for it: open it now, then ``opened``), ``PARK``
    (queued: ``run``'s ``handle`` opens it later) or ``FULL`` (refuse it, retryable). ``release`` gives a file's
    slot back; ``forget`` drops parked OPENs of a file or of a whole session.

    :param limit: the descriptor limit (default: the soft ``RLIMIT_NOFILE``, read at each measure).
    :param in_use: descriptors held now (default: counted in ``/proc/self/fd``).
    """

    def __init__(self, log: logging.Logger, limit: Callable[[], int] = fd_limit,
                 in_use: Callable[[], int | None] = fds_in_use) -> None:
        self.log = log
        self._limit, self._in_use = limit, in_use
        self._cond = threading.Condition()
        self._held: set[Key] = set()  # files holding a slot (admitted, open or being opened)
        self._held_by: collections.Counter[Any] = collections.Counter()  # slots per session
        self._parked: dict[Any, collections.OrderedDict[int, dict[str, Any]]] = {}  # per session, in order sent
        self._n_parked = 0
        self._budget = 1 << 30
        self._measured = -1.0
        self._others: collections.deque[tuple[float, int]] = collections.deque()  # (when, descriptors not parts)
        self._warned = -WARN_EVERY_S
        self.peak_open = 0
        self.peak_parked = 0
        self.parked_total = 0

    # -- the budget ----------------------------------------------------------------------------
    def budget(self) -> int:
        """Parts that may be open at once now (measured at most every ``MEASURE_EVERY_S``); call under the lock."""
        now = time.monotonic()
        if now - self._measured >= MEASURE_EVERY_S:
            self._measured = now
            limit = self._limit()
            used = self._in_use()
            self._others.append((now, 0 if used is None else max(0, used - FDS_PER_PART * len(self._held))))
            while self._others[0][0] < now - OTHERS_HELD_S:
                self._others.popleft()
            others = max(n for _t, n in self._others)  # the peak of the last seconds: connections come and go
            self._budget = max(1, (limit - reserve_for(limit) - others) // FDS_PER_PART)
        return self._budget

    # -- OPENs ---------------------------------------------------------------------------------
    def share(self) -> int:
        """Slots a session may hold while others wait: the budget over the sessions holding or waiting for slots;
        call under the lock."""
        sessions = len(self._held_by.keys() | self._parked.keys())
        return max(1, self.budget() // max(1, sessions))

    def admit(self, session: Any, fid: int, body: dict[str, Any]) -> str:
        with self._cond:
            if (session not in self._parked and len(self._held) < self.budget()  # its own OPENs in order
                    and (not self._parked or self._held_by[session] < self.share())):  # others wait: its share
                self._hold((session, fid))
                return ADMIT
            queue = self._parked.get(session)
            if (queue is not None and len(queue) >= PARKED_PER_SESSION) or self._n_parked >= PARKED_MAX:
                return FULL
            if not self._parked and time.monotonic() - self._warned >= WARN_EVERY_S:
                self._warned = time.monotonic()
                self.log.warning("open parts at the budget (%d files; descriptor limit %d): OPENs wait for parts to "
                                 "be released (%d have waited so far; a higher LimitNOFILE / ulimit -n lifts it)",
                                 self._budget, self._limit(), self.parked_total)
            if queue is None:
                queue = self._parked[session] = collections.OrderedDict()
            queue[fid] = body
            self._n_parked += 1
            self.parked_total += 1
            self.peak_parked = max(self.peak_parked, self._n_parked)
            return PARK

    def _hold(self, key: Key) -> None:
        self._held.add(key)
        self._held_by[key[0]] += 1
        self.peak_open = max(self.peak_open, len(self._held))

    def opened(self, session: Any, fid: int, holds_part: bool) -> None:
        """After an admitted OPEN: keep its slot while it ``holds_part`` (an open part), else give it back."""
        if not holds_part:
            self.release(session, fid)

    def release(self, session: Any, fid: int) -> None:
        """A file's part was closed (committed, aborted, failed, its session ended): its slot is free."""
        with self._cond:
            if (session, fid) in self._held:
                self._held.discard((session, fid))
                self._held_by[session] -= 1
                if self._held_by[session] <= 0:
                    del self._held_by[session]
                self._cond.notify_all()

    def forget(self, session: Any, fid: int | None = None) -> None:
        """Drop the parked OPEN of ``fid`` (aborted), or every parked OPEN of ``session`` (it ended)."""
        with self._cond:
            queue = self._parked.get(session)
            if queue is None:
                return
            if fid is None:
                self._n_parked -= len(queue)
                queue.clear()
            elif queue.pop(fid, None) is not None:
                self._n_parked -= 1
            if not queue:
                del self._parked[session]

    def _next_parked(self) -> tuple[Any, int, dict[str, Any]] | None:
        """The OPEN a free slot goes to: the oldest of the waiting session holding the fewest slots (the one that
        has waited longest among equals: ``_parked`` keeps sessions in the order they began to wait)."""
        session = min(self._parked, key=self._held_by.__getitem__, default=None)
        if session is None:
            return None
        queue = self._parked[session]
        fid, body = queue.popitem(last=False)
        self._n_parked -= 1
        if not queue:
            del self._parked[session]
        return session, fid, body

    # -- the parked OPENs' thread --------------------------------------------------------------
    def run(self, handle: Callable[[list[tuple[Any, int, dict[str, Any]]]], None], stop: threading.Event) -> None:
        """Until ``stop``: admit parked OPENs, in order, as slots free up; ``handle`` opens and answers each
        batch (every OPEN in it holds a slot: ``opened`` follows each)."""
        while not stop.is_set():
            with self._cond:
                batch: list[tuple[Any, int, dict[str, Any]]] = []
                while self._parked and len(self._held) < self.budget():
                    session, fid, body = self._next_parked()  # type: ignore[misc]
                    self._hold((session, fid))
                    batch.append((session, fid, body))
                if not batch:
                    self._cond.wait(MEASURE_EVERY_S)  # a release notifies; the budget may also grow by itself
                    continue
            try:
                handle(batch)
            except Exception:  # noqa: BLE001 - the thread that answers parked OPENs must outlive any one of them
                self.log.exception("answering %d parked OPENs failed", len(batch))

    def snapshot(self) -> dict[str, int]:
        """For metrics and tests: parts open, OPENs parked, the budget, the peaks."""
        with self._cond:
            return {"open": len(self._held), "parked": self._n_parked, "budget": self.budget(),
                    "sessions_waiting": len(self._parked),
                    "peak_open": self.peak_open, "peak_parked": self.peak_parked, "parked_total": self.parked_total}
