"""Hard byte quotas of a receiver's keys (issue 32, made hard in issue 40): reservations at OPEN, counts kept by hand.

A key with a quota is an account on its subtree: every OPEN under that subtree, whatever key the sender holds,
reserves the file's declared size (less what a resumed part already holds) before anything is created, and is
refused unless ``held + reserved + need <= quota`` for every account that covers the path. The reservation stays
until the file commits (then its bytes are ``held``), is aborted (given back) or its session ends (the bytes its
part kept are ``held``, the rest given back). ``held`` is adjusted at each of those, when a commit replaces a
file (the old size leaves), and when the receiver removes a part (the bytes it was counted with leave); it is
never re-counted behind the receiver's back, so nothing in flight can be forgotten.

A key is counted by walking its subtree once, at its first OPEN, when no usable count was persisted: regular
files by size, a ``.part`` by the ranges its sidecar records (what a resume will not send again), else by size.
The counts are persisted in ``state_path`` (JSON, written atomically): marked in use when the receiver starts,
and clean when it stops. After an unclean stop (a crash) every key is walked once again, since changes since the
last clean stop are unknown. Files a person adds or removes by hand are not seen: removed ones only make the count
too high (safe); after such changes run ``fstream receive --quota-recount`` with the receiver stopped.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fstream_provider.model.statedir import state_dir
from fstream_provider.model.units import format_bytes
from transfer_agent.errors import FStreamError, RefusedError
from transfer_agent.receiving.keyring import ReceiverKey
from transfer_agent.storage.parts import part_stem
from transfer_agent.storage.ranges import read_meta

STATE_VERSION = 1


def covers(subtree: str, rel: str) -> bool:
    """Whether ``rel`` (a validated relative path) lies under ``subtree`` (component-wise; ``""``: the root)."""
    return not subtree or rel.startswith(subtree + "/")


@dataclass(eq=False)
class Account:
    """The count of one key with a quota: ``held`` bytes at rest under ``subtree`` (None until counted) and
    ``reserved`` bytes of files open now."""

    key_id: str
    subtree: str
    quota: int
    held: int | None = None
    reserved: int = 0
    walking: bool = False
    grown: int = 0  # bytes that landed under it while its first walk ran (added to what the walk finds)
    ready: threading.Lock = field(default_factory=threading.Lock)  # serialises its first walk

    def add(self, nbytes: int) -> None:  # under Quotas._lock
        if self.held is not None:
            self.held = max(0, self.held + nbytes)
        elif self.walking and nbytes > 0:  # the walk may or may not see them: counting them errs on "used"
            self.grown += nbytes


@dataclass(frozen=True, eq=False)
class Charge:
    """Bytes one OPEN reserved (``size``) on each account that covers its path."""

    accounts: tuple[Account, ...]
    size: int


class Quotas:
    """The quota accounts of one receiver (thread-safe: decisions under one lock; a first walk under its account's).

    :param root: the receiver's root (absolute).
    :param state_path: the JSON file counts persist in (None: kept in memory only, walked once per process).
    :param keys: the receiver's keys now (its keyring, re-read when it changes); set by the receiver.
    """

    def __init__(self, root: str, state_path: str | None = None, log: logging.Logger | None = None,
                 keys: Callable[[], Iterable[ReceiverKey]] | None = None) -> None:
        self.root, self.state_path = root, state_path
        self.log = log or logging.getLogger("fstream.receiver")
        self.keys: Callable[[], Iterable[ReceiverKey]] = keys or (lambda: ())
        self._lock = threading.Lock()
        self._accounts: dict[str, Account] = {}
        self._parts: dict[str, int] = {}  # relative path of a part at rest -> the bytes it is counted with
        self._writing: set[str] = set()  # parts of files open under a charge: their bytes are reserved, not held
        self._saved: dict[str, dict[str, Any]] = {}  # counts read from state_path, taken up at first use
        self._lock_fd = -1
        self.walks = 0  # subtree walks done (the benchmark and tests read it)

    # -- persistence ---------------------------------------------------------------------------------
    def open(self) -> None:
        """Lock ``state_path`` for this process, take up its counts if the last receiver stopped cleanly, and mark
        it in use (so a crash from here on is known at the next start). ``FStreamError`` if another process holds
        it, or cannot write it. Nothing is done while no key has a quota (a key given one by a later re-read of the
        keyring is counted in memory, once per process)."""
        if self.state_path is None or not any(k.quota is not None for k in self.keys()):
            return
        try:
            self._lock_fd = lock_state(self.state_path)
        except OSError as exc:
            raise FStreamError(f"quota state {self.state_path}: {exc.strerror} (give --quota-state a file this "
                               "user may write)") from None
        state = read_state(self.state_path)
        if state is not None and state.get("root") == self.root and state.get("clean") is True:
            self._saved = dict(state.get("accounts") or {})
            self._parts = {str(k): int(v) for k, v in (state.get("parts") or {}).items()}
        elif state is not None:
            self.log.warning("quota counts in %s are not from a clean stop of a receiver of %s: each key with a "
                             "quota is counted again (one walk of its subtree) at its first OPEN",
                             self.state_path, self.root)
        try:
            write_state(self.state_path, self._state(clean=False))
        except OSError as exc:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise FStreamError(f"quota state {self.state_path}: {exc.strerror} (give --quota-state a file this "
                               "user may write)") from None

    def close(self) -> None:
        """Persist the counts, as clean if every reservation ended (the receiver's sessions are closed)."""
        if self.state_path is None or self._lock_fd < 0:
            return
        with self._lock:
            clean = all(a.reserved == 0 for a in self._accounts.values())  # else a file outlived its session
        try:
            write_state(self.state_path, self._state(clean=clean))
        except OSError as exc:
            self.log.warning("could not persist quota counts to %s: %s (the next start counts again)",
                             self.state_path, exc)
        finally:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _state(self, clean: bool) -> dict[str, Any]:
        with self._lock:
            accounts = dict(self._saved)
            for a in self._accounts.values():
                if a.held is not None:
                    accounts[a.key_id] = {"subtree": a.subtree, "held": a.held}
            return {"version": STATE_VERSION, "root": self.root, "clean": clean, "saved_at": time.time(),
                    "accounts": accounts, "parts": dict(self._parts)}

    # -- accounts ------------------------------------------------------------------------------------
    def _account(self, key: ReceiverKey) -> Account:
        """The counted account of ``key`` (walking its subtree first when no count is known)."""
        assert key.quota is not None
        with self._lock:
            a = self._accounts.get(key.key_id)
            if a is None or a.subtree != key.subtree:  # new, or its subtree changed: what it held is unknown
                a = self._accounts[key.key_id] = Account(key.key_id, key.subtree, key.quota)
                saved = self._saved.pop(key.key_id, None)
                if saved is not None and saved.get("subtree") == key.subtree:
                    a.held = int(saved.get("held", 0))
            a.quota = key.quota
            if a.held is not None:
                return a
        with a.ready:
            with self._lock:
                if a.held is not None:
                    return a
                a.walking, a.grown = True, 0
            try:
                held = self._count(key.subtree)
            except BaseException:
                with self._lock:
                    a.walking = False
                raise
            with self._lock:
                a.held, a.walking = held + a.grown, False
            self.log.info("quota of key %s: %d bytes held under %s (counted once)", key.key_id, a.held, key.where())
        return a

    def _covering(self, rel: str) -> list[Account]:
        return [self._account(k) for k in self.keys() if k.quota is not None and covers(k.subtree, rel)]

    def used(self, key: ReceiverKey) -> int:
        """Bytes ``key`` holds under its subtree and has reserved there (0 for a key without a quota)."""
        if key.quota is None:
            return 0
        a = self._account(key)
        with self._lock:
            return (a.held or 0) + a.reserved

    # -- reservations --------------------------------------------------------------------------------
    def charge(self, rel: str, size: int, resumed: int = 0) -> Charge | None:
        """Reserve ``size`` bytes less ``resumed`` (already in its part) for ``rel`` on every account covering it,
        or raise ``RefusedError`` (terminal) naming the first that cannot hold them (None: no account covers it)."""
        accounts = self._covering(rel)
        if not accounts:
            return None
        need = max(0, size - resumed)
        with self._lock:
            for a in accounts:
                held = a.held or 0
                if held + a.reserved + need > a.quota:
                    here = f", {resumed} of them already here" if resumed else ""
                    raise RefusedError(
                        f"{rel!r}: quota exceeded: key {a.key_id!r} may hold {format_bytes(a.quota)} ({a.quota} "
                        f"bytes) under {a.subtree + '/' if a.subtree else 'the whole root'}; {held + a.reserved} "
                        f"bytes are used ({held} held, {a.reserved} reserved by files in flight) and the file is "
                        f"{size} bytes{here}")
            for a in accounts:
                a.reserved += need
        return Charge(tuple(accounts), need)

    def settle(self, charge: Charge | None, rel: str, size: int, resumed: int) -> Charge | None:
        """Once a part being resumed is known: ``charge`` (all of ``size``, reserved earlier) less the ``resumed``
        bytes its part holds; without an earlier charge, charge now (``RefusedError`` if it does not fit)."""
        if charge is None:
            return self.charge(rel, size, resumed)
        if resumed <= 0:
            return charge
        self.refund(charge, resumed)
        return Charge(charge.accounts, max(0, charge.size - resumed))

    def refund(self, charge: Charge | None, size: int | None = None) -> None:
        """Give back ``size`` bytes (default: all) of ``charge``: nothing of them landed."""
        if charge is None:
            return
        size = charge.size if size is None else min(size, charge.size)
        with self._lock:
            for a in charge.accounts:
                a.reserved = max(0, a.reserved - size)

    def landed(self, charge: Charge | None, rel: str, nbytes: int) -> None:
        """End ``charge`` (the file committed, or its session ended): ``nbytes`` of it are now held under ``rel``."""
        if charge is None:
            return
        with self._lock:
            for a in charge.accounts:
                a.reserved = max(0, a.reserved - charge.size)
            self._add(rel, nbytes)

    # -- bytes at rest -------------------------------------------------------------------------------
    def _add(self, rel: str, nbytes: int) -> None:  # under self._lock
        if nbytes:
            for a in self._accounts.values():
                if covers(a.subtree, rel):
                    a.add(nbytes)

    def add(self, rel: str, nbytes: int) -> None:
        """``nbytes`` more (or, negative, fewer) are held under ``rel`` (a resumed part, a replaced file)."""
        with self._lock:
            self._add(rel, nbytes)

    def part_kept(self, part_rel: str, nbytes: int) -> None:
        """The part ``part_rel`` stays on disk (resumable) holding ``nbytes``: recorded (its accounts adjusted by
        the change) so that its removal gives them back."""
        with self._lock:
            self._add(part_rel, nbytes - self._parts.get(part_rel, 0))
            self._parts[part_rel] = nbytes

    def part_resumed(self, old_rel: str, part_rel: str, nbytes: int) -> None:
        """An OPEN took over the part ``old_rel`` (renamed ``part_rel``), which holds ``nbytes`` it will not send
        again: counted with those from now on (nothing is recorded where no quota covers it)."""
        if not any(k.quota is not None and covers(k.subtree, part_rel) for k in self.keys()):
            return
        with self._lock:
            self._add(old_rel, -self._parts.pop(old_rel, 0))
            self._add(part_rel, nbytes)
            self._parts[part_rel] = nbytes

    def writing(self, part_rel: str, now: bool) -> None:
        """Part ``part_rel`` is (``now``) or no longer is being written under a charge: a walk meanwhile (a key
        given a quota while files are in flight) does not record it as a part at rest, so its end changes only
        what it reserved."""
        with self._lock:
            if now:
                self._writing.add(part_rel)
            else:
                self._writing.discard(part_rel)

    def part_gone(self, part_rel: str) -> None:
        """The part ``part_rel`` was removed, or became its final file: the bytes it was counted with leave."""
        with self._lock:
            self._add(part_rel, -self._parts.pop(part_rel, 0))

    # -- counting ------------------------------------------------------------------------------------
    def _count(self, subtree: str) -> int:
        t0 = time.monotonic()
        total, parts = count_tree(self.root, subtree)
        with self._lock:
            self.walks += 1
            self._parts.update((k, v) for k, v in parts.items() if k not in self._writing)
        self.log.debug("quota walk: %d bytes under %s in %.3f s", total, subtree or ".", time.monotonic() - t0)
        return total

    def recount(self) -> dict[str, int]:
        """Count every key with a quota afresh (``fstream receive --quota-recount``, receiver stopped): the bytes
        each holds."""
        with self._lock:
            self._accounts.clear()
            self._saved.clear()
            self._parts.clear()
        return {k.key_id: self.used(k) for k in self.keys() if k.quota is not None}


def part_bytes(dir_fd: int, name: str, st_size: int) -> int:
    """What a part at rest is counted with: the bytes its ranges sidecar records, else its size."""
    meta = read_meta(dir_fd, name + ".meta")
    if meta is None:
        return st_size
    try:
        return min(st_size, sum(int(e) - int(s) for s, e in meta.get("ranges", [])))
    except (TypeError, ValueError):
        return st_size


def count_tree(root: str, subtree: str) -> tuple[int, dict[str, int]]:
    """(bytes held under ``subtree`` of ``root``, {part path: bytes}): regular files by size, parts by
    ``part_bytes``; symlinks not followed; 0 if the subtree is missing or reached through a symlink."""
    try:
        top_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return 0, {}
    try:
        for comp in subtree.split("/") if subtree else ():
            try:
                fd = os.open(comp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top_fd)
            except OSError:
                return 0, {}
            os.close(top_fd)
            top_fd = fd
        total, parts = 0, {}
        for dirpath, _dirs, files, dfd in os.fwalk(".", dir_fd=top_fd, follow_symlinks=False):
            for name in files:
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                if part_stem(name) is None:
                    total += st.st_size
                    continue
                n = part_bytes(dfd, name, st.st_size)
                total += n
                parts[os.path.normpath(os.path.join(subtree or ".", dirpath, name))] = n
        return total, parts
    finally:
        os.close(top_fd)


# -- the state file ---------------------------------------------------------------------------------------
def default_quota_state(root: str) -> Path:
    """``<state dir>/receiver-quota/<hash of the root's absolute path>.json``: one file per receiver root."""
    digest = hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:16]
    return state_dir() / "receiver-quota" / f"{digest}.json"


def lock_state(path: str) -> int:
    """Hold ``path``.lock exclusively for this process (its fd); ``FStreamError`` if another process holds it."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FStreamError(f"quota state {path} is in use by another receiver (one receiver per root and state "
                           "file; stop it first, or give --quota-state another file)") from None
    return fd


def read_state(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and state.get("version") == STATE_VERSION else None


def write_state(path: str, state: dict[str, Any]) -> None:
    """Replace ``path`` with ``state`` atomically and durably (temp file, fsync, rename, fsync of the directory)."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fd = -1
            json.dump(state, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
    finally:
        if fd >= 0:
            os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
