"""Which session holds which part: ``ClaimTable`` (one process), ``ProcessClaims`` (several behind one port, issue 43).

A part is claimed (``table[key] = session``, under the receiver's lock) before it is taken over or created, and
released (``pop``/``del``) when its file is done, aborted or its session ends. In one process the table is the
whole truth. With several receiver processes behind one port (``transfer_agent.receiving.router``), two jobs of
one key may land in different processes and name the same file: ``ProcessClaims`` also takes a POSIX record lock
in a lock file the processes share, one byte at an offset derived from the part's directory and name stem, so a
claim held by another process refuses the newcomer as busy (retryable), exactly as a live holder of another job
does in one process. The lock is the kernel's: a process that dies releases its claims with it.

POSIX locks never conflict within one process, which the table covers. Two different files whose offsets collide
(62 bits of BLAKE2b) are busy to each other in two processes; in one process they share the byte, and the first
release drops it (a chance of about n² / 2⁶³ for n claims held at once). Closing any descriptor of the lock file
would drop the process's locks, so it is opened once per process and never reopened.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
from typing import Any

from fstream_provider.model.statedir import state_dir
from transfer_agent.errors import FStreamError
from transfer_agent.storage.paths import stem_of

PartKey = tuple[tuple[int, int], str]  # ((dev, ino) of the directory, destination name)


def default_claims_lock(root: str) -> str:
    """``<state dir>/receiver-claims/<hash of the root's absolute path>.lock``: shared by a root's processes."""
    digest = hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:16]
    return str(state_dir() / "receiver-claims" / f"{digest}.lock")


class ClaimTable(dict):  # type: ignore[type-arg]
    """Part key → the session holding it, in this process (a plain dict; ``elsewhere`` is always False)."""

    def elsewhere(self, dkey: tuple[int, int], stem: str) -> bool:
        """Whether another process holds a part of ``stem`` in directory ``dkey`` (never, in one process)."""
        return False


def _offset(dkey: tuple[int, int], stem: str) -> int:
    digest = hashlib.blake2b(f"{dkey[0]}:{dkey[1]}:{stem}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 62) - 1)


class ProcessClaims(ClaimTable):
    """A ``ClaimTable`` whose claims also hold a byte of ``lock_path`` (shared by the receiver processes of one root).

    ``table[key] = session`` raises ``FStreamError(retryable)`` ("busy") when another process holds the key;
    ``pop``/``del`` release the byte. Called under the receiver's lock, like the plain table.
    """

    def __init__(self, lock_path: str) -> None:
        super().__init__()
        os.makedirs(os.path.dirname(os.path.abspath(lock_path)), mode=0o700, exist_ok=True)
        self.lock_path = lock_path
        self._fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def __setitem__(self, key: PartKey, session: Any) -> None:
        if key not in self:
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _offset(key[0], stem_of(key[1])))
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
                raise FStreamError(f"{key[1]!r}: busy: another receiver process (same port) is receiving this "
                                   "file", retryable=True) from None
        super().__setitem__(key, session)

    def _unlock(self, key: PartKey) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, _offset(key[0], stem_of(key[1])))

    def __delitem__(self, key: PartKey) -> None:
        super().__delitem__(key)
        self._unlock(key)

    def pop(self, key: PartKey, *default: Any) -> Any:  # type: ignore[override]
        if key in self:
            value = super().pop(key)
            self._unlock(key)
            return value
        return super().pop(key, *default)

    def elsewhere(self, dkey: tuple[int, int], stem: str) -> bool:
        """Whether another process holds ``stem`` in ``dkey`` (called only when this process does not: taking the
        byte and giving it back would otherwise drop this process's own claim)."""
        off = _offset(dkey, stem)
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, off)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return True
            raise
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, off)
        return False

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
