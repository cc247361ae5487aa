"""One port, several receiver processes (issue 43; issue 29 planned it, BENCHMARKS §12 "The road to 100 Gbit/s").

``Router`` accepts every connection on the receiver's port and hands it, unread, to one of its worker processes
(``receiving.handoff``) over a unix socket (``SCM_RIGHTS``). To choose, it peeks at the HELLO the sender writes
first (``MSG_PEEK``: nothing is consumed; the worker reads the same bytes and authenticates them) and routes:

- a session's control and data connections to the same worker: by a hash of (key, job), which every connection of
  a job names, so a job's attempts also meet in one process (stale attempts are fenced there, as in one process);
- every session of a key whose subtree overlaps a subtree with a quota to one worker, by a hash of that group of
  keys: a quota is counted and reserved by one process (``receiving.quota``);
- anything else (a doctor or a key check, or bytes that are not a HELLO) round-robin: the worker refuses junk with
  the same error one process would.

The HELLO is unauthenticated, so it only chooses a process: a forged one reaches a worker that authenticates it.
What the router holds before handing a connection over is bounded as a receiver bounds it: the same pre-auth caps
(in total and per source address) and the handshake timeout; the bytes it waits for are at most one HELLO
(``SO_RCVLOWAT``: no wake-up until they are there). TLS hides the HELLO, so a TLS receiver runs one process.
Two jobs naming the same file in two workers are "busy" to each other (``claims.ProcessClaims``).
"""

from __future__ import annotations

import collections
import errno
import itertools
import logging
import selectors
import socket
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from transfer_agent.receiving.handoff import send_conn
from transfer_agent.receiving.keyring import ReceiverKey
from transfer_agent.receiving.receiver import ACCEPT_RETRY
from transfer_agent.errors import ProtocolError
from transfer_agent.wire.protocol import HEADER, HEADER_SIZE, MAGIC, PRE_AUTH_MAX_CONTROL, Frame, decode_body
from transfer_agent.wire.watchdog import PreAuthLimits


def _overlap(a: str, b: str) -> bool:
    return not a or not b or a == b or a.startswith(b + "/") or b.startswith(a + "/")


def quota_groups(keys: Iterable[ReceiverKey]) -> dict[str, str]:
    """Key id → the name of its group, for every key that may write under a subtree with a quota: keys are grouped
    by overlapping subtrees (transitively), and only groups holding a quota are returned."""
    keys = list(keys)
    parent = {k.key_id: k.key_id for k in keys}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in itertools.combinations(keys, 2):
        if _overlap(a.subtree, b.subtree):
            ra, rb = find(a.key_id), find(b.key_id)
            parent[max(ra, rb)] = min(ra, rb)
    quota_roots = {find(k.key_id) for k in keys if k.quota is not None}
    return {k.key_id: find(k.key_id) for k in keys if find(k.key_id) in quota_roots}


def _hash(text: str, n: int) -> int:
    return zlib.crc32(text.encode()) % n


def route(hello: dict | None, workers: int, groups: dict[str, str], turn: int) -> int:
    """The worker for a connection whose HELLO is ``hello`` (None: not a HELLO); ``turn`` is the round-robin
    counter."""
    if isinstance(hello, dict):
        key = hello.get("key", "default")
        key = key if isinstance(key, str) else ""
        if key in groups:
            return _hash("quota\0" + groups[key], workers)
        job = hello.get("job")
        if hello.get("role") in ("control", "data") and isinstance(job, str) and job:
            return _hash(f"{key}\0{job}", workers)
    return turn % workers


@dataclass(eq=False)
class _Pending:
    conn: socket.socket
    addr: tuple
    token: int
    deadline: float
    need: int = HEADER_SIZE


