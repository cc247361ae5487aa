"""The listener: ``Receiver`` accepts connections, authenticates them and hands each to its session; lifecycle, sweeps.

``Receiver`` is the top of the layers listed in ``transfer_agent.receiving``; below it, ``control`` serves each
session's control connection and ``data`` its data connections.

Security (issue 8; what each mode protects against: ``transfer_agent.wire.secure``): every connection authenticates
within ``handshake_timeout`` (HMAC handshake with the shared secret, or mutual TLS); unauthenticated connections
are capped in number, overall and per source address. ``require_encryption`` refuses connections that do not seal.
A plaintext client against a TLS receiver is told at once that TLS is required (terminal), not reset.

Keys (issue 32): the receiver holds a ``Keyring``; each connection authenticates with the key its HELLO names,
its session may write only under that key's subtree and within its quota (``control``), and the session's data
connections must use the same key.

Rotation (issue 30): the keys' files are re-read when they change (``keyring.KeyringWatch``, looked at on accept at
most once per second); a HELLO names its key's generation; ``generations`` counts sessions per (key, generation),
and the session's log line names both. A ``check`` connection (``fstream keys rotate --check-receiver``) only
authenticates.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING

from transfer_agent import faultpoints
from transfer_agent.errors import AuthError, FStreamError, NetworkError, ProtocolError, RefusedError
from transfer_agent.receiving.control import ControlSessions
from transfer_agent.receiving.doctor import DoctorService
from transfer_agent.receiving.keyring import Keyring, KeyringWatch
from transfer_agent.receiving.state import Session
from transfer_agent.sending.host import raise_fd_limit
from fstream_provider.model.retry import RetryPolicy
from transfer_agent.storage import durable as storage
from transfer_agent.wire.auth import TLSConfig, refuse_plaintext, server_handshake
from transfer_agent.wire.protocol import Frame
from transfer_agent.wire.watchdog import Deadlines, PreAuthLimits

if TYPE_CHECKING:
    from transfer_agent.service.sdnotify import Watchdog

HANDSHAKE_TIMEOUT = 10.0  # total, from accept to authenticated (issue 8, defect 3)
MAX_UNAUTH = 64  # unauthenticated connections held at once
MAX_UNAUTH_PER_ADDR = 16  # ... from one source address
# Out of file descriptors: back off from 10 ms up to 1 s between accept attempts (the one retry policy, never gives up).
ACCEPT_RETRY = RetryPolicy(base_s=0.02, cap_s=1.0)
PART_MAX_AGE = 7 * 86400.0  # orphaned parts untouched this long are removed by the sweep
SWEEP_INTERVAL = 3600.0
KEEPALIVE = (30, 10, 3)  # idle s, interval s, probes: a vanished peer (host down, FIN lost) is noticed in ~1 min


def _tune_keepalive(sock: socket.socket) -> None:
    """Probe an idle connection after ``KEEPALIVE`` (Linux defaults wait two hours): the session of a sender
    whose host vanished is closed, and its files released (fenced as stale), within about a minute."""
    for opt, value in zip(("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT"), KEEPALIVE):
        if hasattr(socket, opt):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
            except OSError:
                pass


class Receiver(ControlSessions):
    """Accept authenticated sessions and write their files under ``root``.

    The top layer: ``ControlSessions`` (control) → ``DataStreams`` (data) → ``GroupCommit`` (commit)
    → ``PartStore`` (store). Tests' receivers override the layers' hooks (``_claim``, ``_open``, ``_commit_batch``)
    on a subclass.

    :param listen: (host, port) to bind; port 0 picks a free one (see ``port``).
    :param root: destination root directory; nothing is ever written outside it.
    :param secret: shared secret for the HMAC handshake (the keyring's one key, ``"default"``).
    :param keyring: the keys senders authenticate with, each with its subtree and quota (instead of ``secret``).
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
    :param watchdog: systemd's watchdog (``service.sdnotify.Watchdog``, from ``WatchdogSec=``): pinged by the flush
        loop, the receiver's periodic loop (it takes the receiver's lock and persists every in-flight file's
        ranges), so a receiver whose lock or disk hangs stops the pings.
    """

    def __init__(self, *, listen: tuple[str, int] = ("127.0.0.1", 0), root: str, secret: bytes | None = None,
                 tls: TLSConfig | None = None, fsync: bool = True, flush_interval: float = 2.0,
                 log: logging.Logger | None = None, handshake_timeout: float = HANDSHAKE_TIMEOUT,
                 max_unauth: int = MAX_UNAUTH, max_unauth_per_addr: int = MAX_UNAUTH_PER_ADDR,
                 part_max_age: float | None = PART_MAX_AGE, sweep_interval: float = SWEEP_INTERVAL,
                 require_encryption: bool = False, keyring: Keyring | None = None,
                 watchdog: Watchdog | None = None, quota_state: str | None = None) -> None:
        if keyring is not None and secret is not None:
            raise FStreamError("receiver: give a shared secret or a keyring, not both (add the secret to the "
                               "keyring as key 'default')")
        keyring = keyring if keyring is not None else Keyring.single(secret)
        if not keyring.has_secrets and tls is None:
            raise FStreamError("receiver: refusing to run unauthenticated: give a shared secret "
                               "(--secret-file) or TLS certificates (--tls-cert/--tls-key/--tls-ca)")
        super().__init__(root=root, fsync=fsync, log=log or logging.getLogger("fstream.receiver"),
                         part_max_age=part_max_age)
        self.listen_addr = listen
        self.secret = secret
        self._keys = KeyringWatch(keyring, self.log)  # re-read when its files change (issue 30)
        self._quotas.keys = lambda: self.keyring.values()  # every key's quota covers its subtree (issue 40)
        self._quotas.state_path = quota_state
        self.generations: collections.Counter[tuple[str, str]] = collections.Counter()  # sessions per key, generation
        self.tls = tls
        self.require_encryption = require_encryption
        self.flush_interval = flush_interval
        self._ssl_ctx = tls.server_context() if tls else None
        self._sock: socket.socket | None = None
        self._sessions: dict[str, Session] = {}
        self.swept = threading.Event()  # set once the sweep at start finished
        self._threads: list[threading.Thread] = []
        self.handshake_timeout = handshake_timeout
        self.sweep_interval = sweep_interval
        self._preauth = PreAuthLimits(max_unauth, max_unauth_per_addr)
        self._deadlines: Deadlines | None = None
        self._doctor = DoctorService(root=self.root, stop=self._stop, log=self.log,  # `fstream doctor` (issue 30)
                                     quota_used=self._quotas.used)
        self.draining = threading.Event()  # ``drain()``: no new sessions
        self.watchdog = watchdog

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "Receiver":
        os.makedirs(self.root, exist_ok=True)
        self._quotas.open()  # FStreamError if another receiver holds its state file
        self._root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        self._sock = self._listen()
        self._released = threading.Condition(self._lock)  # bound to the final _lock (subclasses may replace it)
        self._deadlines = Deadlines()
        raise_fd_limit()  # towards the hard limit; the open parts stay within what it is (issue 43)
        for target, name in ((self._accept_loop, "accept"), (self._commit_loop, "commit"),
                             (self._flush_loop, "flush"), (self._admit_loop, "admit")):
            t = threading.Thread(target=target, name=f"fstream-recv-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        threading.Thread(target=self._sweep_at_start, name="fstream-recv-sweep", daemon=True).start()
        self.log.info("listening on %s:%d, root %s", self.listen_addr[0], self.port, self.root)
        return self

    def _listen(self) -> socket.socket:
        """The listening socket (``receiving.handoff``'s workers take connections from their router instead)."""
        host, port = self.listen_addr
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(256)
        return sock

    def _admit_loop(self) -> None:
        self._gate.run(self._admit_parked, self._stop)

    @property
    def keyring(self) -> Keyring:
        """The keys now (re-read when their files changed: ``KeyringWatch``)."""
        return self._keys.current()

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
        self._writeback.close()
        if self._deadlines is not None:
            self._deadlines.stop()
        if self._root_fd >= 0:
            os.close(self._root_fd)
            self._root_fd = -1
        self._quotas.close()  # every session ended: the counts are persisted as clean

    def set_preauth_limits(self, max_unauth: int, max_unauth_per_addr: int) -> None:
        """New caps on unauthenticated connections (SIGHUP); connections held now stay until they resolve."""
        self._preauth.max_total, self._preauth.max_per_addr = int(max_unauth), int(max_unauth_per_addr)

    def drain(self, grace: float) -> int:
        """Stop gracefully (SIGTERM; issue 30): refuse new sessions (retryable: senders retry elsewhere or later),
        let open sessions finish for up to ``grace`` seconds, then ``stop()`` (open parts keep their flushed ranges,
        resumable). The number of sessions still open when the grace ran out."""
        self.draining.set()
        end = time.monotonic() + grace
        while time.monotonic() < end and not self._stop.is_set():
            with self._lock:
                if not self._sessions:
                    break
            self._stop.wait(0.1)
        with self._lock:
            left = len(self._sessions)
        self.log.info("drained: %s", f"{left} session(s) cut after {grace:.0f} s (resumable)" if left
                      else "no session open")
        self.stop()
        return left

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
        failures = 0
        while not self._stop.is_set():
            try:
                conn, addr = self._sock.accept()
            except OSError as exc:
                if self._stop.is_set():
                    return
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if failures == 0:
                        self.stats["errors"] += 1
                        self.log.warning("cannot accept connections: %s; backing off until descriptors free up",
                                         exc.strerror)
                    ACCEPT_RETRY.pause(failures, self._stop)
                    failures += 1
                continue
            if failures:
                failures = 0
                self.log.warning("accepting connections again")
            self._take(conn, addr)

    def _take(self, conn: socket.socket, addr: tuple) -> None:
        """An accepted (or handed over: ``receiving.handoff``) connection: within the pre-auth caps, on its own
        thread with a handshake deadline; over them, closed at once."""
        assert self._deadlines is not None
        ip = str(addr[0])
        token = self._deadlines.add(conn.fileno(), self.handshake_timeout)
        admitted, victim = self._preauth.admit(ip, token)
        if victim is not None:
            self._deadlines.expire(victim)  # the busiest address gives up its oldest connection
        if not admitted:
            self._deadlines.cancel(token)
            self.log.debug("connection from %s:%s closed: too many unauthenticated connections", ip, addr[1])
            conn.close()
            return
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
                refuse_plaintext(conn)
                try:
                    conn = self._ssl_ctx.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError) as exc:
                    raise FStreamError(f"TLS handshake failed: {exc}") from None
            keys = self._keys.snapshot()  # one keyring for the whole handshake, and for the session it opens
            hs = server_handshake(conn, tls=self._ssl_ctx is not None, secret_at=keys.secret_at,
                                  require_hmac=keys.keyring.has_secrets,
                                  require_encryption=self.require_encryption, peer=peer)
            key = keys.keyring[hs.key_id]
            hello = hs.peer
            authenticated()
            role = str(hello.get("role", ""))
            writer = hs.link
            if role == "check":  # `fstream keys rotate --check-receiver` (issue 30): authenticated, that is all
                writer.send(Frame.WELCOME, {"key": key.key_id, "generation": hs.generation})
                self.log.info("key check from %s: key %s generation %s accepted", peer, key.key_id, hs.generation)
                return
            if role == "doctor":  # `fstream doctor` (issue 30): probes only, no session, nothing lands
                self._doctor.serve(conn, writer, hello, key, peer)
                return
            sid = str(hello.get("session", ""))
            job = str(hello.get("job", ""))
            try:
                attempt = int(hello.get("attempt", 1))
            except (TypeError, ValueError):
                raise ProtocolError("malformed HELLO: attempt is not an integer") from None
            if not sid or not job:
                raise ProtocolError("malformed HELLO: session and job are required")
            with self._lock:  # jobs are named per key: one key's sender cannot make another key's job stale
                current = self._attempts.get((key.key_id, job), 0)
                if attempt < current:
                    msg = f"stale attempt {attempt} of job {job}: attempt {current} is current"
                    writer.send(Frame.ERROR, {"kind": "refused", "message": msg})
                    raise RefusedError(msg)
                self._attempts[(key.key_id, job)] = attempt
            conn.settimeout(None)
            if role == "control" and self.draining.is_set():  # issue 30: sessions open finish, none starts
                msg = "receiver draining (stopping): no new sessions; try again later or at another receiver"
                writer.send(Frame.ERROR, {"kind": "refused", "message": msg, "retryable": True})
                raise RefusedError(msg, retryable=True)
            if role == "control":
                new = Session(sid, job, attempt, writer, peer, keys=hs.keys, key=key)
                with self._lock:
                    if sid in self._sessions:  # not ours: refusing it must not tear the real one down
                        raise ProtocolError(f"session {sid} already exists")
                    self._sessions[sid] = new
                    self.stats["sessions"] += 1
                    self.generations[(key.key_id, str(hs.generation))] += 1
                session = new  # registered: from here on this connection owns it and closes it
                session.sock = conn
                writer.send(Frame.WELCOME, {"session": sid, "root_free": storage.free_bytes(self._root_fd)})
                sealed = f", sealed with {hs.keys.aead}" if hs.keys is not None and hs.keys.encrypt else ""
                self.log.info("session %s from %s (key %s generation %s, protocol %d%s): job %s attempt %d", sid[:8],
                              peer, key.key_id, hs.generation, hs.version, sealed, job, attempt)
                writer.read_ahead()  # only control frames follow on this connection
                self._control_loop(session, writer)
            elif role == "data":
                with self._lock:
                    session = self._sessions.get(sid)
                if session is None or session.closed:
                    writer.send(Frame.ERROR, {"kind": "protocol", "message": f"unknown session {sid}"})
                    raise ProtocolError(f"data connection for unknown session {sid}")
                if key.key_id != session.key.key_id:
                    msg = (f"data connection authenticated with key {key.key_id!r} for a session of key "
                           f"{session.key.key_id!r}")
                    writer.send(Frame.ERROR, {"kind": "protocol", "message": msg})
                    session = None  # not ours: refusing it must not close the session
                    raise ProtocolError(msg)
                with session.lock:
                    session.data_socks.add(conn)
                    session.data_threads.add(threading.current_thread())
                writer.send(Frame.WELCOME, {"session": sid})
                data_session, session = session, None  # only the control connection closes a session
                try:
                    self._data_loop(data_session, conn, hs.keys, hs.version)
                finally:
                    with data_session.lock:
                        data_session.data_socks.discard(conn)
                        data_session.data_threads.discard(threading.current_thread())
            else:
                raise ProtocolError(f"malformed HELLO: unknown role {role!r}")
        except NetworkError as exc:
            if preauth and self._deadlines is not None and token in self._deadlines._live:  # not the watchdog's cut
                self.stats["preauth_network"] += 1  # the peer hung up before authenticating (service.metrics)
            self.log.debug("%s connection from %s ended: %s", role, peer, exc)
        except FStreamError as exc:
            self.stats["errors"] += 1
            if preauth:  # refused before authentication, by the error's kind (transfer_agent.service.metrics)
                self.stats["preauth_" + exc.kind] += 1
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

    # -- sweeps --------------------------------------------------------------------------------
    def _sweep_at_start(self) -> None:
        """The walk of the whole tree for parts left by earlier runs (its own thread: a large tree takes time)."""
        try:
            self._doctor.start(k.subtree for k in self.keyring.values())  # stale doctor temp files (issue 30)
            if self.part_max_age is not None:
                self._sweep(whole_tree=True)
        finally:
            self.swept.set()

    def _flush_loop(self) -> None:
        """Every ``flush_interval``, persist the ranges of every in-flight file; every ``sweep_interval``, sweep;
        ping systemd's watchdog on every pass (waking up for it when it is due before the next flush)."""
        next_sweep = time.monotonic() + self.sweep_interval
        next_flush = time.monotonic() + self.flush_interval
        wd = self.watchdog.own() if self.watchdog is not None else None
        while True:
            if wd is not None:
                wd.kick()
            faultpoints.stall("receiver.flush")
            wait = next_flush - time.monotonic()
            if wd is not None:
                wait = min(wait, max(0.001, wd.due_in()))
            if self._stop.wait(max(0.0, wait)):
                return
            if time.monotonic() < next_flush:
                continue  # woken for the watchdog only
            next_flush = time.monotonic() + self.flush_interval
            if self.part_max_age is not None and time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + self.sweep_interval
                self._sweep(whole_tree=False)
            with self._lock:
                sessions = list(self._sessions.values())
            for s in sessions:
                for f in list(s.files.values()):
                    self._flush(f)

    def _sweep(self, whole_tree: bool) -> None:
        try:
            self.sweep_parts(whole_tree=whole_tree)
        except OSError as exc:
            self.log.warning("sweep of orphaned parts under %s failed: %s", self.root, exc)

    # -- teardown ------------------------------------------------------------------------------
    def _close_session(self, session: Session) -> None:
        with session.lock:
            if session.closed:
                return
            session.closed = True
            socks, threads = list(session.data_socks), list(session.data_threads)
        if self._stop.is_set() and session.sock is not None:
            socks.append(session.sock)  # stopping: the control connection ends too, no OPEN is taken after it
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        me = threading.current_thread()
        for t in threads:
            if t is not me:
                t.join(timeout=10)
        self._gate.forget(session)  # its parked OPENs (issue 43)
        with session.opening:  # an OPEN being admitted right now finishes first; later ones see it closed
            files = list(session.files.values())
        for f in files:
            if f.queued and not f.done:
                continue  # the committer finishes it and releases it
            self._flush(f)
            session.files.pop(f.file_id, None)
            self._release(f)
        with session.opening:
            for dfd, _key in session.dirs.values():
                os.close(dfd)
            session.dirs.clear()
        with self._lock:
            if self._sessions.get(session.id) is session:  # only what this session owns
                del self._sessions[session.id]
        self.log.info("session %s closed", session.id[:8])
