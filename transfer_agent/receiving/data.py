"""The data streams: blocks taken in once each, spliced or received and pwritten, sealed blocks opened first.

A data connection carries DATA blocks of the session's open files. Every byte is written once (a block that
overlaps bytes received or in flight is refused), plain TCP moves blocks socket → pipe → file with splice(2), TLS
and hosts without splice receive into memory and pwrite, and sealed blocks (``send --encrypt``) are opened before
anything is written. Blocks of files the session gave up (aborted, skipped, failed) are read and dropped. A file
whose every byte arrived after its COMMIT is handed to the commit path.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import ssl

from transfer_agent.errors import FStreamError, NetworkError, ProtocolError
from transfer_agent.receiving import admission
from transfer_agent.receiving.commit import GroupCommit
from transfer_agent.receiving.state import RecvFile, Session
from transfer_agent.storage import gil_meter
from transfer_agent.wire.protocol import VERSION, Frame, pack_header, recv_exact, recv_exact_into, recv_frame
from transfer_agent.wire.secure import TAG_BYTES, DataSealer, SessionKeys

PIPE_SIZE = 1 << 20
HASH_AHEAD_STEP = 16 << 20  # a file hashed while it arrives is hashed on in steps this large
DROP_CHUNK = 1 << 20
NATIVE_CALL = 4 << 20  # bytes of a block a native call takes in at most (it holds the part's fd meanwhile)
#: how a hashed block of a plain TCP connection is taken in: "recv" into memory, hashed there and pwritten, or
#: "splice" socket → pipe → file and each chunk read back for the hash (``fstream bench micro --only hashed-recv``)
HASHED_VIA = "splice"


def _pipe() -> tuple[int, int] | None:
    """A pipe for splice(2), enlarged so one call moves up to ``PIPE_SIZE`` bytes; None when the process is out of
    descriptors (the connection then receives into memory)."""
    try:
        r, w = os.pipe()
    except OSError as exc:
        if admission.transient(exc):
            return None  # out of descriptors (issue 43: this refused every file as terminal at ulimit -n 1024)
        raise
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except (OSError, AttributeError):
        pass  # the default 64 KiB pipe still works, in more calls
    return r, w


class DataStreams(GroupCommit):
    """Take in the data connections' blocks (the layer of ``Receiver`` above ``GroupCommit``)."""

    def _data_loop(self, session: Session, conn: socket.socket, keys: SessionKeys | None = None,
                   version: int = VERSION) -> None:
        """Take in one data connection's blocks; ``version``: the protocol its HELLO stated (issue 30: its frames
        carry it, and a sealed block's associated data is its header as sent)."""
        sealer = DataSealer(keys) if keys is not None and keys.encrypt else None
        zero_copy = sealer is None and not isinstance(conn, ssl.SSLSocket) and hasattr(os, "splice")
        pipe = _pipe() if zero_copy else None  # None also when out of descriptors: blocks go through memory
        try:
            while True:
                ftype, fid, off, length, _ = recv_frame(conn, versions=(version,))
                if ftype == Frame.BYE:
                    return
                if ftype != Frame.DATA:
                    raise ProtocolError(f"unexpected {ftype.name} frame on a data connection")
                f = session.files.get(fid)
                if f is None:
                    if not session.is_settled(fid):
                        raise ProtocolError(f"data for file id {fid}, which is not open in this session")
                    self._drop_block(session, conn, sealer, fid, off, length, version)
                    continue
                wire = length
                if sealer is not None:
                    length -= TAG_BYTES  # the header counts the tag
                    if length <= 0:
                        raise ProtocolError(f"{f.relpath!r}: sealed data block of {wire} bytes is too short")
                if off + length > f.size:
                    raise ProtocolError(f"{f.relpath!r}: data block [{off}, {off + length}) beyond declared "
                                        f"size {f.size}")
                self._claim(f, off, length)
                try:
                    if sealer is not None:
                        self._open_sealed(f, conn, sealer, off, length, wire, version)
                    elif f.tree is not None and not isinstance(conn, ssl.SSLSocket):
                        self._hashed_block(f, conn, pipe, off, length)
                    elif pipe is not None:
                        self._splice_block(f, conn, pipe, off, length)
                    else:
                        self._recv_block(f, conn, off, length)
                finally:
                    with f.lock:
                        f.inflight.remove((off, off + length))
                self._hash_ahead(f)
        finally:
            if pipe is not None:
                os.close(pipe[0])
                os.close(pipe[1])

    def _drop_block(self, session: Session, conn: socket.socket, sealer: DataSealer | None, fid: int, off: int,
                    wire: int, version: int = VERSION) -> None:
        """Read and drop a block of a file this session aborted, skipped or failed: the sender sent it before it
        gave the file up (data and control travel on different connections), so it is no reason to close the
        data connection (issue 8, fault row "source modified mid-send"). A sealed block is still opened, so the
        connection's nonce counter stays in step and a forged block is still detected."""
        self.stats["blocks_dropped"] += 1
        self.log.debug("session %s: dropping a %d-byte block of file id %d, given up in this session",
                       session.id[:8], wire, fid)
        if sealer is not None:
            sealed = recv_exact(conn, wire)
            sealer.open(pack_header(Frame.DATA, fid, off, wire, version), sealed,
                        f"data block at {off} of file id {fid}")
            return
        left = wire
        while left > 0:
            try:
                chunk = conn.recv(min(DROP_CHUNK, left))
            except OSError as exc:
                raise NetworkError(f"connection lost in a dropped data block of file id {fid}: {exc}") from None
            if not chunk:
                raise ProtocolError(f"truncated frame: dropped data block of file id {fid} ended early")
            left -= len(chunk)

    def _open_sealed(self, f: RecvFile, conn: socket.socket, sealer: DataSealer, off: int, length: int,
                     wire: int, version: int = VERSION) -> None:
        """Receive a sealed block into the connection's buffer, open it (AAD = its header) into the other and only
        then write it. A block that fails authentication is never written; the sender is told on the control
        connection (its session restarts and resumes from the ranges received) and this data connection closes."""
        sealed, plain = sealer.buffers.views(wire, length)
        try:
            recv_exact_into(conn, sealed)
        except (NetworkError, ProtocolError) as exc:
            raise self._lost_mid_block(f, exc) from None
        try:
            sealer.open_into(pack_header(Frame.DATA, f.file_id, off, wire, version), sealed,
                             f"data block [{off}, {off + length}) of {f.relpath!r}", plain)
        except ProtocolError as exc:
            f.session.reply(Frame.ERROR, {"kind": "checksum", "retryable": True,
                                          "message": f"{exc}; nothing of it was written, the session resumes"})
            raise
        self._write(f, plain, off, hashed=True)

    @staticmethod
    def _lost_mid_block(f: RecvFile, exc: FStreamError) -> FStreamError:
        """A data connection ended inside a block (cut in the path, or the sender died): tell the sender on the
        control connection, so its session restarts and resumes now rather than when its stall timer fires
        (its blocks may all sit in socket buffers, so its streams see nothing). Returns ``exc`` to raise."""
        f.session.reply(Frame.ERROR, {"kind": "network", "retryable": True,
                                      "message": f"{exc}; the bytes received are kept, the session resumes"})
        return exc

    def _claim(self, f: RecvFile, off: int, length: int) -> None:
        """Refuse a block that overlaps bytes already received or in flight: every byte is written once,
        so what the checksum read can never change afterwards."""
        end = off + length
        with f.lock:
            if f.ranges.overlaps(off, end) or any(a < end and off < b for a, b in f.inflight):
                raise ProtocolError(f"{f.relpath!r}: data block [{off}, {end}) overlaps bytes already received")
            f.inflight.append((off, end))

    def _hash_ahead(self, f: RecvFile) -> None:
        """Hash the contiguous prefix of a large file while the rest arrives."""
        if f.hasher is None or f.expected_hash is None and f.commit_requested:
            return
        with f.lock:
            upto = f.ranges.prefix()
        if upto - f.hasher.done_upto < HASH_AHEAD_STEP:
            return
        fd = f.acquire()
        if fd < 0:
            return
        try:
            f.hasher.advance(fd, upto)
        except (OSError, EOFError):
            pass  # the commit hashes from scratch if it must
        finally:
            f.unuse()

    def _splice_block(self, f: RecvFile, conn: socket.socket, pipe: tuple[int, int], off: int, length: int) -> None:
        """Move one block socket → pipe → file inside the kernel (no copy through Python).

        The part's fd is borrowed per chunk, not for the whole block: a stream waiting for a slow
        sender never keeps a failed file's part (and the disk space it holds) open. Chunks of a
        file that failed or closed meanwhile are read and dropped.
        """
        r, w = pipe
        got, err = 0, None
        while got < length:
            try:
                n = os.splice(conn.fileno(), w, min(PIPE_SIZE, length - got))
            except OSError as exc:
                n, err = 0, exc
            if n == 0:
                break
            m = 0
            fd = f.acquire()
            if fd >= 0 and not (f.failed or f.done):
                try:
                    while m < n:
                        m += os.splice(r, fd, n - m, offset_dst=off + got + m)
                except OSError as exc:
                    self._write_failed(f, exc)
                finally:
                    f.unuse()
            elif fd >= 0:
                f.unuse()
            if m == n:
                self._written(f, off + got, n)
            while m < n:  # nothing to write into (or the write failed): drop what is in the pipe
                m += len(os.read(r, n - m))
            got += n
        if got < length:
            if err is not None:
                raise self._lost_mid_block(f, NetworkError(f"connection lost in a data block of {f.relpath!r}: {err}"))
            raise self._lost_mid_block(f, ProtocolError(f"truncated frame: data block of {f.relpath!r} ended after "
                                                        f"{got} of {length} bytes"))

    def _recv_block(self, f: RecvFile, conn: socket.socket, off: int, length: int) -> None:
        """Receive one block into memory, then pwrite it (TLS, or where splice is missing)."""
        flags = 0 if isinstance(conn, ssl.SSLSocket) else socket.MSG_WAITALL
        view = memoryview(bytearray(length))
        got = 0
        while got < length:
            try:
                k = conn.recv_into(view[got:], length - got, flags)
            except OSError as exc:
                k, err = 0, exc
            else:
                err = None
            if k == 0:
                self._write(f, view[:got], off)  # keep what arrived: the file stays resumable
                if err is not None:
                    raise self._lost_mid_block(f, NetworkError(f"connection lost in a data block of {f.relpath!r}: "
                                                               f"{err}"))
                raise self._lost_mid_block(f, ProtocolError(f"truncated frame: data block of {f.relpath!r} ended "
                                                            f"after {got} of {length} bytes"))
            got += k
        self._write(f, view, off, hashed=True)

    def _write(self, f: RecvFile, view: memoryview, off: int, hashed: bool = False) -> None:
        """pwrite a block received into memory; ``hashed``: also hash it into the file's tree (issue 29)."""
        n = len(view)
        if n == 0 or f.failed or f.done:
            return
        fd = f.acquire()
        if fd < 0:
            return
        pos = 0
        try:
            while pos < n:
                pos += os.pwrite(fd, view[pos:], off + pos)
        except OSError as exc:
            self._write_failed(f, exc)
            return
        finally:
            f.unuse()
        if hashed and f.tree is not None:
            block = f.tree.block(off, n)
            block.feed(view)
            f.tree.add(block.take())
        self._written(f, off, n)

    def _hashed_block(self, f: RecvFile, conn: socket.socket, pipe: tuple[int, int] | None, off: int,
                      length: int) -> None:
        """Take in one block of a file hashed as it arrives (``f.tree``, issue 29): native code moves it socket →
        pipe → file with splice(2) and hashes each chunk right after it landed (read back while it is still in
        the CPU's cache), or, where splice is missing, receives it into memory, writes and hashes it; either
        way ``NATIVE_CALL`` bytes per call with the GIL released.

        Like ``_splice_block`` the part's fd is borrowed per call, and a file that failed or closed meanwhile
        has the rest of its block read and dropped. A chunk not written stops the block's hashing (the commit
        reads the rest back).
        """
        block = f.tree.block(off, length)
        sock, got, rerr = conn.fileno(), 0, 0
        while got < length and not rerr:
            fd = f.acquire()
            if fd >= 0 and (f.failed or f.done):
                f.unuse()
                fd = -1
            t = gil_meter.clock()
            try:
                want = min(NATIVE_CALL, length - got)
                if pipe is not None and HASHED_VIA == "splice":
                    n, written, werr, rerr = block.splice(sock, pipe[0], pipe[1], fd, want)
                else:
                    n, written, werr, rerr = block.pump(sock, fd, want)
            finally:
                gil_meter.add(gil_meter.clock() - t)
                if fd >= 0:
                    f.unuse()
            f.tree.add(block.take())
            if werr:
                self._write_failed(f, OSError(werr, os.strerror(werr)))
            if written:
                self._written(f, off + got, written)
            got += n
        if got < length:
            if rerr > 0:
                raise self._lost_mid_block(f, NetworkError(f"connection lost in a data block of {f.relpath!r}: "
                                                           f"{os.strerror(rerr)}"))
            raise self._lost_mid_block(f, ProtocolError(f"truncated frame: data block of {f.relpath!r} ended after "
                                                        f"{got} of {length} bytes"))

    def _write_failed(self, f: RecvFile, exc: OSError) -> str:
        """A write into ``f`` failed (disk full, I/O error): the first time, remove the partial file and release
        it, then answer (terminal). Later blocks of the file are consumed and dropped. Returns the reason."""
        reason = "disk full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else (exc.strerror or str(exc))
        passing = admission.transient(exc)  # out of memory for now (issue 43): the part is kept, the file retried
        with f.lock:
            first, f.failed = not f.failed, True
        if first:
            self.stats["files_write_failed"] += 1
            self.log.warning("%s: write failed (%s); part %s", f.relpath, reason, "kept" if passing else "removed")
            self._discard(f, remove=not passing)  # released before the answer (issue 8, defect 6)
            f.session.reply(Frame.ERROR, {"kind": "refused", "retryable": passing,
                                          "message": f"{f.relpath!r}: write failed: {reason}"}, f.file_id)
        return reason

    def _written(self, f: RecvFile, off: int, n: int) -> None:
        """Record ``n`` bytes at ``off`` as present; queue the commit when the file is whole."""
        self.stats["bytes_received"] += n
        with f.lock:
            f.ranges.add(off, off + n)
            f.dirty = True
            ready = f.commit_requested and not f.queued and f.ranges.covers(f.size)
            if ready:
                f.queued = True
            f.unkicked += n
            kick = not ready and self._writeback.due(f.unkicked)
            if kick:
                f.unkicked = 0
        if kick:
            self._writeback.start_file(f)
        if ready:
            self._commit_q.put(f)
