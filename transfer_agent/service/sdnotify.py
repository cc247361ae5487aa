"""systemd's readiness protocol (``sd_notify``, issue 30): tell the service manager when a daemon is ready,
reloading or stopping, and what it is doing.

A unit with ``Type=notify`` sets ``$NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract namespace); the
daemon sends newline-separated ``KEY=VALUE`` assignments in one datagram (``READY=1``, ``RELOADING=1`` with
``MONOTONIC_USEC``, ``STOPPING=1``, ``STATUS=...``, ``EXTEND_TIMEOUT_USEC``, ``WATCHDOG=1``). Without the
variable (started by hand, or by another supervisor) every call does nothing. The protocol is ten lines of socket
code, so no library is added for it (``man sd_notify``).

A unit with ``WatchdogSec=`` (issue 39) also sets ``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``): ``Watchdog`` sends
``WATCHDOG=1`` every half of it, from the loop that owns it (the agent's main loop, the receiver's flush loop), so a
loop that hangs stops the pings and systemd restarts the daemon (``man sd_watchdog_enabled``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

log = logging.getLogger("fstream.service")


def notify(**fields: str | int) -> bool:
    """Send ``fields`` (``ready=1`` → ``READY=1``) to ``$NOTIFY_SOCKET``; False when there is none or it fails."""
    where = os.environ.get("NOTIFY_SOCKET")
    if not where:
        return False
    if where.startswith("@"):
        where = "\0" + where[1:]
    msg = "\n".join(f"{k.upper()}={v}" for k, v in fields.items()).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(where)
            s.sendall(msg)
        return True
    except OSError as exc:  # the manager went away: the daemon keeps running
        log.warning("sd_notify to %s failed: %s", os.environ.get("NOTIFY_SOCKET"), exc)
        return False


def ready(status: str) -> bool:
    return notify(ready=1, status=status)


def reloading(status: str = "reloading configuration") -> bool:
    return notify(reloading=1, monotonic_usec=time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000, status=status)


def stopping(status: str, grace_s: float | None = None) -> bool:
    extra = {"extend_timeout_usec": int(grace_s * 1e6)} if grace_s else {}
    return notify(stopping=1, status=status, **extra)


class Watchdog:
    """systemd's watchdog: ``WATCHDOG=1`` every half of the timeout, sent by the loop that owns it.

    The loop calls ``own()`` once, then ``kick()`` on every pass (it pings when a ping is due, else does nothing)
    and waits at most ``due_in()`` between passes. Kicks from any other thread are ignored: progress callbacks
    may call ``kick()`` from wherever they run, but only the loop's own thread keeps the daemon alive, so a loop
    that hangs stops the pings while its other threads go on.

    :param usec: the timeout in microseconds (``$WATCHDOG_USEC``, from the unit's ``WatchdogSec=``).
    :param send: sends one ping (default: ``WATCHDOG=1`` to ``$NOTIFY_SOCKET``).
    :param clock: monotonic seconds.
    """

    def __init__(self, usec: int, send: Callable[[], object] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if usec <= 0:
            raise ValueError(f"watchdog timeout {usec} us: must be positive")
        self.timeout = usec / 1e6
        self.period = self.timeout / 2  # sd_watchdog_enabled(3): "every half the time returned here"
        self._slack = min(0.05, self.period / 10)  # a wait that ends a hair early still pings
        self._send = send or (lambda: notify(watchdog=1))
        self._clock = clock
        self._next = float("-inf")  # the first kick pings
        self.owner: threading.Thread | None = None
        self.pings = 0

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, pid: int | None = None) -> Watchdog | None:
        """The watchdog ``$WATCHDOG_USEC`` asks for, or None: unset, not a positive integer (logged), or
        ``$WATCHDOG_PID`` naming another process (a child that inherited its parent's variables)."""
        env = os.environ if environ is None else environ
        raw = env.get("WATCHDOG_USEC", "")
        if not raw:
            return None
        want = env.get("WATCHDOG_PID", "")
        if want and want != str(os.getpid() if pid is None else pid):
            return None
        if not raw.isdigit() or int(raw) == 0:
            log.warning("WATCHDOG_USEC=%r is not a positive number of microseconds: no watchdog pings", raw)
            return None
        return cls(int(raw))

    def own(self) -> Watchdog:
        """The calling thread's loop is the one whose kicks count."""
        self.owner = threading.current_thread()
        return self

    def kick(self) -> bool:
        """Ping if one is due and this is the owner's thread; True when a ping was sent."""
        if self.owner is not None and threading.current_thread() is not self.owner:
            return False
        now = self._clock()
        if now < self._next - self._slack:
            return False
        self._next = now + self.period
        self.pings += 1
        self._send()
        return True

    def due_in(self) -> float:
        """Seconds until the next ping is due (0 when it is): the longest the loop may wait."""
        return max(0.0, self._next - self._clock())

    def describe(self) -> str:
        return f"WATCHDOG=1 every {self.period:g} s (WatchdogSec={self.timeout:g} s)"
