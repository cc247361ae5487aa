"""The receiving side: authenticated sessions, data streams written with pwrite, resumable parts, group commit.

Data-safety rules (DESIGN.md "Rules for never losing data"): a file appears under its final
name only after every byte arrived and the end-to-end checksum matched; until then it is
``.NAME.<job>.<attempt>.part`` beside it with a ``.meta`` sidecar holding the received byte
ranges. Commits are grouped: verify each file, flush the group's files together (concurrent
``fdatasync``), the renames, then one ``fsync`` per directory.

Security (issue 8; what each mode protects against: ``transfer_agent.wire.secure``): with a shared
secret every control frame is authenticated (``ControlLink``), OPENs must name a keyed digest
(``blake3-keyed``, hashed with the control connection's digest key, also for parts of earlier
sessions, which are read back from disk), and sealed data blocks are opened before anything is
written. ``require_encryption`` refuses connections that do not seal. A plaintext client
against a TLS receiver is told at once that TLS is required (terminal), not reset.
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
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from transfer_agent import faultpoints
from transfer_agent.storage import durable as storage
from transfer_agent.wire.auth import TLSConfig, server_handshake
from transfer_agent.storage.checksum import ALGORITHMS, KEYED, PrefixHasher, hash_fd
from transfer_agent.errors import AuthError, FStreamError, NetworkError, ProtocolError, RefusedError
from transfer_agent.storage.parts import PartIndex, sweep_dir, sweep_parts
from transfer_agent.storage.paths import open_parent, safe_relpath, stem_of, temp_name
from transfer_agent.wire.protocol import (MAGIC, PRE_AUTH_MAX_CONTROL, ControlWriter, Frame, pack_header, recv_exact,
                                     recv_frame)
from transfer_agent.storage.ranges import RangeSet, read_meta, write_meta
from transfer_agent.wire.secure import TAG_BYTES, ControlLink, DataSealer, SessionKeys
from transfer_agent.wire.watchdog import Deadlines, PreAuthLimits

MAX_FILE_SIZE = 1 << 50
RESERVE_MIN = 8 << 20  # smaller files rely on the free-space check; a preallocation each is not worth it
PIPE_SIZE = 1 << 20
FREE_CHECK_MIN = 1 << 20  # larger files always re-read free space; smaller ones use the running estimate
HASH_AHEAD_MIN = 32 << 20  # files this large are hashed while they arrive
HASH_AHEAD_STEP = 16 << 20
HANDSHAKE_TIMEOUT = 10.0  # total, from accept to authenticated (issue 8, defect 3)
MAX_UNAUTH = 64  # unauthenticated connections held at once
MAX_UNAUTH_PER_ADDR = 16  # ... from one source address
ACCEPT_BACKOFF_MAX = 1.0  # seconds between accept attempts while out of file descriptors
PART_MAX_AGE = 7 * 86400.0  # orphaned parts untouched this long are removed by the sweep
SWEEP_INTERVAL = 3600.0
FENCE_WAIT = 5.0  # how long an OPEN waits for a fenced stale holder to release the file
SETTLED_MAX = 4096  # file ids a session remembers as aborted/skipped/failed, so their late blocks are dropped
DROP_CHUNK = 1 << 20
KEEPALIVE = (30, 10, 3)  # idle s, interval s, probes: a vanished peer (host down, FIN lost) is noticed in ~1 min


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


def _connected(sock: socket.socket | None) -> bool:
    """False when the peer of ``sock`` is gone (closed, reset, or it sent FIN), per the kernel's TCP state."""
    if sock is None:
        return True  # not registered yet: it is being set up right now
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    except (OSError, AttributeError, ValueError):
        return False
    return info[0] == 1  # TCP_ESTABLISHED


def _tune_keepalive(sock: socket.socket) -> None:
    """Probe an idle connection after ``KEEPALIVE`` (Linux defaults wait two hours): the session of a sender
    whose host vanished is closed, and its files released (fenced as stale), within about a minute."""
    for opt, value in zip(("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT"), KEEPALIVE):
        if hasattr(socket, opt):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
            except OSError:
                pass


