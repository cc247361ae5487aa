"""The parts a receiver holds: claims, current attempts, parent directories, ranges sidecars, removal, the sweep.

Data-safety rules (DESIGN.md "Rules for never losing data"): a file appears under its final name only after every
byte arrived and the end-to-end checksum matched (``transfer_agent.receiving.commit``); until then it is
``.NAME.<job>.<attempt>.part`` beside it with a ``.meta`` sidecar holding the received byte ranges, written here.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from collections.abc import Callable

from transfer_agent.errors import FStreamError
from transfer_agent.receiving.claims import ClaimTable
from transfer_agent.receiving.admission import OpenGate
from transfer_agent.storage.parts import PartIndex, sweep_dir, sweep_parts
from transfer_agent.storage.paths import open_parent, stem_of
from transfer_agent.storage.ranges import write_meta
from transfer_agent.receiving.quota import Quotas
from transfer_agent.receiving.state import RecvFile, Session


DIRS_KEPT = 16  # parent directories a session keeps open (the least recently used beyond are closed)


class PartStore:
    """The receiver's parts under ``root`` and the claims sessions hold on them (the lowest layer of ``Receiver``).

    :param root: destination root directory; nothing is ever written outside it.
    :param fsync: make commits and ranges durable.
    :param log: logger.
    :param part_max_age: orphaned ``.part``/``.meta`` files untouched this many seconds are removed by the sweep;
        None disables the sweep.
    """

    def __init__(self, *, root: str, fsync: bool, log: logging.Logger, part_max_age: float | None) -> None:
        self.root = os.path.abspath(root)
        self.fsync = fsync
        self.log = log
        self.part_max_age = part_max_age
        self._root_fd = -1
        self._stop = threading.Event()  # set when the receiver stops
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)  # notified whenever a busy part is released (see start)
        self._attempts: dict[tuple[str, str], int] = {}  # (key id, job) -> its newest attempt: older ones may not write
        self._busy_parts: ClaimTable = ClaimTable()  # part key -> the session holding it (claims: several processes)
        self._parts = PartIndex()
        self._written_dirs: dict[tuple[int, int], str] = {}  # (dev, ino) -> relative path: what the sweep revisits
        self._quotas = Quotas(self.root, log=log)  # bytes held and reserved under keys with a quota (issues 32, 40)
        self._gate = OpenGate(log)  # parts open at once, within the descriptor limit (issue 43)
        # a Counter: hooks count new keys as they happen (``files_<outcome>``, ``preauth_<kind>``); read at scrape
        # by transfer_agent.service.metrics, which also sets ``on_commit`` (seconds from OPEN to commit per file)
        self.stats = collections.Counter({"files_committed": 0, "bytes_received": 0, "sessions": 0, "errors": 0,
                                          "fenced": 0, "blocks_dropped": 0})
        self.on_commit: Callable[[float], None] | None = None

    # -- directories ---------------------------------------------------------------------------
    def _parent(self, session: Session, rel: str) -> tuple[int, tuple[int, int], str]:
        """(own fd of the parent directory, its (dev, ino), basename), walking each directory once per session."""
        reldir, _, base = rel.rpartition("/")
        cached = session.dirs.pop(reldir, None)  # re-inserted below: the newest at the end
        if cached is None:
            dfd, _base = open_parent(self._root_fd, rel)
            st = os.fstat(dfd)
            cached = (dfd, (st.st_dev, st.st_ino))
            self._written_dirs.setdefault(cached[1], reldir)
            while len(session.dirs) >= DIRS_KEPT:  # issue 43: a stream over many directories holds few of them
                os.close(session.dirs.pop(next(iter(session.dirs)))[0])
        session.dirs[reldir] = cached
        return os.dup(cached[0]), cached[1], base

    # -- release and removal ------------------------------------------------------------------
    @staticmethod
    def _unlink_quiet(dir_fd: int, name: str, part: bool = True) -> None:
        for n in ((name, name + ".meta", name + ".meta.tmp") if part else (name,)):
            try:
                os.unlink(n, dir_fd=dir_fd)
            except OSError:
                pass

    def _discard(self, f: RecvFile, remove: bool) -> None:
        if remove:
            with f.lock:  # a flush writing its ranges now ends first; one that borrowed the fd before sees this
                f.failed = True  # and writes no sidecar after the unlink below (an orphan .meta otherwise)
            self._remove_part(f.dir_fd, f.part_key[0], f.base, f.tmp)
        self._release(f, removed=remove)

    def _remove_part(self, dir_fd: int, dkey: tuple[int, int], base: str, name: str) -> None:
        self._unlink_quiet(dir_fd, name)
        self._parts.remove(dkey, base, name)
        self._quotas.part_gone(self._part_rel(dkey, name))  # the bytes it was counted with leave its keys' quotas

    def _part_rel(self, dkey: tuple[int, int], name: str) -> str:
        """The path of part ``name`` of directory ``dkey`` (one this process wrote to) relative to the root."""
        reldir = self._written_dirs.get(dkey, "")
        return f"{reldir}/{name}" if reldir else name

    def _release(self, f: RecvFile, removed: bool = False) -> None:
        if f.close():
            self._gate.release(f.session, f.file_id)  # its descriptors close with its last user: the reserve covers it
            if f.quota is not None:
                part = self._part_rel(f.part_key[0], f.tmp)
                self._quotas.writing(part, False)
                if not f.done:  # not committed: its reservation ends, its part holds what it got
                    self._quotas.landed(f.quota, f.relpath, 0)
                    if not removed:  # (a removed part left its count in _remove_part)
                        self._quotas.part_kept(part, f.ranges.total())
            with self._lock:
                if self._busy_parts.get(f.part_key) is f.session:
                    del self._busy_parts[f.part_key]
                self._released.notify_all()

    # -- persistence of ranges -----------------------------------------------------------------
    def _flush(self, f: RecvFile) -> None:
        with f.lock:
            if not f.dirty or f.done or f.queued:
                return
            f.dirty = False
            meta = f.meta()
        fd = f.acquire()
        if fd < 0:
            return
        try:
            if self.fsync:
                os.fdatasync(fd)  # ranges on disk never claim bytes that are not
            with f.lock:
                if f.queued or f.done or f.failed:
                    return  # being committed (the committer removes the sidecar), or failed and removed
                write_meta(f.dir_fd, f.tmp + ".meta", meta)
                f.meta_written = True
        except OSError as exc:
            self.log.warning("could not persist ranges of %s: %s", f.relpath, exc)
        finally:
            f.unuse()

    # -- the sweep of orphaned parts -----------------------------------------------------------
    def sweep_parts(self, max_age: float | None = None, whole_tree: bool = True) -> list[str]:
        """Remove orphaned parts untouched for ``max_age`` seconds (default ``part_max_age``) that no session
        holds; return their paths relative to the root (issue 8, defect 7).

        The whole tree is walked once, in the background, when the receiver starts (parts left by earlier
        runs); after that, every ``sweep_interval``, only the directories this process wrote to are revisited
        (``whole_tree=False``): new orphans can only appear there, and a large tree is not walked every hour.
        """
        age = self.part_max_age if max_age is None else max_age
        if age is None or self._root_fd < 0:
            return []

        def busy(dkey: tuple[int, int], stem: str) -> bool:  # called under self._lock
            return (any(k[0] == dkey and stem_of(k[1]) == stem for k in self._busy_parts)
                    or self._busy_parts.elsewhere(dkey, stem))

        # a part is claimed (busy, under self._lock) before it is taken over: one not busy here is nobody's
        if whole_tree:
            root_fd = os.dup(self._root_fd)  # its own: stop() may close the receiver's while a long walk runs
            try:
                removed = sweep_parts(root_fd, age, busy, self._parts, lock=self._lock)
            finally:
                os.close(root_fd)
        else:
            removed = []
            with self._lock:
                dirs = sorted(set(self._written_dirs.values()))
            for reldir in dirs:
                try:
                    dfd, _base = open_parent(self._root_fd, f"{reldir}/x" if reldir else "x", create=False)
                except (OSError, FStreamError):
                    continue  # removed or replaced since: nothing of ours to sweep there
                try:
                    removed += sweep_dir(dfd, reldir or ".", age, None, busy, self._parts, lock=self._lock)
                finally:
                    os.close(dfd)
        for rel in removed:
            if rel.endswith(".part"):
                self._quotas.part_gone(rel)
            self.log.info("removed orphaned part file %s (untouched for more than %.0f s, or a sidecar whose part is "
                          "gone)", rel, age)
        return removed

