"""The sender's connection layer: one control connection per session and channels of p data streams.

A channel is ``p`` TCP streams that share one block queue: a file's missing ranges are cut into
blocks and each stream takes the next block, so one file is striped over the channel's
streams and, with small files, several files are in flight on one channel at once. A channel's
driver keeps up to ``pp`` files opened ahead of the one whose blocks it is queueing, so the
channel never waits a round trip between files. Channels are kept by their ``p``: a tuner
change reassigns channels whose ``p`` fits, parks the rest as passive, and opens new ones only
when no passive channel fits (smart channel distribution, thesis ch. 3).

Security (issue 8; modes and what they protect against: ``transfer_agent.wire.secure``): every
connection authenticates the receiver by our own configuration (``auth.client_handshake``); the
control connection's frames go through its ``ControlLink`` (MAC'd or sealed with a shared
secret), its digest key keys the file digest (``blake3-keyed``), and with ``encrypt`` each data
stream seals its blocks (pread + seal + sendall, like the TLS path; never sendfile).
"""

from __future__ import annotations

import collections
from concurrent.futures import Future
import logging
import os
import queue
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from fstream_provider.tuning.base import ClusterLayout
from fstream_provider.tuning.distribution import ChannelState, plan_channels
from fstream_provider.tuning.pacing import TokenBucket
from transfer_agent import faultpoints
from transfer_agent.wire.auth import Handshake, client_handshake
from transfer_agent.storage.checksum import hash_fd
from transfer_agent.errors import (AuthError, ChecksumError, FStreamError, NetworkError, ProtocolError,
                                   RefusedError, SourceModifiedError, SourceVanishedError)
from transfer_agent.wire.protocol import MAX_BLOCK, MSG_MORE, Frame, error_from_body, pack_header
from fstream_provider.watch.sources import SrcFile
from transfer_agent.wire.secure import TAG_BYTES, DataSealer

log = logging.getLogger("fstream.sender")
MIN_STRIPE = 256 << 10  # smallest block a file is cut into when striped over a channel's streams
TLS_CHUNK = 1 << 20  # bytes read and encrypted per call when the channel is TLS (no zero-copy there)
IDLE_CHECK = 0.25  # seconds: how often an idle data stream checks that its connection still stands
MAX_SEALED_BLOCK = MAX_BLOCK - TAG_BYTES  # a sealed block and its tag must fit the frame limit


@dataclass(eq=False)
class InFlight:
    """One file between OPEN and COMMITTED."""

    sf: SrcFile
    file_id: int
    fd: int
    st_size: int
    st_mtime_ns: int
    opened: threading.Event = field(default_factory=threading.Event)
    reply: dict[str, Any] | None = None
    error: FStreamError | None = None
    blocks_left: int = 0
    bytes_sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    hash_future: Any = None
    finished: threading.Event = field(default_factory=threading.Event)
    outcome: str = ""  # committed | skipped | failed
    aborted: bool = False
    resumed: int = 0