def _peek_hello(conn: socket.socket, need: int) -> tuple[str, int, dict | None]:
    """("wait", bytes needed) until the HELLO is all there; ("route", 0, body or None); ("eof", 0, None)."""
    try:
        raw = conn.recv(HEADER_SIZE + PRE_AUTH_MAX_CONTROL, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return "wait", need, None
    except OSError:
        return "eof", 0, None
    if not raw:
        return "eof", 0, None
    if len(raw) < HEADER_SIZE:
        head = raw[:len(MAGIC)]
        return ("wait", HEADER_SIZE, None) if head == MAGIC[:len(head)] else ("route", 0, None)
    magic, _version, _ftype, _fid, _off, length = HEADER.unpack(raw[:HEADER_SIZE])
    if magic != MAGIC or length > PRE_AUTH_MAX_CONTROL:
        return "route", 0, None
    if len(raw) < HEADER_SIZE + length:
        return "wait", HEADER_SIZE + length, None
    try:  # the wire's own decoder: its depth limit before json.loads (2,000 brackets would raise RecursionError)
        return "route", 0, decode_body(Frame.HELLO, raw[HEADER_SIZE:HEADER_SIZE + length])
    except ProtocolError:
        return "route", 0, None


class Router:
    """Accept on ``listen`` and hand each connection to one of ``workers`` worker processes (see the module).

    ``bind()``, then ``set_worker`` for each worker (the router's end of its unix socket pair; again when a worker
    is restarted), then ``start()``. A connection routed to a worker without a channel waits for one (within its
    deadline and the caps).

    :param listen: (host, port); port 0 picks a free one (``port``).
    :param workers: the number of worker processes.
    :param keys: the receiver's keys (for the quota groups; ``set_keys`` after a re-read).
    :param handshake_timeout: seconds a connection may wait here for its HELLO.
    :param max_unauth: connections held here at once; :param max_unauth_per_addr: from one source address.
    """

    def __init__(self, *, listen: tuple[str, int], workers: int, keys: Iterable[ReceiverKey] = (),
                 handshake_timeout: float = 10.0, max_unauth: int = 64, max_unauth_per_addr: int = 16,
                 log: logging.Logger | None = None) -> None:
        self.listen_addr = listen
        self.log = log or logging.getLogger("fstream.receiver")
        self._chans: list[socket.socket | None] = [None] * workers
        self.groups = quota_groups(keys)
        self.handshake_timeout = handshake_timeout
        self._preauth = PreAuthLimits(max_unauth, max_unauth_per_addr)
        self._tokens = itertools.count(1)
        self._turn = itertools.count()
        self._pending: dict[int, _Pending] = {}  # fd -> connection waiting for its HELLO
        self._stop = threading.Event()
        self._swap_lock = threading.Lock()
        self._swaps: dict[int, socket.socket] = {}  # worker -> its new channel (set_worker), for the loop
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._queued: list[collections.deque[_Pending]] = [collections.deque() for _ in range(workers)]  # routed
        self._watching: dict[int, socket.socket] = {}  # worker -> its channel, registered while its queue waits
        self.handed = [0] * workers  # connections handed to each worker
        self.dropped = 0  # connections closed here: caps, timeouts, a worker that could not take them

    def _waiting(self) -> list[_Pending]:
        """Every connection held here: waiting for its HELLO, or queued for a worker."""
        return [*self._pending.values(), *itertools.chain.from_iterable(self._queued)]

    @property
    def workers(self) -> int:
        return len(self._chans)

    @property
    def port(self) -> int:
        assert self._sock is not None, "router not started"
        return self._sock.getsockname()[1]

    def set_worker(self, index: int, chan: socket.socket) -> None:
        """Worker ``index`` was restarted: hand its connections over ``chan`` from now on (taken up by the loop)."""
        chan.setblocking(False)
        with self._swap_lock:
            self._swaps[index] = chan  # the loop takes it up within its 0.2 s tick

    def _take_swaps(self, sel: selectors.BaseSelector) -> None:
        with self._swap_lock:
            swaps, self._swaps = self._swaps, {}
        for index, chan in swaps.items():
            watched = self._watching.pop(index, None)
            if watched is not None:
                sel.unregister(watched)
            old, self._chans[index] = self._chans[index], chan
            if old is not None:
                old.close()
            self._flush(sel, index)

    def set_keys(self, keys: Iterable[ReceiverKey]) -> None:
        self.groups = quota_groups(keys)

    def set_preauth_limits(self, max_unauth: int, max_unauth_per_addr: int) -> None:
        """New caps on the connections held here (SIGHUP, ``cli.reload.router_apply``); those held stay until they
        resolve, as in ``Receiver.set_preauth_limits``."""
        self._preauth.max_total, self._preauth.max_per_addr = int(max_unauth), int(max_unauth_per_addr)

    def bind(self) -> "Router":
        if self._sock is None:
            host, port = self.listen_addr
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(256)
            sock.setblocking(False)
            self._sock = sock
        return self

    def start(self) -> "Router":
        self.bind()
        self._thread = threading.Thread(target=self._loop, name="fstream-router", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting; close what waits here and the workers' channels (a worker drains when its closes)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for p in self._waiting():
            p.conn.close()
        self._pending.clear()
        if self._sock is not None:
            self._sock.close()
        for chan in self._chans:
            if chan is not None:
                chan.close()

    # -- the loop --------------------------------------------------------------------------------
    def _loop(self) -> None:
        assert self._sock is not None
        sel = selectors.DefaultSelector()
        sel.register(self._sock, selectors.EVENT_READ, None)
        failures = 0
        try:
            while not self._stop.is_set():
                self._take_swaps(sel)
                now = time.monotonic()
                wait = min([p.deadline for p in self._waiting()], default=now + 0.2) - now
                for skey, _ev in sel.select(timeout=max(0.0, min(wait, 0.2))):
                    if skey.data is None:
                        failures = self._accept(sel, failures)
                    elif isinstance(skey.data, int):
                        self._flush(sel, skey.data)
                    else:
                        try:
                            self._readable(sel, skey.data)
                        except Exception:  # noqa: BLE001 - one connection's surprise must not stop the port
                            self.log.exception("router: connection from %s:%s failed", *skey.data.addr[:2])
                            self._close(sel, skey.data)
                now = time.monotonic()
                for p in [p for p in self._waiting() if p.deadline <= now]:
                    self.log.debug("connection from %s:%s closed: not handed over within %.0f s", p.addr[0],
                                   p.addr[1], self.handshake_timeout)
                    self._close(sel, p)
        finally:
            sel.close()

    def _accept(self, sel: selectors.BaseSelector, failures: int) -> int:
        assert self._sock is not None
        try:
            conn, addr = self._sock.accept()
        except BlockingIOError:
            return failures
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                if failures == 0:
                    self.log.warning("router: cannot accept connections: %s; backing off", exc.strerror)
                ACCEPT_RETRY.pause(failures, self._stop)
                return failures + 1
            return failures
        token = next(self._tokens)
        admitted, victim = self._preauth.admit(str(addr[0]), token)
        if victim is not None:
            for p in self._waiting():
                if p.token == victim:
                    self._close(sel, p)
        if not admitted:
            conn.close()
            self.dropped += 1
            return 0
        conn.setblocking(False)
        p = _Pending(conn, addr, token, time.monotonic() + self.handshake_timeout)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, p.need)
        self._pending[conn.fileno()] = p
        sel.register(conn, selectors.EVENT_READ, p)
        return 0

    def _forget(self, sel: selectors.BaseSelector, p: _Pending) -> None:
        """No longer waiting for its HELLO (still counted until it is closed or handed over)."""
        self._pending.pop(p.conn.fileno(), None)
        try:
            sel.unregister(p.conn)
        except (KeyError, ValueError):
            pass

    def _close(self, sel: selectors.BaseSelector, p: _Pending) -> None:
        self._forget(sel, p)
        for queue in self._queued:
            if p in queue:
                queue.remove(p)
        self._preauth.release(str(p.addr[0]), p.token)
        p.conn.close()
        self.dropped += 1

    def _readable(self, sel: selectors.BaseSelector, p: _Pending) -> None:
        what, need, hello = _peek_hello(p.conn, p.need)
        if what == "wait":
            if need != p.need:
                p.need = need
                p.conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, need)
            return
        if what == "eof":
            self._close(sel, p)
            self.dropped -= 1  # the peer left: nothing was refused
            return
        self._forget(sel, p)
        p.conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        p.conn.setblocking(True)
        index = route(hello, self.workers, self.groups, next(self._turn))
        queue = self._queued[index]
        queue.append(p)  # still counted as unauthenticated, with its deadline, until the worker has it
        if len(queue) == 1:
            self._flush(sel, index)

    def _flush(self, sel: selectors.BaseSelector, index: int) -> None:
        """Hand worker ``index`` what is queued for it; when its channel is full (a unix socket queues
        ``net.unix.max_dgram_qlen`` messages, 10 by default), wait until it is writable."""
        queue, chan = self._queued[index], self._chans[index]
        if chan is None:
            return  # its worker is starting: what is queued waits (within its deadline)
        while queue:
            p = queue[0]
            try:
                send_conn(chan, p.conn, p.addr)
            except BlockingIOError:
                break
            except OSError as exc:  # the worker is gone (restarting): the sender retries
                self.dropped += 1
                self.log.warning("router: worker %d did not take a connection from %s:%s: %s", index, p.addr[0],
                                 p.addr[1], exc.strerror or exc)
            else:
                self.handed[index] += 1
            queue.popleft()
            self._preauth.release(str(p.addr[0]), p.token)
            p.conn.close()
        watched = self._watching.get(index)
        if queue and watched is not chan:
            if watched is not None:
                sel.unregister(watched)
            sel.register(chan, selectors.EVENT_WRITE, index)
            self._watching[index] = chan
        elif not queue and watched is not None:
            sel.unregister(watched)
            del self._watching[index]
