"""The sender's control session: OPEN/COMMIT/ABORT/SKIP over the authenticated control link, pipelined, and their answers.

Batches (issue 29, ``wire.batch``): with a receiver that listed "batch", the OPENs a channel's driver has ready go
in one OPEN_BATCH (``open_many``), and COMMITs that become ready while another is being sent go together in the
next COMMIT_BATCH (``_queue_commit``); the answers may come batched too (OPEN_OK_BATCH, COMMITTED_BATCH), each
frame in them handled as if it came alone. With an older receiver every request goes as its own frame, as before.
A data stream that has its next block at hand may keep the COMMIT of the file it just finished until it has no
block at hand (``flush_commits``), or at most ``KEEP_MAX_S`` and one block, so the COMMITs of small files go
several per frame.
Sources of at most ``INLINE_HASH_MAX`` bytes are hashed by the driver that opened them, after their OPENs left,
while the receiver answers (no hand-off to the hasher pool and back for a small file). Issue 43 raised it from 64 KiB
to 256 KiB: 2000 files of 256 KiB at cc=4 went in 0.80 s instead of 0.89 (six alternating runs, pinned or not), and
each of the cc drivers hashes in its own thread, so nothing is serialized that the pool ran in parallel.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Iterable

from fstream_provider.watch.sources import SrcFile
from transfer_agent import faultpoints
from transfer_agent.errors import (
    CancelledError,
    ChecksumError,
    FStreamError,
    NetworkError,
    SourceRefusedError,
    ProtocolError,
    RefusedError,
    SourceModifiedError,
    SourceVanishedError,
)
from transfer_agent.sending.connector import Connector
from transfer_agent.sending.inflight import InFlight, Ready, hold, release, settle
from transfer_agent.storage.checksum import hash_fd_also
from transfer_agent.wire.batch import BATCH_MAX, INNER, Sub, pack, speaks_batch, unpack
from transfer_agent.wire.protocol import Frame, error_from_body

log = logging.getLogger("fstream.sender")
INLINE_HASH_MAX = 256 << 10  # sources this small are hashed by the thread that opens them, not the hasher pool
KEEP_MAX_S = 0.001  # a COMMIT kept for a stream's next write (``all_sent(keep=True)``) is sent within this at most
PEER_SILENCE_S = 0.5  # a failed session's reader waiting this long for the receiver's next frame: it has no more to say
ANSWER_MAX_S = 10.0  # the longest a failed session waits for the receiver to have said everything (as a BYE's answer)


class ControlSession:
    """The control connection: sends OPEN/COMMIT/ABORT, dispatches replies to in-flight files.

    :param connector: opens the connection.
    :param on_finished: called with each InFlight once its outcome is known.
    :param hasher: executor used to checksum source files.
    :param algo: checksum algorithm; default ``blake3-keyed`` (keyed with this connection's digest key)
        with a shared secret, ``xxh3_128`` with TLS only.
    :param verify: end-to-end checksums (off: the receiver only checks that every byte arrived).
    :param public_algo: when the verifying digest is keyed, also compute this unkeyed digest of the
        same bytes in the same read pass, for manifests and flow records (``spec.public_checksum``).
    """

    public_algo: str | None = None  # set per session in __init__ (a class default for sessions built without it)
    batch = False  # the receiver speaks batch frames (set in __init__ from its handshake; default: single frames)
    stated = False  # ``error`` is the reason the receiver gave for ending the session (``fail``)
    _listening_since: float | None = None  # when the reader began to wait for the receiver's next frame (None: busy)

    def __init__(self, connector: Connector, on_finished: Callable[[InFlight], None], hasher: Any,
                 algo: str | None = None, verify: bool = True, public_algo: str | None = None,
                 guard: Any = None) -> None:
        self.connector = connector
        self.guard = guard  # the agent's policy: each opened descriptor must lie within the job's roots
        self.on_finished = on_finished
        self.hasher = hasher
        self.verify = verify
        hs = connector.connect_link(role="control")
        self.keys = hs.keys
        self.sock = hs.link.sock
        self.writer = hs.link  # MAC'd (or sealed) control frames; same send() as a ControlWriter
        self.writer.read_ahead()  # the handshake is done: only control frames follow
        self.digest_key = self.keys.digest if self.keys is not None else None
        self.algo = algo or ("blake3-keyed" if self.digest_key is not None else "xxh3_128")
        if self.algo != "blake3-keyed":
            self.digest_key = None
        self.public_algo = public_algo if public_algo and self.digest_key is not None else None
        self.batch = speaks_batch(hs.link)
        # frames of batches sent and received, and the files in them (what tests and benchmarks look at)
        self.stats = {"batches_sent": 0, "batched_sent": 0, "batches_received": 0, "batched_received": 0}
        self._commits: list[Sub] = []  # COMMITs queued while another thread sends (``_queue_commit``)
        self._commit_lock = threading.Lock()
        self._committing = False
        self._queued_since = 0.0  # when the oldest COMMIT queued was queued
        self._files: dict[int, InFlight] = {}
        self._lock = threading.Lock()
        self._next_id = 1
        self._pongs: dict[int, threading.Event] = {}
        self.error: FStreamError | None = None
        self._fail_lock = threading.Lock()
        self.failed = threading.Event()
        self.bye = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name="fstream-control-reader", daemon=True)
        self._reader.start()

    # -- requests ------------------------------------------------------------------------------
    def rtt(self, samples: int = 3) -> float:
        best = float("inf")
        for i in range(samples):
            ev = threading.Event()
            self._pongs[i] = ev
            t0 = time.perf_counter()
            self.writer.send(Frame.PING, {"n": i})
            if not ev.wait(10):
                raise NetworkError("receiver did not answer PING within 10 s")
            best = min(best, time.perf_counter() - t0)
        return best

    def open(self, sf: SrcFile) -> InFlight:
        """Open the source, send OPEN, start its checksum; the reply arrives asynchronously."""
        f = self._prepare(sf)
        self._send([(Frame.OPEN, f.file_id, self._open_body(sf.rel, f.st_size, f.st_mtime_ns))])
        self._start_hash(f)
        return f

    def open_many(self, sfs: Iterable[SrcFile], unopenable: Callable[[SrcFile, FStreamError], None]
                  ) -> list[InFlight]:
        """Open each source and send their OPENs in one write (batched when the receiver speaks batch), then
        start their checksums; a source that cannot be opened goes to ``unopenable``, the others go on."""
        files = []
        for sf in sfs:
            try:
                files.append(self._prepare(sf))
            except SourceModifiedError as exc:
                unopenable(sf, exc)
        if files:
            self._send([(Frame.OPEN, f.file_id, self._open_body(f.sf.rel, f.st_size, f.st_mtime_ns)) for f in files])
            for f in files:
                self._start_hash(f)
        return files

    def _prepare(self, sf: SrcFile) -> InFlight:
        """Open the source (checked by the guard) and register it under a new file id."""
        try:
            if self.guard is not None:  # an agent's job: opened beneath its roots (``storage.contain.Guard.open``)
                fd, st = self.guard.open(sf.src)
            else:
                fd = os.open(sf.src, os.O_RDONLY | os.O_CLOEXEC)
                st = os.fstat(fd)
        except FStreamError as exc:
            raise SourceRefusedError(str(exc)) from None
        except FileNotFoundError:
            raise SourceVanishedError(f"{sf.src}: source vanished before it was sent (renamed or deleted)") from None
        except OSError as exc:
            raise SourceModifiedError(f"{sf.src}: cannot open source ({exc.strerror})") from None
        with self._lock:
            fid = self._next_id
            self._next_id += 1
            f = InFlight(sf, fid, fd, st.st_size, st.st_mtime_ns)
            self._files[fid] = f
        return f

    def _start_hash(self, f: InFlight) -> None:
        """Start ``f``'s checksum: a small source here and now (its OPEN is on its way; a hand-off to the pool
        and back would cost more than the hash), a larger one on the hasher pool."""
        if self.verify and f.st_size > INLINE_HASH_MAX:
            f.hash_future = self.hasher.submit(self._hash, f)
            return
        try:
            f.hash_future = Ready(self._hash(f) if self.verify else None)
        except Exception as exc:  # noqa: BLE001 - the commit reports it, as it would from the pool
            f.hash_future = Ready(error=exc)

    def _send(self, subs: list[Sub]) -> None:
        """Send per-file frames in one write: batched when the receiver speaks batch."""
        if len(subs) == 1:
            ftype, fid, body = subs[0]
            self.writer.send(ftype, body, fid)
            return
        out = pack(subs, self.batch)
        self.writer.send_frames(out)
        batches = sum(1 for ftype, _body, _fid in out if ftype in INNER)
        if batches:
            self.stats["batches_sent"] += batches
            self.stats["batched_sent"] += len(subs) - (len(out) - batches)

    def _open_body(self, rel: str, size: int, mtime_ns: int, **more: Any) -> dict[str, Any]:
        """An OPEN's body. Without verification it says so (``verify: false``): the receiver then neither
        hashes the file while it arrives nor hashes an existing copy for a skip check (issue 13: both were
        done and thrown away); a receiver that predates the field ignores it."""
        body = {"path": rel, "size": size, "mtime_ns": mtime_ns, "algo": self.algo, **more}
        if not self.verify:
            body["verify"] = False
        return body

    def reopen(self, f: InFlight) -> None:
        """Ask again to open a file whose destination copy differs: this time it is replaced."""
        f.reply = None
        f.opened.clear()
        self.writer.send(Frame.OPEN, self._open_body(f.sf.rel, f.st_size, f.st_mtime_ns, replace=True), f.file_id)

    def _hash(self, f: InFlight) -> str | None:
        """Checksum ``f``'s source under a hold, so a session closing meanwhile cannot close (and the
        next open reuse) the descriptor under the hasher; None if the file was settled first."""
        if not hold(f):
            return None
        try:
            digest, f.public_digest = hash_fd_also(f.fd, f.st_size, self.algo, self.digest_key, self.public_algo)
            return digest
        finally:
            release(f)

    def all_sent(self, f: InFlight, keep: bool = False) -> None:
        """Every block of ``f`` is on the wire: when its checksum is ready, check the source and COMMIT.

        ``keep``: the caller (a data stream) has its next block at hand and calls ``flush_commits`` once it has
        none, so a COMMIT ready now may wait for it (at most ``KEEP_MAX_S``) and go with the next ones."""
        fut = f.hash_future
        if keep and fut.done():
            self._commit(f, fut, keep=True)
        else:
            fut.add_done_callback(lambda fut: self._commit(f, fut))

    def _commit(self, f: InFlight, fut: Any, keep: bool = False) -> None:
        # The checksum may finish (or be cancelled) after the session settled the file — a session
        # that failed, was fenced or cancelled closes every source: nothing is left to commit then,
        # and the descriptor number may already belong to another file.
        if fut.cancelled() or not hold(f):
            return
        try:
            try:
                digest = fut.result()
                st = os.fstat(f.fd)
            except (EOFError, OSError) as exc:
                raise SourceModifiedError(f"{f.sf.src}: source modified while being sent ({exc}); "
                                          "not committed") from None
            if st.st_size != f.st_size or st.st_mtime_ns != f.st_mtime_ns:
                raise SourceModifiedError(f"{f.sf.src}: source modified while being sent ("
                                          + (f"size {f.st_size}→{st.st_size}" if st.st_size != f.st_size
                                             else "mtime changed") + "); not committed")
            faultpoints.hit("commit.before_send")
            self._queue_commit(f.file_id, digest, keep)
        except SourceModifiedError as exc:
            self.abort(f, exc)
        except FStreamError as exc:
            self.fail(exc)
        finally:
            release(f)

    def _queue_commit(self, fid: int, digest: str | None, keep: bool = False) -> None:
        """Send a COMMIT. With a receiver that speaks batch, COMMITs that become ready (on other streams or
        hashers) while one thread is sending go with that thread's next write: whoever finds nobody sending sends
        everything queued, so a COMMIT never waits for a batch to fill, nor longer than the write before it.
        ``keep``: leave it queued for the caller's ``flush_commits`` (see ``all_sent``)."""
        if not self.batch:
            self.writer.send(Frame.COMMIT, {"hash": digest}, fid)
            return
        with self._commit_lock:
            if not self._commits:
                self._queued_since = time.monotonic()
            self._commits.append((Frame.COMMIT, fid, {"hash": digest}))
            if self._committing:
                return  # the thread sending now takes it with its next write
            if keep and len(self._commits) < BATCH_MAX and time.monotonic() - self._queued_since < KEEP_MAX_S:
                return
            self._committing = True
        self._drain_commits()

    def flush_commits(self, age: float = 0.0) -> None:
        """Send the COMMITs kept (``all_sent(keep=True)``) now, unless another thread is sending them already;
        with ``age``, only once the oldest of them was queued that many seconds ago (a stream asks before each
        block it sends, so none is kept longer than ``KEEP_MAX_S`` and one block)."""
        if not self._commits or (age and time.monotonic() - self._queued_since < age):
            return
        with self._commit_lock:
            if self._committing or not self._commits:
                return
            self._committing = True
        self._drain_commits()

    def _drain_commits(self) -> None:
        """Send what is queued until nothing is (the caller set ``_committing``)."""
        try:
            while True:
                with self._commit_lock:
                    subs, self._commits = self._commits, []
                    if not subs:
                        self._committing = False
                        return
                self._send(subs)
        except BaseException:
            with self._commit_lock:
                self._committing = False
            raise

    def skip(self, f: InFlight) -> None:
        self.writer.send(Frame.SKIP, {}, f.file_id)
        self._finish(f, "skipped", None)

    def abort(self, f: InFlight, err: FStreamError) -> None:
        f.aborted = True
        try:
            self.writer.send(Frame.ABORT, {"reason": str(err)}, f.file_id)
        except FStreamError:
            pass
        self._finish(f, "failed", err)

    def _finish(self, f: InFlight, outcome: str, err: FStreamError | None) -> None:
        with self._lock:
            if self._files.pop(f.file_id, None) is None:
                return
        f.outcome, f.error = outcome, err
        settle(f)
        self.on_finished(f)

    def outstanding(self) -> list[InFlight]:
        with self._lock:
            return list(self._files.values())

    # -- replies -------------------------------------------------------------------------------
    def _read_loop(self) -> None:
        try:
            while True:
                self._listening_since = time.monotonic()
                ftype, fid, body = self.writer.recv()
                self._listening_since = None
                if ftype == Frame.BYE:
                    self.bye.set()
                    return
                if ftype == Frame.PONG:
                    ev = self._pongs.pop(int(body.get("n", -1)), None)
                    if ev:
                        ev.set()
                    continue
                subs = [(ftype, fid, body)]
                if ftype in (Frame.OPEN_OK_BATCH, Frame.COMMITTED_BATCH):
                    subs = unpack(ftype, body)
                    self.stats["batches_received"] += 1
                    self.stats["batched_received"] += len(subs)
                for sub_type, sub_fid, sub_body in subs:
                    if sub_type == Frame.ERROR and sub_fid == 0:  # the receiver ends the session and says why
                        self.fail(error_from_body(sub_body), stated=True)
                        return
                    self._reply(sub_type, sub_fid, sub_body)
        except FStreamError as exc:
            self.fail(exc)
        except OSError as exc:
            self.fail(NetworkError(f"control connection lost: {exc}"))
        finally:
            self._listening_since = None

    def _reply(self, ftype: Frame, fid: int, body: dict[str, Any]) -> None:
        """One answer about file ``fid`` (alone, or out of a batch)."""
        with self._lock:
            f = self._files.get(fid)
        if f is None:
            # a late reply about a file already settled (e.g. a second stream's write error
            # after the first refused it): never a reason to fail the session's other files
            log.debug("reply %s for file id %d that is no longer in flight", ftype.name, fid)
            return
        if ftype == Frame.OPEN_OK:
            f.reply = body
            f.resumed = int(body.get("resumed", 0))
            f.opened.set()
        elif ftype == Frame.ERROR:
            err = error_from_body(body)
            if err.retryable:
                self._finish(f, "retry", err)
            else:
                self._finish(f, "failed", err)
        elif ftype == Frame.COMMITTED:
            if body.get("ok"):
                self._finish(f, "committed", None)
            else:
                kind = body.get("kind", "")
                cls = ChecksumError if kind == "checksum" else RefusedError
                err = cls(f"receiver: {body.get('error', 'commit refused')}",
                          retryable=bool(body.get("retryable")))
                self._finish(f, "retry" if err.retryable else "failed", err)
        else:
            raise ProtocolError(f"unexpected {ftype.name} frame on control connection")

    def fail(self, exc: FStreamError, stated: bool = False) -> None:
        """The session failed with ``exc``: the first local failure (a broken data or control connection, a write
        that failed), unless the receiver states its reason (``stated``: an ERROR frame for the session), which
        replaces whatever local consequence of it was seen first."""
        with self._fail_lock:
            if self.error is None or (stated and not self.stated):
                self.error, self.stated = exc, stated
        self.failed.set()

    def failure(self, local: BaseException) -> BaseException:
        """Why the session failed, given what stopped it here (``local``): the reason the receiver stated, if it
        gave one, else ``local``. A receiver that ends a session (a block that failed authentication, a refused
        write, a session it no longer knows) says why on the control connection before it closes anything, but
        the sender may see the closed data connection, a failed write or a refused data connection first
        (issue 29: under load, a tampered block's session failed with a broken pipe). So unless its reason is in,
        the receiver is asked (a BYE: it answers after everything it sent before, its reason first) and the
        reader is given until the receiver has said everything: until the reader ends, or has waited
        ``PEER_SILENCE_S`` for a next frame (a path cut for real costs that much), or ``ANSWER_MAX_S``.
        A cancel is no failure: it is returned as it is, at once."""
        if isinstance(local, CancelledError) or not isinstance(local, Exception):
            return local
        if not self.stated:
            self._hear_out()
        return self.error if self.stated else local

    def _hear_out(self) -> None:
        """Ask the receiver to finish (BYE) and wait until it said everything it had to say (``failure``)."""
        if not self._reader.is_alive():
            return
        try:
            self.writer.send(Frame.BYE, {})
        except (FStreamError, OSError):
            pass  # the connection is gone: the reader ends with what it read
        asked = time.monotonic()
        while self._reader.is_alive() and not self.stated and time.monotonic() < asked + ANSWER_MAX_S:
            since = self._listening_since  # silent since we asked, or since its last frame if that came later
            if since is not None and time.monotonic() - max(since, asked) >= PEER_SILENCE_S:
                return  # the receiver is silent: nothing more is coming
            self._reader.join(0.05)

    def close(self, graceful: bool = True) -> list[InFlight]:
        """Close the connection; return the files whose outcome never arrived (their fds are closed)."""
        if graceful and not self.failed.is_set():
            try:
                self.writer.send(Frame.BYE, {})
                self.bye.wait(10)  # the receiver answers BYE once it handled every earlier frame
            except FStreamError:
                pass
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._reader.join(timeout=5)
        with self._lock:
            unfinished = list(self._files.values())
            self._files.clear()
        for f in unfinished:
            settle(f)
        return unfinished


