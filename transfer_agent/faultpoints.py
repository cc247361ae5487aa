"""Fault-injection points for the fault suite (``tests/faults``, ``fstream bench soak``).

A few places where a crash is most interesting (between a commit's fsync and its renames,
between two renames of one group commit, just before the sender sends COMMIT) call
``hit(name)``. Nothing happens unless the process was started with
``FSTREAM_FAULTPOINT=name[:count]`` (several comma-separated): then the ``count``-th hit of
``name`` (default the first) SIGKILLs the process itself, so the test sees exactly the state a
real crash at that point leaves behind.

The variable is read once, at import. The production cost of a point is one test of an empty
dict. Points in use:

- ``commit.before_rename`` (receiver): the group's files are complete, verified and flushed;
  none renamed yet.
- ``commit.between_renames`` (receiver): hit after each rename of a group commit, before the
  next rename, the sidecar removal and the directory fsync.
- ``commit.before_send`` (sender): every block of a file is sent and its checksum is ready;
  COMMIT not sent yet.

A stall point (``stall(name)``, issue 39) wedges a daemon's loop instead, for the watchdog tests: with
``FSTREAM_STALL=name=PATH`` (several comma-separated), the thread that passes ``name`` blocks there for as long
as the file ``PATH`` exists, printing to stderr when it stalls and when it goes on. Points in use:

- ``agent.loop``: a pass of the agent's main loop (the one that sends systemd's ``WATCHDOG=1``).
- ``receiver.flush``: a pass of the receiver's flush loop (the receiver's ``WATCHDOG=1``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

ENV = "FSTREAM_FAULTPOINT"
STALL_ENV = "FSTREAM_STALL"


def parse(text: str) -> dict[str, int]:
    """``"a:3,b"`` → ``{"a": 3, "b": 1}`` (a count below 1 counts as 1)."""
    armed: dict[str, int] = {}
    for item in text.split(","):
        name, _, count = item.strip().partition(":")
        if name:
            armed[name] = max(1, int(count)) if count.strip().isdigit() else 1
    return armed


_armed: dict[str, int] = parse(os.environ.get(ENV, ""))


def hit(name: str) -> None:
    """Count a pass through point ``name``; SIGKILL this process on the armed pass."""
    if not _armed:
        return
    left = _armed.get(name)
    if left is None:
        return
    if left <= 1:
        os.kill(os.getpid(), signal.SIGKILL)
    _armed[name] = left - 1


def parse_stalls(text: str) -> dict[str, str]:
    """``"a=/x,b=/y"`` → ``{"a": "/x", "b": "/y"}`` (items without a path are ignored)."""
    out: dict[str, str] = {}
    for item in text.split(","):
        name, _, path = item.strip().partition("=")
        if name and path:
            out[name] = path
    return out


_stalls: dict[str, str] = parse_stalls(os.environ.get(STALL_ENV, ""))


def stall(name: str) -> None:
    """Block the calling thread at point ``name`` while its file exists (``FSTREAM_STALL``): a hung loop."""
    if not _stalls:
        return
    path = _stalls.get(name)
    if path is None or not os.path.exists(path):
        return
    print(f"fault point {name}: stalled while {path} exists", file=sys.stderr, flush=True)
    pause = threading.Event()
    while os.path.exists(path):
        pause.wait(0.02)
    print(f"fault point {name}: going on", file=sys.stderr, flush=True)
