"""Byte quotas of a receiver's keys (issue 32): what each key holds under its subtree, charged as its files open.

What a key holds is found by walking its subtree (regular files, ``.part`` files included, symlinks not followed)
when its first OPEN arrives, then again, in the background, when that count is older than ``refresh_s``; files
opened since are added as they open (their size minus what a resumed part already holds), and given back when
their part is removed without committing. The count errs on the side of "used": a file removed by other means
is forgotten only at the next walk.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import dataclass, field

from fstream_provider.model.units import format_bytes
from transfer_agent.errors import RefusedError
from transfer_agent.receiving.keyring import ReceiverKey

REFRESH_S = 60.0


@dataclass(frozen=True)
class Charge:
    """Bytes one OPEN charged to a key (``gen``: the walk it was counted on top of)."""

    key_id: str
    gen: int
    size: int


@dataclass(eq=False)
class _Usage:
    held: int = 0  # what the last walk found
    since: int = 0  # charged since the last walk began
    pending: int = 0  # charged while a walk runs: becomes ``since`` when that walk is installed
    scanned_at: float | None = None
    walking: bool = False
    gen: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)  # one key's decisions, and its first walk


class Quotas:
    """The quota accounts of one receiver's keys (thread-safe; a key's decisions are serialised by its own lock).

    :param root: the receiver's root (absolute).
    :param refresh_s: a count older than this is re-walked in the background.
    """

    def __init__(self, root: str, refresh_s: float = REFRESH_S, log: logging.Logger | None = None) -> None:
        self.root, self.refresh_s = root, refresh_s
        self.log = log or logging.getLogger("fstream.receiver")
        self._lock = threading.Lock()
        self._usage: dict[str, _Usage] = {}

    def _of(self, key_id: str) -> _Usage:
        with self._lock:
            return self._usage.setdefault(key_id, _Usage())

    def used(self, key: ReceiverKey) -> int:
        """Bytes ``key`` holds under its subtree."""
        u = self._of(key.key_id)
        with u.lock:
            self._fresh(key, u)
            return u.held + u.since

    def charge(self, key: ReceiverKey, rel: str, size: int, resumed: int = 0) -> Charge | None:
        """Charge an OPEN of ``size`` bytes (``resumed`` of them already in its part) to ``key``, or raise
        ``RefusedError`` (terminal) naming the key, its quota, the bytes used and the file's size."""
        if key.quota is None:
            return None
        need = max(0, size - resumed)
        u = self._of(key.key_id)
        with u.lock:
            self._fresh(key, u)
            used = u.held + u.since
            if used + need > key.quota:
                here = f", {resumed} of them already here" if resumed else ""
                raise RefusedError(f"{rel!r}: quota exceeded: key {key.key_id!r} may hold "
                                   f"{format_bytes(key.quota)} ({key.quota} bytes) under {key.where()}; "
                                   f"{used} bytes are used and the file is {size} bytes{here}")
            u.since += need
            if u.walking:
                u.pending += need
            return Charge(key.key_id, u.gen, need)

    def settle(self, charge: Charge | None, key: ReceiverKey, rel: str, size: int, resumed: int) -> Charge | None:
        """Once a part being resumed is known: ``charge`` (all of ``size``, reserved earlier) less the ``resumed``
        bytes its part holds; without an earlier charge, charge now (``RefusedError`` if it does not fit)."""
        if charge is None:
            return self.charge(key, rel, size, resumed)
        if resumed <= 0:
            return charge
        self.refund(charge, resumed)
        return Charge(charge.key_id, charge.gen, max(0, charge.size - resumed))

    def refund(self, charge: Charge | None, size: int | None = None) -> None:
        """Give back ``size`` bytes (default: all) of ``charge`` (its part was removed, or holds less)."""
        if charge is None:
            return
        size = charge.size if size is None else min(size, charge.size)
        u = self._of(charge.key_id)
        with u.lock:
            if u.gen == charge.gen and size > 0:  # else a walk since counted what is on disk
                u.since = max(0, u.since - size)

    def _fresh(self, key: ReceiverKey, u: _Usage) -> None:  # under u.lock
        if u.scanned_at is None:  # the first OPEN of this key waits for the walk (only this key's OPENs do)
            u.held, u.since, u.scanned_at = self.walk(key.subtree), 0, time.monotonic()
            u.gen += 1
        elif time.monotonic() - u.scanned_at > self.refresh_s and not u.walking:
            u.walking, u.pending = True, 0
            try:
                threading.Thread(target=self._rewalk, args=(key, u), name="fstream-recv-quota", daemon=True).start()
            except RuntimeError:  # no thread to be had: keep the count, try again at the next OPEN
                u.walking = False

    def _rewalk(self, key: ReceiverKey, u: _Usage) -> None:
        held: int | None = None
        try:
            held = self.walk(key.subtree)
        except Exception:  # noqa: BLE001 - the old count stands
            self.log.exception("quota walk of %s for key %s failed", key.where(), key.key_id)
        with u.lock:
            u.walking, u.scanned_at = False, time.monotonic()
            if held is not None:
                u.held, u.since, u.pending = held, u.pending, 0
                u.gen += 1

    def walk(self, subtree: str) -> int:
        """Sum of the sizes of the regular files under ``subtree`` (0 if it is missing or reached via a symlink)."""
        top = self.root
        for comp in subtree.split("/") if subtree else ():
            top = os.path.join(top, comp)
            try:
                if not stat.S_ISDIR(os.lstat(top).st_mode):
                    return 0
            except OSError:
                return 0
        total = 0
        for dirpath, _dirs, files in os.walk(top, followlinks=False):
            for name in files:
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
        self.log.debug("quota walk: %d bytes under %s", total, top)
        return total
