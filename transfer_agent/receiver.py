"""The receiving side: authenticated sessions, data streams written with pwrite, resumable parts, group commit.

Data-safety rules (DESIGN.md "Rules for never losing data"): a file appears under its final
name only after every byte arrived and the end-to-end checksum matched; until then it is
``.NAME.<job>.<attempt>.part`` beside it with a ``.meta`` sidecar holding the received byte
ranges. Commits are grouped: verify each file, flush the group's files together (concurrent
``fdatasync``), the renames, then one ``fsync`` per directory.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import queue
import socket
import ssl
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from transfer_agent import faultpoints, storage
from transfer_agent.auth import TLSConfig, server_handshake
from transfer_agent.checksum import ALGORITHMS, PrefixHasher, hash_fd
from transfer_agent.errors import FStreamError, NetworkError, ProtocolError, RefusedError
from transfer_agent.parts import PartIndex
from transfer_agent.paths import open_parent, safe_relpath, temp_name
from transfer_agent.protocol import ControlWriter, Frame, recv_frame
from transfer_agent.ranges import RangeSet, read_meta, write_meta

MAX_FILE_SIZE = 1 << 50
RESERVE_MIN = 8 << 20  # smaller files rely on the free-space check; a preallocation each is not worth it
PIPE_SIZE = 1 << 20
FREE_CHECK_MIN = 1 << 20  # larger files always re-read free space; smaller ones use the running estimate
HASH_AHEAD_MIN = 32 << 20  # files this large are hashed while they arrive
HASH_AHEAD_STEP = 16 << 20
HANDSHAKE_TIMEOUT = 15.0


@dataclass(eq=False)
class RecvFile:
    """One file being received in a session."""

    file_id: int
    relpath: str
    dir_fd: int
    base: str
    tmp: str
    size: int
    mtime_ns: int
    algo: str
    fd: int
    ranges: RangeSet
    session: "Session"
    lock: threading.Lock = field(default_factory=threading.Lock)
    expected_hash: str | None = None
    commit_requested: bool = False
    part_key: tuple[tuple[int, int], str] = ((0, 0), "")
    queued: bool = False
    done: bool = False
    failed: bool = False
    dirty: bool = False
    users: int = 0
    closing: bool = False
    meta_written: bool = False
    inflight: list[tuple[int, int]] = field(default_factory=list)
    hasher: PrefixHasher | None = None

    def acquire(self) -> int:
        """Borrow the fd for one I/O; -1 once the file is closing. Pair with ``unuse``."""
        with self.lock:
            if self.fd < 0 or self.closing:
                return -1
            self.users += 1
            return self.fd

    def unuse(self) -> None:
        with self.lock:
            self.users -= 1
            if self.closing and self.users == 0:
                self._close_now()

    def close(self) -> bool:
        """Close once nobody uses the fd any more (never under a concurrent pwrite). True the first time."""
        with self.lock:
            if self.closing:
                return False
            self.closing = True
            if self.users == 0:
                self._close_now()
            return True

    def _close_now(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            os.close(self.dir_fd)
            self.fd = self.dir_fd = -1

    def meta(self) -> dict[str, Any]:
        return {"path": self.relpath, "size": self.size, "mtime_ns": self.mtime_ns, "algo": self.algo,
                "job": self.session.job, "attempt": self.session.attempt, "ranges": self.ranges.ranges()}


def _pipe() -> tuple[int, int]:
    """A pipe for splice(2), enlarged so one call moves up to ``PIPE_SIZE`` bytes."""
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except (OSError, AttributeError):
        pass  # the default 64 KiB pipe still works, in more calls
    return r, w


class Session:
    """One sender's session: a control connection, its data connections, its open files."""

    def __init__(self, sid: str, job: str, attempt: int, control: ControlWriter, peer: str) -> None:
        self.id, self.job, self.attempt, self.control, self.peer = sid, job, attempt, control, peer
        self.files: dict[int, RecvFile] = {}
        self.deferred: set[int] = set()  # opened, final already present: waiting for SKIP or a replacing OPEN
        self.dirs: dict[str, tuple[int, tuple[int, int]]] = {}  # parent dirs walked (O_NOFOLLOW) this session
        self.free_estimate = 0
        self.data_socks: set[socket.socket] = set()
        self.data_threads: set[threading.Thread] = set()
        self.lock = threading.Lock()
        self.closed = False

    def reply(self, ftype: Frame, body: dict[str, Any], file_id: int = 0) -> None:
        try:
            self.control.send(ftype, body, file_id)
        except FStreamError:
            pass  # the sender is gone; its files stay resumable


