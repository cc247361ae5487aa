"""Draining a transfer (issue 30): finish the files already open, start no new one, say what was held back.

An agent asked to stop (SIGTERM, ``systemctl stop``) drains its running job instead of cutting it: the
files queued but not yet opened are taken out of the channel pool (with those waiting out a retry
backoff), the source watcher is no longer polled, and the transfer ends when every open file has
committed. The job is then handed back to the bus and the next agent sends only the held-back files: a
file that landed is skipped by its size and checksum, a part file resumes from its committed ranges.
If the grace runs out first, the agent cancels the transfer: open files stop at their last flushed
ranges (``receiving.store``) and resume from there.
"""

from __future__ import annotations

import threading
from typing import Any


def hold_back(pool: Any, retry_files: list, lock: threading.Lock) -> list:
    """Take every file not yet opened out of ``pool`` (and ``retry_files``); the files held back."""
    held = list(pool.drain())
    with lock:
        held.extend(retry_files)
        retry_files.clear()
    return held


def drained_error(held: int, landed: int) -> str:
    """The result's error of a drained transfer (retryable: the next attempt sends what was held back)."""
    return (f"drained: the agent is stopping; {held} file(s) not started were handed back for the next attempt "
            f"({landed} landed in this one)")
