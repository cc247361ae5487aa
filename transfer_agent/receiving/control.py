"""The control session after the handshake: OPEN (validation, fencing, resumption), COMMIT, ABORT/SKIP, PING, BYE.

Security (issue 8; what each mode protects against: ``transfer_agent.wire.secure``): with a shared secret every
control frame is authenticated (``ControlLink``), and OPENs must name a keyed digest (``blake3-keyed``, hashed with
the control connection's digest key, also for parts of earlier sessions, which are read back from disk). A file is
held by one session at a time; a stale holder (an earlier attempt, or a session whose sender is gone) is fenced.

Keys (issue 32): an OPEN outside the subtree of the session's key, or beyond its quota, is refused (terminal)
before anything is created or claimed: no directory, no part, no claim.

Backpressure (issue 43, ``admission``): an OPEN beyond the receiver's budget of open parts (from its descriptor
limit) is parked and answered, in order, once parts are released; a sender's pipeline waits meanwhile. Running out of
descriptors or memory anyway is a retryable refusal, never a terminal one.

Batches (issue 29, ``wire.batch``): an OPEN_BATCH or COMMIT_BATCH is handled frame by frame, exactly as its frames
alone would be (``_open`` per OPEN, ``_request_commit`` per COMMIT); a sender that listed "batch" gets the OPENs'
answers in one OPEN_OK_BATCH (an older one gets one frame each). A malformed batch ends the session, saying why.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import time
from typing import Any

from transfer_agent.errors import FStreamError, ProtocolError, RefusedError
from transfer_agent.receiving import admission
from transfer_agent.receiving.data import DataStreams
from transfer_agent.receiving.quota import Charge
from transfer_agent.receiving.state import RecvFile, Session
from transfer_agent.storage import durable as storage
from transfer_agent.storage import hash_plan
from transfer_agent.storage.checksum import ALGORITHMS, KEYED, PrefixHasher, hash_fd
from transfer_agent.storage.paths import open_parent, safe_relpath, temp_name
from transfer_agent.storage.ranges import RangeSet, read_meta, write_meta
from transfer_agent.storage.tree_hash import TreeDigest
from transfer_agent.wire.batch import unpack
from transfer_agent.wire.protocol import Frame
from transfer_agent.wire.secure import ControlLink

MAX_FILE_SIZE = 1 << 50
RESERVE_MIN = 8 << 20  # smaller files rely on the free-space check; a preallocation each is not worth it
FREE_CHECK_MIN = 1 << 20  # larger files always re-read free space; smaller ones use the running estimate
FENCE_WAIT = 5.0  # how long an OPEN waits for a fenced stale holder to release the file
REPLY_EARLY = 0.002  # seconds: answers to a batch's OPENs held longer than this go at once, not with the rest


def _connected(sock: socket.socket | None) -> bool:
    """False when the peer of ``sock`` is gone (closed, reset, or it sent FIN), per the kernel's TCP state."""
    if sock is None:
        return True  # not registered yet: it is being set up right now
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    except (OSError, AttributeError, ValueError):
        return False
    return info[0] == 1  # TCP_ESTABLISHED


def _shutdown(sock: socket.socket | None) -> None:
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError):
            pass