def _shutdown(sock: socket.socket | None) -> None:
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError):
            pass


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

    def __init__(self, sid: str, job: str, attempt: int, control: ControlLink | ControlWriter, peer: str,
                 keys: SessionKeys | None = None) -> None:
        self.id, self.job, self.attempt, self.control, self.peer = sid, job, attempt, control, peer
        self.keys = keys  # the control connection's keys (None: TLS only)
        self.files: dict[int, RecvFile] = {}
        self.deferred: set[int] = set()  # opened, final already present: waiting for SKIP or a replacing OPEN
        # ids of files this session opened and then aborted, skipped or failed (the newest SETTLED_MAX): blocks
        # of them already on their way when the sender gave up are read and dropped, not a protocol error
        self.settled: OrderedDict[int, None] = OrderedDict()
        self.dirs: dict[str, tuple[int, tuple[int, int]]] = {}  # parent dirs walked (O_NOFOLLOW) this session
        self.free_estimate = 0
        self.data_socks: set[socket.socket] = set()
        self.data_threads: set[threading.Thread] = set()
        self.lock = threading.Lock()
        self.closed = False
        self.sock: socket.socket | None = None  # the control connection (fencing checks and shuts it)

    def settle(self, fid: int) -> None:
        """Remember that file ``fid`` was opened and is given up (aborted, skipped, failed) in this session."""
        with self.lock:
            self.settled[fid] = None
            self.settled.move_to_end(fid)
            while len(self.settled) > SETTLED_MAX:
                self.settled.popitem(last=False)

    def is_settled(self, fid: int) -> bool:
        with self.lock:
            return fid in self.settled

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
    :param require_encryption: refuse connections that do not seal their frames (``send --encrypt``);
        TLS connections count as encrypted.
    :param fsync: make commits durable (write → fsync → rename → fsync(dir)).
    :param flush_interval: how often received ranges are persisted for in-flight files.
    :param log: logger (default ``fstream.receiver``).
    :param handshake_timeout: total seconds a connection may take from accept to authenticated.
    :param max_unauth: unauthenticated connections held at once; more are closed at accept.
    :param max_unauth_per_addr: the same, per source address.
    :param part_max_age: orphaned ``.part``/``.meta`` files untouched this many seconds are removed
        by the sweep (at start and every ``sweep_interval``); None disables the sweep.
    """

    def __init__(self, *, listen: tuple[str, int] = ("127.0.0.1", 0), root: str, secret: bytes | None = None,
                 tls: TLSConfig | None = None, fsync: bool = True, flush_interval: float = 2.0,
                 log: logging.Logger | None = None, handshake_timeout: float = HANDSHAKE_TIMEOUT,
                 max_unauth: int = MAX_UNAUTH, max_unauth_per_addr: int = MAX_UNAUTH_PER_ADDR,
                 part_max_age: float | None = PART_MAX_AGE, sweep_interval: float = SWEEP_INTERVAL,
                 require_encryption: bool = False) -> None:
        if secret is None and tls is None:
            raise FStreamError("receiver: refusing to run unauthenticated: give a shared secret "
                               "(--secret-file) or TLS certificates (--tls-cert/--tls-key/--tls-ca)")
        self.listen_addr = listen
        self.root = os.path.abspath(root)
        self.secret = secret
        self.tls = tls
        self.require_encryption = require_encryption
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
        self._busy_parts: dict[tuple[tuple[int, int], str], Session] = {}  # part key -> the session holding it
        self._parts = PartIndex()
        self._written_dirs: dict[tuple[int, int], str] = {}  # (dev, ino) -> relative path: what the sweep revisits
        self.swept = threading.Event()  # set once the sweep at start finished
        self._commit_q: queue.Queue[RecvFile | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._sync_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fstream-fsync")
        self.stats = {"files_committed": 0, "bytes_received": 0, "sessions": 0, "errors": 0, "fenced": 0,
                      "blocks_dropped": 0}
        self.handshake_timeout = handshake_timeout
        self.part_max_age = part_max_age
        self.sweep_interval = sweep_interval
        self._preauth = PreAuthLimits(max_unauth, max_unauth_per_addr)
        self._deadlines: Deadlines | None = None
        self._released = threading.Condition(self._lock)  # notified whenever a busy part is released (see start)

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
        self._released = threading.Condition(self._lock)  # bound to the final _lock (subclasses may replace it)
        self._deadlines = Deadlines()
        for target, name in ((self._accept_loop, "accept"), (self._commit_loop, "commit"),
                             (self._flush_loop, "flush")):
            t = threading.Thread(target=target, name=f"fstream-recv-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        threading.Thread(target=self._sweep_at_start, name="fstream-recv-sweep", daemon=True).start()
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
        if self._deadlines is not None:
            self._deadlines.stop()
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
        """Accept connections; over the pre-auth caps close them at once (no thread); out of file
        descriptors (EMFILE/ENFILE), back off exponentially instead of spinning, logging once per episode."""
        assert self._sock is not None and self._deadlines is not None
        backoff = 0.0
        while not self._stop.is_set():
            try:
                conn, addr = self._sock.accept()
            except OSError as exc:
                if self._stop.is_set():
                    return
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if backoff == 0.0:
                        self.stats["errors"] += 1
                        self.log.warning("cannot accept connections: %s; backing off until descriptors free up",
                                         exc.strerror)
                    backoff = min(ACCEPT_BACKOFF_MAX, backoff * 2 if backoff else 0.01)
                    self._stop.wait(backoff)
                continue
            if backoff:
                backoff = 0.0
                self.log.warning("accepting connections again")
            ip = str(addr[0])
            token = self._deadlines.add(conn.fileno(), self.handshake_timeout)
            admitted, victim = self._preauth.admit(ip, token)
            if victim is not None:
                self._deadlines.expire(victim)  # the busiest address gives up its oldest connection
            if not admitted:
                self._deadlines.cancel(token)
                self.log.debug("connection from %s:%s closed: too many unauthenticated connections", ip, addr[1])
                conn.close()
                continue
            try:
                threading.Thread(target=self._handle, args=(conn, f"{ip}:{addr[1]}", ip, token),
                                 name=f"fstream-recv-conn-{addr[1]}", daemon=True).start()
            except RuntimeError:  # no thread to be had: drop this one connection, keep accepting
                self._deadlines.cancel(token)
                self._preauth.release(ip, token)
                conn.close()

    def _handle(self, conn: socket.socket, peer: str, ip: str = "", token: int = 0) -> None:
        session: Session | None = None
        role = "?"
        preauth = True

        def authenticated() -> None:
            nonlocal preauth
            if preauth:
                preauth = False
                if self._deadlines is not None:
                    self._deadlines.cancel(token)
                self._preauth.release(ip, token)

        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            _tune_keepalive(conn)
            conn.settimeout(self.handshake_timeout)
            if self._ssl_ctx is not None:
                self._refuse_plaintext(conn)
                try:
                    conn = self._ssl_ctx.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError) as exc:
                    raise FStreamError(f"TLS handshake failed: {exc}") from None
            hs = server_handshake(conn, self.secret, tls=self._ssl_ctx is not None,
                                  require_encryption=self.require_encryption, peer=peer)
            hello = hs.peer
            authenticated()
            role = str(hello.get("role", ""))
            writer = hs.link
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
                new = Session(sid, job, attempt, writer, peer, keys=hs.keys)
                with self._lock:
                    if sid in self._sessions:  # not ours: refusing it must not tear the real one down
                        raise ProtocolError(f"session {sid} already exists")
                    self._sessions[sid] = new
                    self.stats["sessions"] += 1
                session = new  # registered: from here on this connection owns it and closes it
                session.sock = conn
                writer.send(Frame.WELCOME, {"session": sid, "root_free": storage.free_bytes(self._root_fd)})
                self.log.info("session %s from %s: job %s attempt %d", sid[:8], peer, job, attempt)
                self._control_loop(session, writer)
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
                    self._data_loop(data_session, conn, hs.keys)
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
            if preauth and not isinstance(exc, AuthError):  # junk from an unauthenticated peer: no log flood
                self.log.debug("connection from %s closed before authentication: %s", peer, exc)
            else:
                self.log.warning("%s connection from %s closed: %s", role, peer, exc)
        except Exception as exc:  # noqa: BLE001 - one bad connection must not stop the receiver
            self.stats["errors"] += 1
            if preauth:
                self.log.debug("connection from %s failed before authentication: %r", peer, exc, exc_info=True)
            else:
                self.log.exception("%s connection from %s failed", role, peer)
        finally:
            authenticated()  # cancels the deadline before the fd number can be reused
            try:
                conn.close()
            except OSError:
                pass
            if session is not None:
                self._close_session(session)

    def _refuse_plaintext(self, conn: socket.socket) -> None:
        """Before the TLS handshake, peek: a plaintext FStream HELLO gets a plaintext, terminal auth ERROR
        ("the receiver requires TLS") instead of a TLS failure the client would see as a reset and retry."""
        try:
            head = conn.recv(len(MAGIC), socket.MSG_PEEK | socket.MSG_WAITALL)
        except OSError:
            return  # the TLS handshake reports it
        if head != MAGIC:
            return
        try:
            recv_frame(conn, PRE_AUTH_MAX_CONTROL)  # consume the HELLO, so closing sends FIN, not RST
        except FStreamError:
            pass
        msg = "the receiver requires TLS: this connection is plaintext (pass --tls-cert/--tls-key/--tls-ca)"
        ControlWriter(conn).send(Frame.ERROR, {"kind": "auth", "message": msg, "retryable": False})
        try:
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        raise AuthError(f"plaintext connection refused: {msg}")

    # -- control -------------------------------------------------------------------------------
    def _control_loop(self, session: Session, link: ControlLink) -> None:
        while not self._stop.is_set():
            try:
                ftype, fid, body = link.recv()
            except ProtocolError as exc:  # tell the sender why its session ends (authenticated), then close
                session.reply(Frame.ERROR, {"kind": exc.kind, "message": str(exc), "retryable": False})
                raise
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
                    session.settle(fid)  # its blocks may still be on their way: they are dropped
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
        rel, size, mtime_ns, algo = self._validate_open(body)
        digest_key = self._digest_key(session, algo)
        if session.keys is not None and digest_key is None:
            raise RefusedError(f"{rel!r}: checksum algorithm {algo!r} is not keyed; this receiver has a shared "
                               f"secret and accepts only {', '.join(KEYED)} (an unkeyed digest can be rewritten "
                               "in transit together with the data)")
        dir_fd, dkey, base = self._parent(session, rel)
        key = (dkey, base)
        try:
            self._claim_part(session, key, rel)
        except BaseException:
            os.close(dir_fd)
            raise
        fd = -1
        created: str | None = None
        try:
            existing_hash = (None if body.get("replace")
                             else self._existing_hash(dir_fd, base, rel, size, algo, digest_key))
            if existing_hash is not None:
                # nothing is created or reserved until the sender says whether its copy differs
                self._reclaim_bare_parts(dir_fd, dkey, base)
                os.close(dir_fd)
                with self._lock:
                    self._busy_parts.pop(key, None)
                    self._released.notify_all()
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
                created = tmp
                self._parts.add(dir_fd, base, tmp, key=dkey)
                if size >= RESERVE_MIN:
                    storage.reserve(fd, size)
            else:
                fd = os.open(tmp, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            # the ranges sidecar is written by the first flush (or when the session ends): a small file
            # that commits within the flush interval never costs an extra file
            f = RecvFile(fid, rel, dir_fd, base, tmp, size, mtime_ns, algo, fd, ranges, session, part_key=key)
            f.dirty = True
            if size >= HASH_AHEAD_MIN:
                f.hasher = PrefixHasher(algo, digest_key)  # reads from disk: a taken-over part is hashed with this key
            f.meta_written = resumed_part  # a taken-over part brought its sidecar along
        except BaseException:
            if fd >= 0:
                os.close(fd)  # never leak the part's descriptor (issue 8, defect 4)
            if created is not None:
                self._remove_part(dir_fd, dkey, base, created)  # nor leave the new, empty part behind
            os.close(dir_fd)
            with self._lock:
                self._busy_parts.pop(key, None)
                self._released.notify_all()
            raise
        with session.lock:
            session.settled.pop(fid, None)
        session.files[fid] = f
        session.reply(Frame.OPEN_OK, {"missing": f.ranges.missing(size), "resumed": ranges.total(),
                                      "existing_hash": existing_hash}, fid)

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
                    holder.closed or (holder.job == session.job and holder.attempt <= session.attempt)
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
        if not isinstance(body.get("replace", False), bool):
            raise RefusedError(f"{rel!r}: malformed OPEN: replace {body.get('replace')!r} is not a boolean")
        return rel, size, mtime_ns, algo

    def _parent(self, session: Session, rel: str) -> tuple[int, tuple[int, int], str]:
        """(own fd of the parent directory, its (dev, ino), basename), walking each directory once per session."""
        reldir, _, base = rel.rpartition("/")
        cached = session.dirs.get(reldir)
        if cached is None:
            dfd, _base = open_parent(self._root_fd, rel)
            st = os.fstat(dfd)
            cached = session.dirs[reldir] = (dfd, (st.st_dev, st.st_ino))
            self._written_dirs.setdefault(cached[1], reldir)
        return os.dup(cached[0]), cached[1], base

    @staticmethod
    def _digest_key(session: Session, algo: str) -> bytes | None:
        """The key of ``algo`` in this session: the control connection's digest key for keyed algorithms."""
        if algo in KEYED and session.keys is not None:
            return session.keys.digest
        return None

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
    def _data_loop(self, session: Session, conn: socket.socket, keys: SessionKeys | None = None) -> None:
        sealer = DataSealer(keys) if keys is not None and keys.encrypt else None
        zero_copy = sealer is None and not isinstance(conn, ssl.SSLSocket) and hasattr(os, "splice")
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
                    if not session.is_settled(fid):
                        raise ProtocolError(f"data for file id {fid}, which is not open in this session")
                    self._drop_block(session, conn, sealer, fid, off, length)
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
                        self._open_sealed(f, conn, sealer, off, length, wire)
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
                    wire: int) -> None:
        """Read and drop a block of a file this session aborted, skipped or failed: the sender sent it before it
        gave the file up (data and control travel on different connections), so it is no reason to close the
        data connection (issue 8, fault row "source modified mid-send"). A sealed block is still opened, so the
        connection's nonce counter stays in step and a forged block is still detected."""
        self.stats["blocks_dropped"] += 1
        self.log.debug("session %s: dropping a %d-byte block of file id %d, given up in this session",
                       session.id[:8], wire, fid)
        if sealer is not None:
            sealed = recv_exact(conn, wire)
            sealer.open(pack_header(Frame.DATA, fid, off, wire), sealed, f"data block at {off} of file id {fid}")
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
                     wire: int) -> None:
        """Receive a sealed block, open it (AAD = its header) and only then write it. A block that fails
        authentication is never written; the sender is told on the control connection (its session restarts
        and resumes from the ranges received) and this data connection closes."""
        try:
            sealed = recv_exact(conn, wire)
        except (NetworkError, ProtocolError) as exc:
            raise self._lost_mid_block(f, exc) from None
        try:
            plain = sealer.open(pack_header(Frame.DATA, f.file_id, off, wire), sealed,
                                f"data block [{off}, {off + length}) of {f.relpath!r}")
        except ProtocolError as exc:
            f.session.reply(Frame.ERROR, {"kind": "checksum", "retryable": True,
                                          "message": f"{exc}; nothing of it was written, the session resumes"})
            raise
        self._write(f, memoryview(plain), off)

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

    def _write_failed(self, f: RecvFile, exc: OSError) -> str:
        """A write into ``f`` failed (disk full, I/O error): the first time, remove the partial file and release
        it, then answer (terminal). Later blocks of the file are consumed and dropped. Returns the reason."""
        reason = "disk full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else (exc.strerror or str(exc))
        with f.lock:
            first, f.failed = not f.failed, True
        if first:
            self.log.warning("%s: write failed (%s); part removed", f.relpath, reason)
            self._discard(f, remove=True)  # released before the answer (issue 8, defect 6)
            f.session.reply(Frame.ERROR, {"kind": "refused", "retryable": False,
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
                        f.session.files.pop(f.file_id, None)
                        f.session.settle(f.file_id)
                        self._discard(f, remove=True)  # released before the answer: the retry can open it
                        f.session.reply(Frame.COMMITTED, {"ok": False, "retryable": True,
                                                          "error": f"{f.relpath!r}: commit failed"}, f.file_id)

    def _commit_batch(self, batch: list[RecvFile]) -> None:
        good: list[RecvFile] = []
        for f in batch:
            with self._lock:
                current = self._attempts.get(f.session.job, 0)
            if f.session.attempt < current:
                self._discard(f, remove=False)  # released before the answer (issue 8, defect 6)
                f.session.reply(Frame.COMMITTED, {"ok": False, "retryable": False, "kind": "refused",
                                                  "error": f"{f.relpath!r}: stale attempt {f.session.attempt}, "
                                                           f"attempt {current} is current"}, f.file_id)
                continue
            if f.expected_hash is None:
                actual = None
            elif f.hasher is not None:
                actual = f.hasher.finish(f.fd, f.size)
            else:
                actual = hash_fd(f.fd, f.size, f.algo, self._digest_key(f.session, f.algo))
            if actual != f.expected_hash:
                self.log.warning("checksum mismatch for %s: expected %s, got %s", f.relpath, f.expected_hash, actual)
                f.session.files.pop(f.file_id, None)
                f.session.settle(f.file_id)
                self._discard(f, remove=True)  # released before the answer, so the retry's OPEN finds it free
                f.session.reply(Frame.COMMITTED, {"ok": False, "retryable": True, "kind": "checksum",
                                                  "error": f"{f.relpath!r}: checksum mismatch "
                                                           f"(sent {f.expected_hash}, received {actual})"},
                                f.file_id)
                continue
            good.append(f)
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
            return any(k[0] == dkey and stem_of(k[1]) == stem for k in self._busy_parts)

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
            self.log.info("removed orphaned part file %s (untouched for more than %.0f s, or a sidecar whose part is "
                          "gone)", rel, age)
        return removed

    def _sweep_at_start(self) -> None:
        """The walk of the whole tree for parts left by earlier runs (its own thread: a large tree takes time)."""
        try:
            if self.part_max_age is not None:
                self._sweep(whole_tree=True)
        finally:
            self.swept.set()

    def _flush_loop(self) -> None:
        next_sweep = time.monotonic() + self.sweep_interval
        while not self._stop.wait(self.flush_interval):
            if self.part_max_age is not None and time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + self.sweep_interval
                self._sweep(whole_tree=False)

    def _sweep(self, whole_tree: bool) -> None:
        try:
            self.sweep_parts(whole_tree=whole_tree)
        except OSError as exc:
            self.log.warning("sweep of orphaned parts under %s failed: %s", self.root, exc)
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
                    return  # being committed (the committer removes the sidecar), or failed and removed
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
                if self._busy_parts.get(f.part_key) is f.session:
                    del self._busy_parts[f.part_key]
                self._released.notify_all()

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
            if self._sessions.get(session.id) is session:  # only what this session owns
                del self._sessions[session.id]
        self.log.info("session %s closed", session.id[:8])
