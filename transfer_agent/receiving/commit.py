"""The commit path: verify each whole file, then group commit (concurrent fdatasync, renames, one fsync per directory).

A file appears under its final name only after every byte arrived and the end-to-end checksum matched. Order in a
group: verify each file, flush the group's files together (concurrent ``fdatasync``), rename each part to its
final name and drop its sidecar, then one ``fsync`` per directory, and only then answer COMMITTED.
"""

from __future__ import annotations

import logging
import os
import queue
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from transfer_agent import faultpoints
from transfer_agent.errors import FStreamError
from transfer_agent.receiving.state import RecvFile, Session
from transfer_agent.receiving.store import PartStore
from transfer_agent.storage import durable as storage
from transfer_agent.storage.writeback import Writeback
from transfer_agent.storage.checksum import hash_fd
from transfer_agent.wire.batch import INNER, send_batched
from transfer_agent.wire.protocol import Frame

COMMIT_BATCH_MAX = 1024  # files committed in one group at most


class GroupCommit(PartStore):
    """Commit whole files in groups from one queue (the layer of ``Receiver`` above ``PartStore``)."""

    def __init__(self, *, root: str, fsync: bool, log: logging.Logger, part_max_age: float | None) -> None:
        super().__init__(root=root, fsync=fsync, log=log, part_max_age=part_max_age)
        self._commit_q: queue.Queue[RecvFile | None] = queue.Queue()  # None: stop after what is queued
        self._sync_pool = ThreadPoolExecutor(max_workers=storage.SYNC_WAYS, thread_name_prefix="fstream-fsync")
        self._writeback = Writeback(enabled=fsync)  # with fsync on: a large part's pages go to disk as it arrives

    def _commit_loop(self) -> None:
        while True:
            first = self._commit_q.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < COMMIT_BATCH_MAX:
                try:
                    nxt = self._commit_q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._commit_q.put(None)
                    break
                batch.append(nxt)
            try:
                self._commit_batch(batch)
            except Exception:  # noqa: BLE001 - keep committing other files
                self.log.exception("commit of %d files failed", len(batch))
                failed = Replies()
                for f in batch:
                    if not f.done:
                        self.stats["files_commit_failed"] += 1
                        f.session.files.pop(f.file_id, None)
                        f.session.settle(f.file_id)
                        self._discard(f, remove=True)  # released before the answer: the retry can open it
                        failed.add(f, {"ok": False, "retryable": True, "error": f"{f.relpath!r}: commit failed"})
                self._send_replies(failed)

    def _commit_batch(self, batch: list[RecvFile]) -> None:
        good: list[RecvFile] = []
        refused = Replies()  # answered before the group's flush, as each was found
        for f in batch:
            with self._lock:
                current = self._attempts.get(f.session.job_key, 0)
            if f.session.attempt < current:
                self.stats["files_stale"] += 1
                self._discard(f, remove=False)  # released before the answer (issue 8, defect 6)
                refused.add(f, {"ok": False, "retryable": False, "kind": "refused",
                                "error": f"{f.relpath!r}: stale attempt {f.session.attempt}, "
                                         f"attempt {current} is current"})
                continue
            if f.expected_hash is None:
                actual = None
            elif f.tree is not None:
                actual = f.tree.digest(f.fd)  # the blocks' subtree values merged, only uncovered nodes read back
                self.stats["bytes_hashed_arriving"] += f.tree.bytes_hashed
                self.stats["bytes_hashed_read_back"] += f.size - f.tree.bytes_hashed
            elif f.hasher is not None:
                actual = f.hasher.finish(f.fd, f.size)
            else:
                actual = hash_fd(f.fd, f.size, f.algo, f.session.digest_key(f.algo))
            if actual != f.expected_hash:
                self.stats["files_checksum_mismatch"] += 1
                self.log.warning("checksum mismatch for %s: expected %s, got %s", f.relpath, f.expected_hash, actual)
                f.session.files.pop(f.file_id, None)
                f.session.settle(f.file_id)
                self._discard(f, remove=True)  # released before the answer, so the retry's OPEN finds it free
                refused.add(f, {"ok": False, "retryable": True, "kind": "checksum",
                                "error": f"{f.relpath!r}: checksum mismatch "
                                         f"(sent {f.expected_hash}, received {actual})"})
                continue
            good.append(f)
        self._send_replies(refused)
        if not good:
            return
        if self.fsync:
            storage.sync_files([f.fd for f in good], self._sync_pool)
        dirs: dict[tuple[int, int], int] = {}
        faultpoints.hit("commit.before_rename")
        # order: rename first, then the sidecar's removal. A crash between them leaves at worst a sidecar whose
        # part is gone, which describes no bytes and is removed at the next listing or sweep (never a part
        # without its record of ranges that could be mistaken for a resumable one)
        for f in good:
            dkey = f.part_key[0]
            replaced = _regular_size(f.dir_fd, f.base) if f.quota is not None else 0
            os.rename(f.tmp, f.base, src_dir_fd=f.dir_fd, dst_dir_fd=f.dir_fd)
            faultpoints.hit("commit.between_renames")
            self._parts.remove(dkey, f.base, f.tmp)
            if f.quota is not None:  # issue 40: its reservation is held now; its part's, a replaced file's bytes leave
                self._quotas.landed(f.quota, f.relpath, f.size)
                self._quotas.part_gone(self._part_rel(dkey, f.tmp))
                self._quotas.add(f.relpath, -replaced)
            if f.meta_written:
                self._unlink_quiet(f.dir_fd, f.tmp + ".meta", part=False)
            dirs.setdefault(dkey, f.dir_fd)
        if self.fsync:
            for dfd in dirs.values():
                os.fsync(dfd)
        committed = Replies()
        for f in good:
            f.done = True
            self.stats["files_committed"] += 1
            if self.on_commit is not None:  # transfer_agent.service.metrics: the file's OPEN -> commit seconds
                self.on_commit(time.monotonic() - f.opened)
            f.session.files.pop(f.file_id, None)
            committed.add(f, {"ok": True, "hash": f.expected_hash})
            self._release(f)
        self._send_replies(committed)  # per session, one COMMITTED_BATCH to a sender that speaks batch

    def _send_replies(self, replies: "Replies") -> None:
        for session, frames in replies.by_session.items():
            self._reply_all(session, frames)

    def _reply_all(self, session: Session, frames: list[tuple[Frame, int, dict[str, Any]]]) -> None:
        """Send a session's answers in one write, batched when its sender speaks batch (``wire.batch``; else one
        frame each, as an older sender expects); counted in ``stats`` (batches_sent, batched_sent)."""
        if not frames:
            return
        try:
            sent = send_batched(session.control, frames)
        except FStreamError:
            return  # the sender is gone; its files stay resumable
        batches = sum(1 for ftype, _body, _fid in sent if ftype in INNER)
        if batches:
            self.stats["batches_sent"] += batches
            self.stats["batched_sent"] += len(frames) - (len(sent) - batches)


def _regular_size(dir_fd: int, name: str) -> int:
    """The size of regular file ``name`` in ``dir_fd`` (0 when there is none): what a commit over it replaces."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


class Replies:
    """COMMITTED answers gathered per session, to be sent together (``GroupCommit._send_replies``)."""

    def __init__(self) -> None:
        self.by_session: dict[Session, list[tuple[Frame, int, dict[str, Any]]]] = {}

    def add(self, f: RecvFile, body: dict[str, Any]) -> None:
        self.by_session.setdefault(f.session, []).append((Frame.COMMITTED, f.file_id, body))