class ControlSessions(DataStreams):
    """Serve a session's control connection (the layer of ``Receiver`` above ``DataStreams``)."""

    def _control_loop(self, session: Session, link: ControlLink) -> None:
        while not self._stop.is_set():
            try:
                ftype, fid, body = link.recv()
                batch = unpack(ftype, body) if ftype in (Frame.OPEN_BATCH, Frame.COMMIT_BATCH) else None
            except ProtocolError as exc:  # tell the sender why its session ends (authenticated), then close
                session.reply(Frame.ERROR, {"kind": exc.kind, "message": str(exc), "retryable": False})
                raise
            if batch is not None:
                self.stats["batches_received"] += 1
                self.stats["batched_received"] += len(batch)
                self._batch(session, batch)
            elif not self._control_frame(session, ftype, fid, body):
                return

    def _control_frame(self, session: Session, ftype: Frame, fid: int, body: dict[str, Any]) -> bool:
        """Handle one frame of the control connection; False once the session ends (BYE)."""
        if ftype == Frame.OPEN:
            answer = self._offer(session, fid, body)
            if answer is not None:
                session.reply(answer[0], answer[1], fid)
        elif ftype == Frame.COMMIT:
            self._request_commit(session, fid, body)
        elif ftype in (Frame.ABORT, Frame.SKIP):
            self.stats["files_aborted" if ftype == Frame.ABORT else "files_skipped"] += 1
            session.deferred.discard(fid)
            self._gate.forget(session, fid)  # parked, not opened yet (issue 43): it never will be
            f = session.files.pop(fid, None)
            if f is not None:
                session.settle(fid)  # its blocks may still be on their way: they are dropped
                self._discard(f, remove=True)
        elif ftype == Frame.PING:
            session.reply(Frame.PONG, body)
        elif ftype == Frame.BYE:
            session.reply(Frame.BYE, {})  # everything before it was handled: the sender may go
            return False
        else:
            raise ProtocolError(f"unexpected {ftype.name} frame on control connection")
        return True

    def _batch(self, session: Session, frames: list[tuple[Frame, int, dict[str, Any]]]) -> None:
        """An OPEN_BATCH or COMMIT_BATCH (issue 29): each frame handled as if it came alone, in order; the OPENs'
        answers go back together (one OPEN_OK_BATCH to a sender that speaks batch), and early when a batch takes
        long (an existing copy to hash), so a file's answer never waits long for the files after it."""
        replies: list[tuple[Frame, int, dict[str, Any]]] = []
        since = time.monotonic()
        for ftype, fid, body in frames:
            if ftype == Frame.OPEN:
                answer = self._offer(session, fid, body)
                if answer is None:
                    continue  # parked: answered when admitted
                replies.append((answer[0], fid, answer[1]))
                if time.monotonic() - since > REPLY_EARLY:
                    self._reply_all(session, replies)
                    replies, since = [], time.monotonic()
            else:
                self._request_commit(session, fid, body)
        self._reply_all(session, replies)

    def _offer(self, session: Session, fid: int, body: dict[str, Any]) -> tuple[Frame, dict[str, Any]] | None:
        """An OPEN through the receiver's budget of open parts (issue 43, ``admission``): answered now, or None
        when it is parked (``_admit_parked`` answers it once parts are released), or refused as busy (retryable)
        when too many OPENs are parked already."""
        verdict = self._gate.admit(session, fid, body)
        if verdict == admission.PARK:
            self.stats["opens_parked"] += 1
            return None
        if verdict == admission.FULL:
            self.stats["files_refused"] += 1
            return Frame.ERROR, {"kind": "refused", "retryable": True,
                                 "message": f"{body.get('path')!r}: busy: the receiver holds as many files open as "
                                            "its descriptor limit allows and has OPENs waiting already"}
        return self._open_admitted(session, fid, body)

    def _open_admitted(self, session: Session, fid: int, body: dict[str, Any]) -> tuple[Frame, dict[str, Any]]:
        """Open a file that holds a slot of the budget; the slot is kept while the file holds an open part."""
        try:
            with session.opening:  # (its session's end waits for it, so no file is left open in an ended session)
                if session.closed:
                    answer = Frame.ERROR, {"kind": "network", "retryable": True, "message": "the session ended"}
                else:
                    answer = self._open_reply(session, fid, body)
        except BaseException:
            self._gate.release(session, fid)  # nothing was opened: a bug's exception never costs a slot for good
            raise
        f = session.files.get(fid)
        self._gate.opened(session, fid, holds_part=answer[0] == Frame.OPEN_OK and f is not None and f.fd >= 0)
        return answer

    def _admit_parked(self, batch: list[tuple[Session, int, dict[str, Any]]]) -> None:
        """Open and answer parked OPENs the budget admits now (``OpenGate.run``'s thread), per session in one
        write."""
        replies: dict[Session, list[tuple[Frame, int, dict[str, Any]]]] = {}
        for session, fid, body in batch:
            if session.closed:
                self._gate.release(session, fid)
                continue
            try:
                rtype, reply = self._open_admitted(session, fid, body)
            except Exception:  # noqa: BLE001 - as on the control connection, the session ends (it retries)
                self.log.exception("session %s: OPEN of file id %d failed", session.id[:8], fid)
                self._gate.release(session, fid)
                _shutdown(session.sock)
                continue
            replies.setdefault(session, []).append((rtype, fid, reply))
        for session, frames in replies.items():
            self._reply_all(session, frames)

    def _open_reply(self, session: Session, fid: int, body: dict[str, Any]) -> tuple[Frame, dict[str, Any]]:
        """The answer to one OPEN: OPEN_OK and its body (``_open``), or the ERROR that refuses this file only."""
        try:
            return Frame.OPEN_OK, self._open(session, fid, body)
        except FStreamError as exc:
            self.stats["files_refused"] += 1
            return Frame.ERROR, {"kind": exc.kind, "message": str(exc), "retryable": exc.retryable}
        except OSError as exc:
            self.stats["files_refused"] += 1
            if self._stop.is_set() or exc.errno == errno.EBADF:
                # the receiver is stopping and closed its root under this OPEN: not the file's fault, so never a
                # terminal refusal (a --watch stream gave such a file up for good; tests/test_watch_outage.py)
                return Frame.ERROR, {"kind": "network", "retryable": True,
                                     "message": f"{body.get('path')!r}: the receiver is stopping ({exc.strerror})"}
            if admission.transient(exc):  # out of descriptors or memory for now (issue 43): never terminal
                return Frame.ERROR, {"kind": "refused", "retryable": True,
                                     "message": f"{body.get('path')!r}: busy: {exc.strerror} (try again)"}
            nospace = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            return Frame.ERROR, {"kind": "refused", "retryable": False,
                                 "message": f"{body.get('path')!r}: {'disk full' if nospace else exc.strerror}"}

    def _open(self, session: Session, fid: int, body: dict[str, Any]) -> dict[str, Any]:
        """Open one file (validate, admit, claim, skip check or part): the body of its OPEN_OK, which the caller
        sends (alone, or with its batch's); a refusal is raised."""
        if fid in session.files or (fid in session.deferred and not body.get("replace")):
            raise ProtocolError(f"file id {fid} opened twice")
        rel, size, mtime_ns, algo = self._validate_open(body)
        verify = body.get("verify", True)  # false: the COMMIT will carry no digest; nothing is hashed ahead
        digest_key = session.digest_key(algo)
        if session.keys is not None and digest_key is None:
            raise RefusedError(f"{rel!r}: checksum algorithm {algo!r} is not keyed; this receiver has a shared "
                               f"secret and accepts only {', '.join(KEYED)} (an unkeyed digest can be rewritten "
                               "in transit together with the data)")
        charge = self._admit(session, rel, size)  # before anything is created or claimed
        try:
            dir_fd, dkey, base = self._parent(session, rel)
        except BaseException:
            self._quotas.refund(charge)
            raise
        key = (dkey, base)
        try:
            self._claim_part(session, key, rel)
        except BaseException:
            os.close(dir_fd)
            self._quotas.refund(charge)
            raise
        fd = -1
        created: str | None = None
        try:
            existing_hash = (None if body.get("replace") or not verify
                             else self._existing_hash(dir_fd, base, rel, size, algo, digest_key))
            if existing_hash is not None:
                # nothing is created or reserved until the sender says whether its copy differs
                self._quotas.refund(charge)
                charge = None
                self._reclaim_bare_parts(dir_fd, dkey, base)
                os.close(dir_fd)
                with self._lock:
                    self._busy_parts.pop(key, None)
                    self._released.notify_all()
                session.deferred.add(fid)
                return {"missing": [[0, size]], "resumed": 0, "existing_hash": existing_hash}
            session.deferred.discard(fid)
            ranges, tmp = self._take_over_part(session, dir_fd, dkey, base, rel, size, mtime_ns, algo)
            charge = self._quotas.settle(charge, rel, size, ranges.total())  # before the part is created
            need = size - ranges.total()
            if tmp is None and need > FREE_CHECK_MIN or need > session.free_estimate:
                session.free_estimate = storage.free_bytes(dir_fd)  # small files use the estimate
                if tmp is None and need > session.free_estimate:
                    raise RefusedError(f"{rel!r}: no space left: file needs {need} bytes, "
                                       f"{session.free_estimate} free")
            session.free_estimate -= need
            resumed_part = tmp is not None
            if tmp is None:
                tmp = temp_name(base, session.job, session.attempt)
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                             dir_fd=dir_fd)
                created = tmp
                self._parts.add(dir_fd, base, tmp, key=dkey)
                if size >= RESERVE_MIN:
                    storage.reserve(fd, size)
            else:
                fd = os.open(tmp, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            # the ranges sidecar is written by the first flush (or when the session ends): a small file
            # that commits within the flush interval never costs an extra file
            f = RecvFile(fid, rel, dir_fd, base, tmp, size, mtime_ns, algo, fd, ranges, session, part_key=key,
                         quota=charge, resumed=ranges.total())
            if charge is not None:
                self._quotas.writing(self._part_rel(dkey, tmp), True)
            charge = None  # the file carries it from here (given back if it is not committed)
            f.dirty = True
            how = hash_plan.plan(size, algo, verify)
            if how == hash_plan.TREE:
                f.tree = TreeDigest(size, digest_key)  # hashed as blocks arrive; a taken-over part is read back
            elif how == hash_plan.AHEAD:
                # reads from disk: a taken-over part is hashed with this key
                f.hasher = PrefixHasher(algo, digest_key, size)
            f.meta_written = resumed_part  # a taken-over part brought its sidecar along
        except BaseException:
            if fd >= 0:
                os.close(fd)  # never leak the part's descriptor (issue 8, defect 4)
            if created is not None:
                self._remove_part(dir_fd, dkey, base, created)  # nor leave the new, empty part behind
            self._quotas.refund(charge)
            os.close(dir_fd)
            with self._lock:
                self._busy_parts.pop(key, None)
                self._released.notify_all()
            raise
        with session.lock:
            session.settled.pop(fid, None)
        session.files[fid] = f
        return {"missing": f.ranges.missing(size), "resumed": ranges.total(), "existing_hash": existing_hash}

    def _admit(self, session: Session, rel: str, size: int) -> Charge | None:
        """Refuse an OPEN the session's key may not make, before anything is created or claimed (issue 32): a
        path outside its subtree (component-wise: subtree ``lcls`` does not admit ``lcls2/x``), or a file that a
        quota covering the path cannot hold (issue 40: every key's quota whose subtree holds it, whichever key
        writes); else reserve ``size`` on those quotas (None: none covers it, or decided by ``Quotas.settle``
        once a part being resumed is taken over: it may hold some of the bytes, if its directory exists)."""
        key = session.key
        if not key.admits(rel):
            raise RefusedError(f"{rel!r}: key {key.key_id!r} may write only under {key.subtree + '/'!r}")
        try:
            return self._quotas.charge(rel, size)
        except RefusedError:
            if not self._parent_exists(session, rel):
                raise
            return None

    def _parent_exists(self, session: Session, rel: str) -> bool:
        """Whether the directory of ``rel`` exists (walked without following symlinks, creating nothing)."""
        if rel.rpartition("/")[0] in session.dirs:
            return True
        try:
            dfd, _base = open_parent(self._root_fd, rel, create=False)
        except (OSError, FStreamError):
            return False
        os.close(dfd)
        return True

    def _claim_part(self, session: Session, key: tuple[tuple[int, int], str], rel: str) -> None:
        """Mark the file busy for ``session``. A holder that is stale — an earlier or equal attempt of the same
        job (a restarted or reconnected sender), or a session whose control connection is gone — is fenced: its
        session is shut down and we wait (bounded) until it released the file. A live holder of another job
        means "busy", retryable (issue 8, defect 6)."""
        deadline = time.monotonic() + FENCE_WAIT
        fenced: Session | None = None
        with self._lock:
            while True:
                holder = self._busy_parts.get(key)
                if holder is None:
                    self._busy_parts[key] = session
                    return
                stale = holder is not session and (
                    holder.closed or (holder.job_key == session.job_key and holder.attempt <= session.attempt)
                    or not _connected(holder.sock))
                left = deadline - time.monotonic()
                if not stale or left <= 0:
                    what = "a stale session of this file did not let go in time" if stale else \
                        f"another session ({holder.peer}, job {holder.job}) is receiving this file"
                    raise FStreamError(f"{rel!r}: busy: {what}", retryable=True)
                if fenced is not holder:
                    fenced = holder
                    self.stats["fenced"] += 1
                    self.log.info("%s: fencing stale session %s (job %s attempt %d) for session %s (job %s "
                                  "attempt %d)", rel, holder.id[:8], holder.job, holder.attempt, session.id[:8],
                                  session.job, session.attempt)
                    _shutdown(holder.sock)  # its control loop ends and closes the session, releasing the file
                self._released.wait(left)

    @staticmethod
    def _validate_open(body: dict[str, Any]) -> tuple[str, int, int, str]:
        """Check every field of an OPEN before anything is opened or created (issue 8, defect 4):
        (relative path, size, mtime_ns, algo). bool is refused where an int is due (``True`` is not 1 byte)."""
        path = body.get("path", "")
        if not isinstance(path, str):
            raise RefusedError(f"malformed OPEN: path {path!r} is not a string")
        rel = safe_relpath(path)
        size = body.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or size > MAX_FILE_SIZE:
            raise RefusedError(f"{rel!r}: declared size {size!r} is not a valid file size")
        mtime_ns = body.get("mtime_ns", 0)
        if not isinstance(mtime_ns, int) or isinstance(mtime_ns, bool):
            raise RefusedError(f"{rel!r}: malformed OPEN: mtime_ns {mtime_ns!r} is not an integer")
        algo = body.get("algo", "xxh3_128")
        if not isinstance(algo, str):
            raise RefusedError(f"{rel!r}: malformed OPEN: algo {algo!r} is not a string")
        if algo not in ALGORITHMS:
            raise RefusedError(f"{rel!r}: checksum algorithm {algo!r} not supported")
        for flag, default in (("replace", False), ("verify", True)):
            if not isinstance(body.get(flag, default), bool):
                raise RefusedError(f"{rel!r}: malformed OPEN: {flag} {body.get(flag)!r} is not a boolean")
        return rel, size, mtime_ns, algo

    def _existing_hash(self, dir_fd: int, base: str, rel: str, size: int, algo: str,
                       key: bytes | None = None) -> str | None:
        try:
            st = os.stat(base, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if stat.S_ISDIR(st.st_mode):
            raise RefusedError(f"{rel!r}: a directory of that name exists at the destination")
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return None
        fd = os.open(base, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
        try:
            return hash_fd(fd, size, algo, key)
        finally:
            os.close(fd)

    def _take_over_part(self, session: Session, dir_fd: int, dkey: tuple[int, int], base: str, rel: str,
                        size: int, mtime_ns: int, algo: str) -> tuple[RangeSet, str | None]:
        """Find a part file of an earlier attempt with the same source identity; rename it to ours."""
        for name in self._parts.candidates(dir_fd, base, key=dkey):
            meta = read_meta(dir_fd, name + ".meta")
            if meta is None:
                self._remove_part(dir_fd, dkey, base, name)  # no record of what it holds (not busy: checked above)
                continue
            if meta.get("path") != rel:
                continue
            if meta.get("job") == session.job and int(meta.get("attempt", 0)) > session.attempt:
                raise RefusedError(f"{rel!r}: stale attempt {session.attempt} of job {session.job}: "
                                   f"attempt {meta.get('attempt')} already wrote it")
            # (another digest algorithm or key does not matter: the commit hashes the bytes on disk afresh)
            if meta.get("size") != size or meta.get("mtime_ns") != mtime_ns:
                self._remove_part(dir_fd, dkey, base, name)  # source changed since: the old part is useless
                continue
            new = temp_name(base, session.job, session.attempt)
            if name != new:
                os.rename(name, new, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                self._parts.remove(dkey, base, name)
                self._parts.add(dir_fd, base, new, key=dkey)
                write_meta(dir_fd, new + ".meta", {**meta, "job": session.job, "attempt": session.attempt,
                                                   "algo": algo})
                self._unlink_quiet(dir_fd, name + ".meta", part=False)
            ranges = RangeSet(tuple(r) for r in meta.get("ranges", []))
            reldir = rel.rpartition("/")[0]
            self._quotas.part_resumed(f"{reldir}/{name}" if reldir else name, f"{reldir}/{new}" if reldir else new,
                                      ranges.total())  # its quotas count what it holds, not what it was walked at
            self.log.info("resuming %s: %d of %d bytes already here", rel, ranges.total(), size)
            return ranges, new
        return RangeSet(), None

    def _reclaim_bare_parts(self, dir_fd: int, dkey: tuple[int, int], base: str) -> None:
        """Remove parts of this file that have no ranges sidecar (a crashed attempt's, never flushed): they record
        nothing resumable. Called while this session holds the file's claim, so no live session owns them; when
        the file is opened for writing, ``_take_over_part`` does the same."""
        for name in self._parts.candidates(dir_fd, base, key=dkey):
            if read_meta(dir_fd, name + ".meta") is None:
                self.log.info("removed %s: a part without a record of its ranges (an earlier attempt's)", name)
                self._remove_part(dir_fd, dkey, base, name)

    def _request_commit(self, session: Session, fid: int, body: dict[str, Any]) -> None:
        f = session.files.get(fid)
        if f is None:
            raise ProtocolError(f"COMMIT for file id {fid} that is not open in this session")
        with f.lock:
            digest = body.get("hash")
            f.expected_hash = str(digest) if digest is not None else None  # None: sender ran without --verify
            f.commit_requested = True
            ready = f.ranges.covers(f.size) and not f.queued and not f.failed
            if ready:
                f.queued = True
        if ready:
            self._commit_q.put(f)

