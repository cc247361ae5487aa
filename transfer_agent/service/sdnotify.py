"""systemd's readiness protocol (``sd_notify``, issue 30): tell the service manager when a daemon is ready,
reloading or stopping, and what it is doing.

A unit with ``Type=notify`` sets ``$NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract namespace); the
daemon sends newline-separated ``KEY=VALUE`` assignments in one datagram (``READY=1``, ``RELOADING=1`` with
``MONOTONIC_USEC``, ``STOPPING=1``, ``STATUS=...``, ``EXTEND_TIMEOUT_USEC``). Without the variable (started by
hand, or by another supervisor) every call does nothing. The protocol is ten lines of socket code, so no
library is added for it (``man sd_notify``).
"""

from __future__ import annotations

import logging
import os
import socket
import time

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