class Receiver:
    """Accept authenticated sessions and write their files under ``root``.

    :param listen: (host, port) to bind; port 0 picks a free one (see ``port``).
    :param root: destination root directory; nothing is ever written outside it.
    :param secret: shared secret for the HMAC handshake.
    :param tls: certificates for mutual TLS.
    :param fsync: make commits durable (write → fsync → rename → fsync(dir)).
    :param flush_interval: how often received ranges are persisted for in-flight files.
    :param log: logger (default ``fstream.receiver``).
    """

    def __init__(self, *, listen: tuple[str, int] = ("127.0.0.1", 0), root: str, secret: bytes | None = None,
                 tls: TLSConfig | None = None, fsync: bool = True, flush_interval: float = 2.0,
                 log: logging.Logger | None = None) -> None:
        if secret is None and tls is None:
            raise FStreamError("receiver: refusing to run unauthenticated: give a shared secret "
                               "(--secret-file) or TLS certificates (--tls-cert/--tls-key/--tls-ca)")
        self.listen_addr = listen
        self.root = os.path.abspath(root)
        self.secret = secret
        self.tls = tls
        self.fsync = fsync
        self.flush_interval = flush_interval
        self.log = log or logging.getLogger("fstream.receiver")
        self._ssl_ctx = tls.server_context() if tls else None
        self._sock: socket.socket | None = None
        self._root_fd = -1
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._attempts: dict[str, int] = {}
        self._busy_parts: set[tuple[tuple[int, int], str]] = set()
        self._parts = PartIndex()
        self._commit_q: queue.Queue[RecvFile | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._sync_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fstream-fsync")
        self.stats = {"files_committed": 0, "bytes_received": 0, "sessions": 0, "errors": 0}

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "Receiver":
        os.makedirs(self.root, exist_ok=True)
        self._root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        host, port = self.listen_addr
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(256)
        self._sock = sock
        for target, name in ((self._accept_loop, "accept"), (self._commit_loop, "commit"),
                             (self._flush_loop, "flush")):
            t = threading.Thread(target=target, name=f"fstream-recv-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        self.log.info("listening on %s:%d, root %s", host, self.port, self.root)
        return self

    @property
    def port(self) -> int:
        assert self._sock is not None, "receiver not started"
        return self._sock.getsockname()[1]

    def stop(self) -> None:
        """Stop accepting, close every session (persisting ranges), finish queued commits."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        with self._lock:
            sessions = list(self._sessions.values())
        for s in sessions:
            self._close_session(s)
        self._commit_q.put(None)
        for t in self._threads:
            t.join(timeout=10)
        self._sync_pool.shutdown(wait=True)
        if self._root_fd >= 0:
            os.close(self._root_fd)
            self._root_fd = -1

    def __enter__(self) -> "Receiver":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def serve_forever(self) -> None:
        self._stop.wait()

    # -- connections ---------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, addr = self._sock.accept()
            except OSError:
                if self._stop.is_set():
                    return
                continue
            threading.Thread(target=self._handle, args=(conn, f"{addr[0]}:{addr[1]}"),
                             name=f"fstream-recv-conn-{addr[1]}", daemon=True).start()

    def _handle(self, conn: socket.socket, peer: str) -> None:
        session: Session | None = None
        role = "?"
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            conn.settimeout(HANDSHAKE_TIMEOUT)
            if self._ssl_ctx is not None:
                try:
                    conn = self._ssl_ctx.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError) as exc:
                    raise FStreamError(f"TLS handshake failed: {exc}") from None
            hello = server_handshake(conn, self.secret, tls=self._ssl_ctx is not None)
            role = str(hello.get("role", ""))
            writer = ControlWriter(conn)
            sid = str(hello.get("session", ""))
            job = str(hello.get("job", ""))
            try:
                attempt = int(hello.get("attempt", 1))
            except (TypeError, ValueError):
                raise ProtocolError("malformed HELLO: attempt is not an integer") from None
            if not sid or not job:
                raise ProtocolError("malformed HELLO: session and job are required")
            with self._lock:
                current = self._attempts.get(job, 0)
                if attempt < current:
                    msg = f"stale attempt {attempt} of job {job}: attempt {current} is current"
                    writer.send(Frame.ERROR, {"kind": "refused", "message": msg})
                    raise RefusedError(msg)
                self._attempts[job] = attempt
            conn.settimeout(None)
            if role == "control":
                session = Session(sid, job, attempt, writer, peer)
                with self._lock:
                    if sid in self._sessions:
                        raise ProtocolError(f"session {sid} already exists")
                    self._sessions[sid] = session
                    self.stats["sessions"] += 1
                writer.send(Frame.WELCOME, {"session": sid, "root_free": storage.free_bytes(self._root_fd)})
                self.log.info("session %s from %s: job %s attempt %d", sid[:8], peer, job, attempt)
                self._control_loop(session, conn)
            elif role == "data":
                with self._lock:
                    session = self._sessions.get(sid)
                if session is None or session.closed:
                    writer.send(Frame.ERROR, {"kind": "protocol", "message": f"unknown session {sid}"})
                    raise ProtocolError(f"data connection for unknown session {sid}")
                with session.lock:
                    session.data_socks.add(conn)
                    session.data_threads.add(threading.current_thread())
                writer.send(Frame.WELCOME, {"session": sid})
                data_session, session = session, None  # only the control connection closes a session
                try:
                    self._data_loop(data_session, conn)
                finally:
                    with data_session.lock:
                        data_session.data_socks.discard(conn)
                        data_session.data_threads.discard(threading.current_thread())
            else:
                raise ProtocolError(f"malformed HELLO: unknown role {role!r}")
        except NetworkError as exc:
            self.log.debug("%s connection from %s ended: %s", role, peer, exc)
        except FStreamError as exc:
            self.stats["errors"] += 1
            self.log.warning("%s connection from %s closed: %s", role, peer, exc)
        except Exception:  # noqa: BLE001 - one bad connection must not stop the receiver
            self.stats["errors"] += 1
            self.log.exception("%s connection from %s failed", role, peer)
        finally:
            try:
                conn.close()
            except OSError:
                pass
            if session is not None:
                self._close_session(session)

    # -- control -------------------------------------------------------------------------------
    def _control_loop(self, session: Session, conn: socket.socket) -> None:
        while not self._stop.is_set():
            ftype, fid, _off, _len, body = recv_frame(conn)
            body = body or {}
            if ftype == Frame.OPEN:
                try:
                    self._open(session, fid, body)
                except FStreamError as exc:
                    session.reply(Frame.ERROR, {"kind": exc.kind, "message": str(exc),
                                                "retryable": exc.retryable}, fid)
                except OSError as exc:
                    nospace = exc.errno in (errno.ENOSPC, errno.EDQUOT)
                    session.reply(Frame.ERROR, {"kind": "refused", "retryable": False,
                                                "message": f"{body.get('path')!r}: "
                                                           f"{'disk full' if nospace else exc.strerror}"}, fid)
            elif ftype == Frame.COMMIT:
                self._request_commit(session, fid, body)
            elif ftype in (Frame.ABORT, Frame.SKIP):
                session.deferred.discard(fid)
                f = session.files.pop(fid, None)
                if f is not None:
                    self._discard(f, remove=True)
            elif ftype == Frame.PING:
                session.reply(Frame.PONG, body)
            elif ftype == Frame.BYE:
                session.reply(Frame.BYE, {})  # everything before it was handled: the sender may go
                return
            else:
                raise ProtocolError(f"unexpected {ftype.name} frame on control connection")

    def _open(self, session: Session, fid: int, body: dict[str, Any]) -> None:
        if fid in session.files or (fid in session.deferred and not body.get("replace")):
            raise ProtocolError(f"file id {fid} opened twice")
        rel = safe_relpath(str(body.get("path", "")))
        size, mtime_ns = body.get("size"), body.get("mtime_ns", 0)
        algo = str(body.get("algo", "xxh3_128"))
        if not isinstance(size, int) or size < 0 or size > MAX_FILE_SIZE:
            raise RefusedError(f"{rel!r}: declared size {size!r} is not a valid file size")
        if algo not in ALGORITHMS:
            raise RefusedError(f"{rel!r}: checksum algorithm {algo!r} not supported")
        dir_fd, dkey, base = self._parent(session, rel)
        key = (dkey, base)
        with self._lock:
            if key in self._busy_parts:
                os.close(dir_fd)
                raise FStreamError(f"{rel!r}: busy: another session is receiving this file", retryable=True)
            self._busy_parts.add(key)
        try:
            existing_hash = None if body.get("replace") else self._existing_hash(dir_fd, base, rel, size, algo)
            if existing_hash is not None:
                # nothing is created or reserved until the sender says whether its copy differs
                os.close(dir_fd)
                with self._lock:
                    self._busy_parts.discard(key)
                session.deferred.add(fid)
                session.reply(Frame.OPEN_OK, {"missing": [[0, size]], "resumed": 0, "existing_hash": existing_hash},
                              fid)
                return
            session.deferred.discard(fid)
            ranges, tmp = self._take_over_part(session, dir_fd, dkey, base, rel, size, mtime_ns, algo)
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
                self._parts.add(dir_fd, base, tmp, key=dkey)
                try:
                    if size >= RESERVE_MIN:
                        storage.reserve(fd, size)
                except OSError:
                    os.close(fd)
                    self._remove_part(dir_fd, dkey, base, tmp)
                    raise
            else:
                fd = os.open(tmp, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            # the ranges sidecar is written by the first flush (or when the session ends): a small file
            # that commits within the flush interval never costs an extra file
            f = RecvFile(fid, rel, dir_fd, base, tmp, size, int(mtime_ns), algo, fd, ranges, session, part_key=key)
            f.dirty = True
            if size >= HASH_AHEAD_MIN:
                f.hasher = PrefixHasher(algo)
            f.meta_written = resumed_part  # a taken-over part brought its sidecar along
        except BaseException:
            os.close(dir_fd)
            with self._lock:
                self._busy_parts.discard(key)
            raise
        session.files[fid] = f
        session.reply(Frame.OPEN_OK, {"missing": f.ranges.missing(size), "resumed": ranges.total(),
                                      "existing_hash": existing_hash}, fid)

    def _parent(self, session: Session, rel: str) -> tuple[int, tuple[int, int], str]:
        """(own fd of the parent directory, its (dev, ino), basename), walking each directory once per session."""
        reldir, _, base = rel.rpartition("/")
        cached = session.dirs.get(reldir)
        if cached is None:
            dfd, _base = open_parent(self._root_fd, rel)
            st = os.fstat(dfd)
            cached = session.dirs[reldir] = (dfd, (st.st_dev, st.st_ino))
        return os.dup(cached[0]), cached[1], base

    def _existing_hash(self, dir_fd: int, base: str, rel: str, size: int, algo: str) -> str | None:
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
            return hash_fd(fd, size, algo)
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
            if meta.get("size") != size or meta.get("mtime_ns") != mtime_ns or meta.get("algo") != algo:
                self._remove_part(dir_fd, dkey, base, name)  # source changed since: the old part is useless
                continue
            new = temp_name(base, session.job, session.attempt)
            if name != new:
                os.rename(name, new, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                self._parts.remove(dkey, base, name)
                self._parts.add(dir_fd, base, new, key=dkey)
                write_meta(dir_fd, new + ".meta", {**meta, "job": session.job, "attempt": session.attempt})
                self._unlink_quiet(dir_fd, name + ".meta", part=False)
            ranges = RangeSet(tuple(r) for r in meta.get("ranges", []))
            self.log.info("resuming %s: %d of %d bytes already here", rel, ranges.total(), size)
            return ranges, new
        return RangeSet(), None

    @staticmethod
    def _unlink_quiet(dir_fd: int, name: str, part: bool = True) -> None:
        for n in ((name, name + ".meta", name + ".meta.tmp") if part else (name,)):
            try:
                os.unlink(n, dir_fd=dir_fd)
            except OSError:
                pass

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

    # -- data ----------------------------------------------------------------------------------
    def _data_loop(self, session: Session, conn: socket.socket) -> None:
        zero_copy = not isinstance(conn, ssl.SSLSocket) and hasattr(os, "splice")
        pipe = _pipe() if zero_copy else None
        try:
            while True:
                ftype, fid, off, length, _ = recv_frame(conn)
                if ftype == Frame.BYE:
                    return
                if ftype != Frame.DATA:
                    raise ProtocolError(f"unexpected {ftype.name} frame on a data connection")
                f = session.files.get(fid)
                if f is None:
                    raise ProtocolError(f"data for file id {fid}, which is not open in this session")
                if off + length > f.size:
                    raise ProtocolError(f"{f.relpath!r}: data block [{off}, {off + length}) beyond declared "
                                        f"size {f.size}")
                self._claim(f, off, length)
                try:
                    if pipe is not None:
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
                raise NetworkError(f"connection lost in a data block of {f.relpath!r}: {err}")
            raise ProtocolError(f"truncated frame: data block of {f.relpath!r} ended after {got} of {length} bytes")

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
                    raise NetworkError(f"connection lost in a data block of {f.relpath!r}: {err}")
                raise ProtocolError(f"truncated frame: data block of {f.relpath!r} ended after {got} of "
                                    f"{length} bytes")
            got += k
        self._write(f, view, off)

    def _write(self, f: RecvFile, view: memoryview, off: int) -> None:
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
        self._written(f, off, n)

    def _write_failed(self, f: RecvFile, exc: OSError) -> None:
        """A write into the part failed (disk full, I/O error): refuse the file once, terminally, and
        remove its part at once so the space it held serves the session's other files. The data
        connections stay up: later blocks of the file are read and dropped (issue 8, disk-full row)."""
        with f.lock:
            first = not f.failed
            f.failed = True
        if not first:
            return
        reason = "disk full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else exc.strerror
        self.log.warning("%s: write failed (%s); part removed", f.relpath, reason)
        f.session.reply(Frame.ERROR, {"kind": "refused", "retryable": False,
                                      "message": f"{f.relpath!r}: write failed: {reason}"}, f.file_id)
        self._discard(f, remove=True)

    def _written(self, f: RecvFile, off: int, n: int) -> None:
        """Record ``n`` bytes at ``off`` as present; queue the commit when the file is whole."""
        self.stats["bytes_received"] += n
        with f.lock:
            f.ranges.add(off, off + n)
            f.dirty = True
            ready = f.commit_requested and not f.queued and f.ranges.covers(f.size)
            if ready:
                f.queued = True
        if ready:
            self._commit_q.put(f)

    # -- commit --------------------------------------------------------------------------------
    def _commit_loop(self) -> None:
        while True:
            first = self._commit_q.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < 1024:
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
                for f in batch:
                    if not f.done:
                        f.session.reply(Frame.COMMITTED, {"ok": False, "retryable": True,
                                                          "error": f"{f.relpath!r}: commit failed"}, f.file_id)

    def _commit_batch(self, batch: list[RecvFile]) -> None:
        good: list[RecvFile] = []
        for f in batch:
            with self._lock:
                current = self._attempts.get(f.session.job, 0)
            if f.session.attempt < current:
                f.session.reply(Frame.COMMITTED, {"ok": False, "retryable": False, "kind": "refused",
                                                  "error": f"{f.relpath!r}: stale attempt {f.session.attempt}, "
                                                           f"attempt {current} is current"}, f.file_id)
                self._discard(f, remove=False)
                continue
            if f.expected_hash is None:
                actual = None
            elif f.hasher is not None:
                actual = f.hasher.finish(f.fd, f.size)
            else:
                actual = hash_fd(f.fd, f.size, f.algo)
            if actual != f.expected_hash:
                self.log.warning("checksum mismatch for %s: expected %s, got %s", f.relpath, f.expected_hash, actual)
                f.session.reply(Frame.COMMITTED, {"ok": False, "retryable": True, "kind": "checksum",
                                                  "error": f"{f.relpath!r}: checksum mismatch "
                                                           f"(sent {f.expected_hash}, received {actual})"},
                                f.file_id)
                f.session.files.pop(f.file_id, None)
                self._discard(f, remove=True)
                continue
            good.append(f)
        if not good:
            return
        if self.fsync:
            storage.sync_files([f.fd for f in good], self._sync_pool)
        dirs: dict[tuple[int, int], int] = {}
        faultpoints.hit("commit.before_rename")
        for f in good:
            dkey = f.part_key[0]
            os.rename(f.tmp, f.base, src_dir_fd=f.dir_fd, dst_dir_fd=f.dir_fd)
            faultpoints.hit("commit.between_renames")
            self._parts.remove(dkey, f.base, f.tmp)
            if f.meta_written:
                self._unlink_quiet(f.dir_fd, f.tmp + ".meta", part=False)
            dirs.setdefault(dkey, f.dir_fd)
        if self.fsync:
            for dfd in dirs.values():
                os.fsync(dfd)
        for f in good:
            f.done = True
            self.stats["files_committed"] += 1
            f.session.files.pop(f.file_id, None)
            f.session.reply(Frame.COMMITTED, {"ok": True, "hash": f.expected_hash}, f.file_id)
            self._release(f)

    # -- persistence of ranges -----------------------------------------------------------------
    def _flush_loop(self) -> None:
        while not self._stop.wait(self.flush_interval):
            with self._lock:
                sessions = list(self._sessions.values())
            for s in sessions:
                for f in list(s.files.values()):
                    self._flush(f)

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
                    return  # being committed (the committer removes the sidecar) or failed (part removed)
                write_meta(f.dir_fd, f.tmp + ".meta", meta)
                f.meta_written = True
        except OSError as exc:
            self.log.warning("could not persist ranges of %s: %s", f.relpath, exc)
        finally:
            f.unuse()

    def _discard(self, f: RecvFile, remove: bool) -> None:
        if remove:
            self._remove_part(f.dir_fd, f.part_key[0], f.base, f.tmp)
        self._release(f)

    def _remove_part(self, dir_fd: int, dkey: tuple[int, int], base: str, name: str) -> None:
        self._unlink_quiet(dir_fd, name)
        self._parts.remove(dkey, base, name)

    def _release(self, f: RecvFile) -> None:
        if f.close():
            with self._lock:
                self._busy_parts.discard(f.part_key)

    def _close_session(self, session: Session) -> None:
        with session.lock:
            if session.closed:
                return
            session.closed = True
            socks, threads = list(session.data_socks), list(session.data_threads)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        me = threading.current_thread()
        for t in threads:
            if t is not me:
                t.join(timeout=10)
        for f in list(session.files.values()):
            if f.queued and not f.done:
                continue  # the committer finishes it and releases it
            self._flush(f)
            session.files.pop(f.file_id, None)
            self._release(f)
        for dfd, _key in session.dirs.values():
            os.close(dfd)
        session.dirs.clear()
        with self._lock:
            self._sessions.pop(session.id, None)
        self.log.info("session %s closed", session.id[:8])