def cut_blocks(missing: list[tuple[int, int]], p: int, block_size: int) -> list[tuple[int, int]]:
    """Cut a file's missing ranges into (offset, length) blocks for a channel of ``p`` streams.

    Blocks are at most ``block_size`` and at most the file's share per stream (but not under
    ``MIN_STRIPE``), so a file smaller than a block is still striped over every stream.
    """
    todo = sum(b - a for a, b in missing)
    bs = min(block_size, max(MIN_STRIPE, -(-todo // max(1, p))))
    return [(off, min(bs, end - off)) for a, end in missing for off in range(a, end, bs)]


def _settle(f: InFlight) -> None:
    """Close the source and wake whoever waits on the file; its outcome is decided."""
    try:
        os.close(f.fd)
    except OSError:
        pass
    f.opened.set()
    f.finished.set()


class Connector:
    """Opens authenticated connections to one receiver.

    :param host: receiver host.
    :param port: receiver port.
    :param secret: shared secret (HMAC) or None with TLS.
    :param ssl_ctx: client TLS context for mutual TLS, or None.
    :param hello: fields every HELLO carries (job, attempt, session).
    :param encrypt: seal data blocks and control bodies (needs ``secret``).
    """

    def __init__(self, host: str, port: int, secret: bytes | None, ssl_ctx: ssl.SSLContext | None,
                 hello: dict[str, Any], timeout: float = 15.0, encrypt: bool = False) -> None:
        self.host, self.port, self.secret, self.ssl_ctx, self.hello, self.timeout = (
            host, port, secret, ssl_ctx, hello, timeout)
        self.encrypt = encrypt

    @property
    def peer(self) -> str:
        return f"{self.host}:{self.port}"

    def connect(self, **extra: Any) -> socket.socket:
        """An authenticated connection (its keys and control link: ``connect_link``)."""
        return self.connect_link(**extra).link.sock

    def connect_link(self, **extra: Any) -> Handshake:
        """Connect and authenticate; the result carries the socket (``.link.sock``), keys and control link."""
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except OSError as exc:
            raise NetworkError(f"cannot connect to receiver {self.host}:{self.port}: {exc.strerror or exc}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if self.ssl_ctx is not None:
                try:
                    sock = self.ssl_ctx.wrap_socket(sock, server_hostname=self.host)
                except (ssl.SSLError, OSError) as exc:
                    raise AuthError(f"TLS handshake with {self.host}:{self.port} failed: {exc}") from None
            try:
                hs = client_handshake(sock, self.secret, {**self.hello, **extra}, tls=self.ssl_ctx is not None,
                                      encrypt=self.encrypt, peer=self.peer)
            except NetworkError as exc:
                if self.ssl_ctx is None:
                    raise
                raise AuthError(f"TLS: receiver {self.host}:{self.port} closed the connection during the handshake "
                                f"(our certificate was probably rejected): {exc}") from None
            except AuthError as exc:
                if self.peer in str(exc):
                    raise
                raise AuthError(f"receiver {self.peer}: {exc}") from None
            sock.settimeout(None)
            return hs
        except BaseException:
            sock.close()
            raise


class ControlSession:
    """The control connection: sends OPEN/COMMIT/ABORT, dispatches replies to in-flight files.

    :param connector: opens the connection.
    :param on_finished: called with each InFlight once its outcome is known.
    :param hasher: executor used to checksum source files.
    :param algo: checksum algorithm; default ``blake3-keyed`` (keyed with this connection's digest key)
        with a shared secret, ``xxh3_128`` with TLS only.
    :param verify: end-to-end checksums (off: the receiver only checks that every byte arrived).
    """

    def __init__(self, connector: Connector, on_finished: Callable[[InFlight], None], hasher: Any,
                 algo: str | None = None, verify: bool = True) -> None:
        self.connector = connector
        self.on_finished = on_finished
        self.hasher = hasher
        self.verify = verify
        hs = connector.connect_link(role="control")
        self.keys = hs.keys
        self.sock = hs.link.sock
        self.writer = hs.link  # MAC'd (or sealed) control frames; same send() as a ControlWriter
        self.digest_key = self.keys.digest if self.keys is not None else None
        self.algo = algo or ("blake3-keyed" if self.digest_key is not None else "xxh3_128")
        if self.algo != "blake3-keyed":
            self.digest_key = None
        self._files: dict[int, InFlight] = {}
        self._lock = threading.Lock()
        self._next_id = 1
        self._pongs: dict[int, threading.Event] = {}
        self.error: FStreamError | None = None
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
        try:
            fd = os.open(sf.src, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SourceVanishedError(f"{sf.src}: source vanished before it was sent (renamed or deleted)") from None
        except OSError as exc:
            raise SourceModifiedError(f"{sf.src}: cannot open source ({exc.strerror})") from None
        st = os.fstat(fd)
        with self._lock:
            fid = self._next_id
            self._next_id += 1
            f = InFlight(sf, fid, fd, st.st_size, st.st_mtime_ns)
            self._files[fid] = f
        if self.verify:
            f.hash_future = self.hasher.submit(hash_fd, fd, st.st_size, self.algo, self.digest_key)
        else:
            f.hash_future = Future()
            f.hash_future.set_result(None)
        self.writer.send(Frame.OPEN, {"path": sf.rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                      "algo": self.algo}, fid)
        return f

    def reopen(self, f: InFlight) -> None:
        """Ask again to open a file whose destination copy differs: this time it is replaced."""
        f.reply = None
        f.opened.clear()
        self.writer.send(Frame.OPEN, {"path": f.sf.rel, "size": f.st_size, "mtime_ns": f.st_mtime_ns,
                                      "algo": self.algo, "replace": True}, f.file_id)

    def all_sent(self, f: InFlight) -> None:
        """Every block of ``f`` is on the wire: when its checksum is ready, check the source and COMMIT."""
        f.hash_future.add_done_callback(lambda fut: self._commit(f, fut))

    def _commit(self, f: InFlight, fut: Any) -> None:
        try:
            digest = fut.result()
            st = os.fstat(f.fd)
            if st.st_size != f.st_size or st.st_mtime_ns != f.st_mtime_ns:
                raise SourceModifiedError(f"{f.sf.src}: source modified while being sent ("
                                          + (f"size {f.st_size}→{st.st_size}" if st.st_size != f.st_size
                                             else "mtime changed") + "); not committed")
            faultpoints.hit("commit.before_send")
            self.writer.send(Frame.COMMIT, {"hash": digest}, f.file_id)
        except (SourceModifiedError, EOFError) as exc:
            err = exc if isinstance(exc, SourceModifiedError) else SourceModifiedError(
                f"{f.sf.src}: source modified while being sent ({exc}); not committed")
            self.abort(f, err)
        except FStreamError as exc:
            self.fail(exc)

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
        _settle(f)
        self.on_finished(f)

    def outstanding(self) -> list[InFlight]:
        with self._lock:
            return list(self._files.values())

    # -- replies -------------------------------------------------------------------------------
    def _read_loop(self) -> None:
        try:
            while True:
                ftype, fid, body = self.writer.recv()
                if ftype == Frame.BYE:
                    self.bye.set()
                    return
                if ftype == Frame.PONG:
                    ev = self._pongs.pop(int(body.get("n", -1)), None)
                    if ev:
                        ev.set()
                    continue
                with self._lock:
                    f = self._files.get(fid)
                if ftype == Frame.ERROR and fid == 0:
                    raise error_from_body(body)
                if f is None:
                    # a late reply about a file already settled (e.g. a second stream's write error
                    # after the first refused it): never a reason to fail the session's other files
                    log.debug("reply %s for file id %d that is no longer in flight", ftype.name, fid)
                    continue
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
        except FStreamError as exc:
            self.fail(exc)
        except OSError as exc:
            self.fail(NetworkError(f"control connection lost: {exc}"))

    def fail(self, exc: FStreamError) -> None:
        if self.error is None:
            self.error = exc
        self.failed.set()

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
            _settle(f)
        return unfinished


class Channel:
    """p data streams fed from one block queue, driven by a thread that pipelines files.

    :param cid: channel id.
    :param p: streams.
    :param pool: the owning ``ChannelPool`` (gives files and counters).
    """

    def __init__(self, cid: int, p: int, pool: "ChannelPool") -> None:
        self.id, self.p, self.pool = cid, p, pool
        self.cluster: str | None = None
        self.pp = 0
        self.blocks: queue.Queue[tuple[InFlight, int, int] | None] = queue.Queue(maxsize=max(2, 2 * p))
        self.socks: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.closing = False
        self.busy = False
        self.moved = 0  # bytes this channel put on the wire

    def start(self) -> None:
        sealers: list[DataSealer | None] = []
        for i in range(self.p):
            hs = self.pool.connector.connect_link(role="data", channel=self.id, stream=i)
            self.socks.append(hs.link.sock)
            sealers.append(DataSealer(hs.keys) if hs.keys is not None and hs.keys.encrypt else None)
        for i, s in enumerate(self.socks):
            t = threading.Thread(target=self._stream_loop, args=(s, sealers[i]), name=f"fstream-ch{self.id}-s{i}",
                                 daemon=True)
            t.start()
            self.threads.append(t)
        d = threading.Thread(target=self._drive, name=f"fstream-ch{self.id}-driver", daemon=True)
        d.start()
        self.threads.append(d)

    # -- driver: pipelining ------------------------------------------------------------------
    def _drive(self) -> None:
        pool = self.pool
        pipeline: collections.deque[InFlight] = collections.deque()
        try:
            while not self.closing and not pool.stopping.is_set():
                cluster = self.cluster
                while cluster is not None and len(pipeline) < self.pp + 1:
                    sf = pool.next_file(cluster)
                    if sf is None:
                        break
                    try:
                        pipeline.append(pool.control.open(sf))
                    except SourceModifiedError as exc:
                        pool.unopenable(sf, exc)  # that file only; the channel goes on
                if not pipeline:
                    self.busy = False
                    pool.wait_for_work(0.25)
                    continue
                self.busy = True
                cur = pipeline.popleft()
                while not cur.opened.wait(0.25):
                    if pool.stopping.is_set():
                        return
                if cur.finished.is_set() or cur.reply is None:
                    continue  # refused or failed at open; already reported
                self._send_file(cur)
                if self.pp == 0:
                    while not cur.finished.wait(0.25):  # no pipelining: wait for the round trip
                        if pool.stopping.is_set():
                            return
            for f in pipeline:
                pool.requeue_unstarted(f)
        except FStreamError as exc:
            pool.control.fail(exc)
        except Exception as exc:  # noqa: BLE001
            log.exception("channel %d driver failed", self.id)
            pool.control.fail(FStreamError(f"channel {self.id} failed: {exc}", retryable=True))
        finally:
            self.busy = False

    def _send_file(self, f: InFlight) -> None:
        reply = f.reply or {}
        existing = reply.get("existing_hash")
        if existing:
            if self.pool.control.verify and f.hash_future.result() == existing:
                self.pool.control.skip(f)
                return
            self.pool.control.reopen(f)  # our copy differs: now the receiver makes room for it
            while not f.opened.wait(0.25):
                if self.pool.stopping.is_set():
                    return
            if f.finished.is_set() or f.reply is None:
                return
            reply = f.reply
        missing = [(int(a), int(b)) for a, b in reply.get("missing", [])]
        blocks = [(f, off, n) for off, n in cut_blocks(missing, self.p, self.pool.block_size)]
        if not blocks:
            self.pool.control.all_sent(f)
            return
        f.blocks_left = len(blocks)
        for b in blocks:
            while True:
                try:
                    self.blocks.put(b, timeout=0.25)
                    break
                except queue.Full:
                    if self.pool.stopping.is_set() or self.pool.control.failed.is_set():
                        return

    # -- streams -------------------------------------------------------------------------------
    def _send_sealed(self, sock: socket.socket, sealer: DataSealer, f: InFlight, off: int, length: int) -> None:
        """One block read with pread, sealed (AAD = its header, whose length counts the tag) and sent."""
        chunks, got = [], 0
        while got < length:
            chunk = os.pread(f.fd, length - got, off + got)
            if not chunk:
                raise SourceModifiedError(f"{f.sf.src}: source shrank while being sent; not committed")
            chunks.append(chunk)
            got += len(chunk)
        header = pack_header(Frame.DATA, f.file_id, off, length + TAG_BYTES)
        sealed = sealer.seal(header, chunks[0] if len(chunks) == 1 else b"".join(chunks))
        sock.sendall(header, 0 if isinstance(sock, ssl.SSLSocket) else MSG_MORE)
        sock.sendall(sealed)
        self.pool.count(f, length)
        self.moved += length

    @staticmethod
    def _peer_closed(poller: select.poll) -> str | None:
        """Why the data connection is unusable (the receiver closed or reset it), or None. The receiver never
        sends on a data connection, so a hang-up, an error or end-of-stream is the only news it can bring."""
        for _fd, ev in poller.poll(0):
            if ev & select.POLLERR:
                return "connection error"
            if ev & (select.POLLHUP | getattr(select, "POLLRDHUP", 0)):
                return "closed by the receiver"
        return None

    def _next_block(self, sock: socket.socket) -> tuple[InFlight, int, int] | None:
        """The next block to send; while idle, notice a data connection the receiver closed and fail the
        session at once (it reconnects and resumes) instead of when the stall detector fires (issue 8, fault
        row "source modified mid-send")."""
        poller = select.poll()
        poller.register(sock.fileno(), getattr(select, "POLLRDHUP", 0))  # POLLHUP, POLLERR: always reported
        while True:
            try:
                return self.blocks.get(timeout=IDLE_CHECK)
            except queue.Empty:
                pass
            why = self._peer_closed(poller)
            if why is not None:
                raise ConnectionResetError(f"idle data stream {why}")

    def _stream_loop(self, sock: socket.socket, sealer: DataSealer | None = None) -> None:
        pool = self.pool
        tls = isinstance(sock, ssl.SSLSocket)
        fileno = sock.fileno()
        try:
            while True:
                item = self._next_block(sock)
                if item is None:
                    return
                f, off, length = item
                if not f.aborted and not f.finished.is_set():
                    delay = pool.pace(length)
                    if delay > 0 and pool.stopping.wait(delay):  # QoS pacing; stopping cuts it short
                        return
                    sent = length
                    if sealer is not None:
                        self._send_sealed(sock, sealer, f, off, length)
                    else:
                        sock.sendall(pack_header(Frame.DATA, f.file_id, off, length), 0 if tls else MSG_MORE)
                        sent = 0
                    while sent < length:
                        if tls:
                            # pread, never a file object: streams share the fd, and a shared seek
                            # offset would interleave two blocks' bytes (caught by the checksum)
                            chunk = os.pread(f.fd, min(TLS_CHUNK, length - sent), off + sent)
                            sock.sendall(chunk)
                            n = len(chunk)
                        else:
                            n = os.sendfile(fileno, f.fd, off + sent, length - sent)
                        if n == 0:
                            raise SourceModifiedError(f"{f.sf.src}: source shrank while being sent; not committed")
                        sent += n
                        pool.count(f, n)
                        self.moved += n
                    with f.lock:
                        f.bytes_sent += length
                        f.blocks_left -= 1
                        last = f.blocks_left == 0
                    if last:
                        pool.control.all_sent(f)
        except SourceModifiedError as exc:
            pool.control.abort(item[0], exc)  # type: ignore[possibly-undefined]
            pool.control.fail(NetworkError(f"data stream closed after a short read: {exc}"))
        except OSError as exc:
            if not (self.closing or pool.stopping.is_set()):
                pool.control.fail(NetworkError(f"data stream of channel {self.id} lost: {exc}"))

    def stop(self) -> None:
        """Close the channel: let queued blocks drain, then end streams."""
        self.closing = True
        for _ in range(self.p):
            self.blocks.put(None)

    def kill(self) -> None:
        self.closing = True
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        while True:
            try:
                self.blocks.get_nowait()
            except queue.Empty:
                break
        for _ in range(self.p):
            try:
                self.blocks.put_nowait(None)
            except queue.Full:
                break

    def join(self, timeout: float = 10.0) -> None:
        for t in self.threads:
            t.join(timeout)
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass


class ChannelPool:
    """All channels of one session, the per-cluster file queues and the byte counters.

    :param control: the session's control connection.
    :param connector: opens data connections.
    :param block_size: bytes per data block.
    :param max_passive: passive channels kept for reuse; beyond this the idle ones are closed.
    """

    def __init__(self, control: ControlSession, connector: Connector, block_size: int, max_passive: int = 8) -> None:
        self.control, self.connector, self.block_size, self.max_passive = control, connector, block_size, max_passive
        self.channels: dict[int, Channel] = {}
        self.queues: dict[str, collections.deque[SrcFile]] = collections.defaultdict(collections.deque)
        self.cond = threading.Condition()
        self.stopping = threading.Event()
        self._next_cid = 1
        self._bytes = 0
        self._cluster_bytes: dict[str, int] = collections.defaultdict(int)
        self._count_lock = threading.Lock()
        self._pending: dict[str, list[int]] = {}  # cluster -> [files, bytes] queued
        self.on_unopenable: Callable[[SrcFile, FStreamError], None] | None = None
        self.bucket: TokenBucket | None = None
        self._moved_seen: dict[int, int] = {}

    # -- files ---------------------------------------------------------------------------------
    def add_files(self, files: list[SrcFile]) -> None:
        with self.cond:
            for sf in files:
                self.queues[sf.cluster].append(sf)
                tally = self._pending.setdefault(sf.cluster, [0, 0])
                tally[0] += 1
                tally[1] += sf.size
            self.cond.notify_all()

    def drain(self) -> list[SrcFile]:
        """Take every queued file out (the session is ending)."""
        with self.cond:
            out = [sf for q in self.queues.values() for sf in q]
            self.queues.clear()
            self._pending.clear()
        return out

    def requeue_unstarted(self, f: InFlight) -> None:
        """A file opened ahead but never sent (channel closing): abort it quietly and queue it again."""
        if not f.finished.is_set():
            try:
                self.control.writer.send(Frame.ABORT, {"reason": "channel closed"}, f.file_id)
            except FStreamError:
                pass
            self.control._finish(f, "retry", None)  # noqa: SLF001 - same module family

    def unopenable(self, sf: SrcFile, exc: FStreamError) -> None:
        """A queued source could not be opened (vanished, unreadable): report it, keep the session."""
        if self.on_unopenable is not None:
            self.on_unopenable(sf, exc)

    def next_file(self, cluster: str) -> SrcFile | None:
        with self.cond:
            q = self.queues.get(cluster)
            if not q:
                return None
            sf = q.popleft()
            tally = self._pending[cluster]
            tally[0] -= 1
            tally[1] -= sf.size
            return sf

    def pending(self) -> dict[str, tuple[int, int]]:
        """Per cluster, (files, bytes) queued and not yet opened (kept as files come and go, not recounted)."""
        with self.cond:
            return {c: (n, b) for c, (n, b) in self._pending.items()}

    def wait_for_work(self, timeout: float) -> None:
        with self.cond:
            self.cond.wait(timeout)

    def count(self, f: InFlight, n: int) -> None:
        with self._count_lock:
            self._bytes += n
            self._cluster_bytes[f.sf.cluster] += n

    def counters(self) -> tuple[int, dict[str, int]]:
        with self._count_lock:
            return self._bytes, dict(self._cluster_bytes)

    def set_rates(self, rates: dict[str, float | None]) -> None:
        """Cap the session's total rate at the sum of the clusters' caps (bits/s; no cap when none is given).

        One bucket for the whole session, not one per cluster: when a cluster runs out of files
        mid-interval, the others may use its share at once, so the total stays at the target.
        """
        caps = [r for r in rates.values() if r]
        total = sum(caps) if caps else None
        with self._count_lock:
            if self.bucket is None:
                if total:
                    self.bucket = TokenBucket(total, now=time.monotonic())
            else:
                self.bucket.set_rate(total, time.monotonic())

    def pace(self, nbytes: int) -> float:
        """Seconds to wait before sending ``nbytes`` (0 when unpaced)."""
        if self.bucket is None:
            return 0.0
        with self._count_lock:
            return self.bucket.reserve(nbytes, time.monotonic())

    # -- layout --------------------------------------------------------------------------------
    def apply(self, layouts: dict[str, tuple[int, int, int]]) -> dict[str, int]:
        """Make the channels match ``{cluster: (cc, p, pp)}`` (smart distribution); return what was done."""
        with self.cond:
            states = [ChannelState(c.id, c.p, c.cluster, c.busy) for c in self.channels.values() if not c.closing]
            plan = plan_channels(states, [ClusterLayout(k, cc, p, pp) for k, (cc, p, pp) in layouts.items()],
                                 max_passive=self.max_passive)
            for cid, cluster in plan.reassign:
                self.channels[cid].cluster = cluster
            for cid in plan.passivate:
                self.channels[cid].cluster = None
            closed = [self.channels.pop(cid) for cid in plan.close if cid in self.channels]
            for ch in closed:
                ch.cluster = None
                ch.stop()
            for ch in self.channels.values():
                if ch.cluster is not None and ch.cluster in layouts:
                    ch.pp = layouts[ch.cluster][2]
            self.cond.notify_all()
        for req in plan.open:
            for _ in range(req.count):
                ch = Channel(self._next_cid, req.p, self)
                self._next_cid += 1
                ch.cluster = req.cluster
                ch.pp = layouts[req.cluster][2]
                try:
                    ch.start()
                except ProtocolError as exc:
                    # the receiver ended the session (its reason arrives on the control connection): report that
                    if "unknown session" in str(exc) and self.control.failed.wait(2.0) and self.control.error:
                        raise self.control.error from exc
                    raise
                with self.cond:
                    self.channels[ch.id] = ch
                    self.cond.notify_all()
        for ch in closed:
            threading.Thread(target=ch.join, daemon=True).start()
        return {"opened": plan.opened, "reassigned": len(plan.reassign), "passivated": len(plan.passivate),
                "closed": len(closed)}

    def active_layout(self) -> dict[str, tuple[int, int, int]]:
        """What is in force now: per cluster (channels, p, pp)."""
        out: dict[str, tuple[int, int, int]] = {}
        with self.cond:
            for ch in self.channels.values():
                if ch.cluster is None or ch.closing:
                    continue
                cc, p, pp = out.get(ch.cluster, (0, 0, 0))
                out[ch.cluster] = (cc + 1, max(p, ch.p), max(pp, ch.pp))
        return out

    def working_channels(self) -> dict[str, int]:
        """Per cluster, channels that moved data since the last call or are busy now (not merely assigned)."""
        out: dict[str, int] = {}
        with self.cond:
            for ch in self.channels.values():
                moved, ch_last = ch.moved, self._moved_seen.get(ch.id, 0)
                self._moved_seen[ch.id] = moved
                if ch.cluster is not None and (ch.busy or moved > ch_last):
                    out[ch.cluster] = out.get(ch.cluster, 0) + 1
        return out

    def passive_count(self) -> int:
        with self.cond:
            return sum(1 for c in self.channels.values() if c.cluster is None and not c.closing)

    def shutdown(self, graceful: bool) -> None:
        self.stopping.set()
        with self.cond:
            self.cond.notify_all()
        chans = list(self.channels.values())
        for ch in chans:
            ch.stop() if graceful else ch.kill()
        for ch in chans:
            ch.join(timeout=10 if graceful else 3)
