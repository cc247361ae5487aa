"""One channel: p data streams sharing a block queue, a driver keeping pp files opened ahead, sendfile or sealed blocks.

A channel of one stream (p = 1, what small files get) has no stream thread: its driver sends each file's blocks
itself (issue 43). The hand-off of every file to a stream thread and back cost the sender a quarter of its CPU on
2,000 one-byte files (pinned loopback: 475 -> 361 ms, context switches 3,700 -> 1,900, medians of 10 alternating
runs); with p > 1 the streams still take a file's blocks in parallel."""

from __future__ import annotations

import collections
import logging
import os
import queue
import select
import socket
import ssl
import threading
from typing import Protocol

from fstream_provider.watch.sources import SrcFile
from transfer_agent.errors import FStreamError, NetworkError, SourceModifiedError
from transfer_agent.sending.connector import Connector
from transfer_agent.sending.control import KEEP_MAX_S, ControlSession
from transfer_agent.sending.inflight import InFlight, cut_blocks, hold, release
from transfer_agent.storage import gil_meter
from transfer_agent.wire.batch import BATCH_MAX
from transfer_agent.wire.protocol import MAX_BLOCK, MSG_MORE, VERSION, Frame, pack_header
from transfer_agent.wire.secure import TAG_BYTES, DataSealer

log = logging.getLogger("fstream.sender")
TLS_CHUNK = 1 << 20  # bytes read and encrypted per call when the channel is TLS (no zero-copy there)
IDLE_CHECK = 0.25  # seconds: how often an idle data stream checks that its connection still stands
KEEP_BLOCK_MAX = 256 << 10  # a stream keeps no COMMIT over a larger block (``ControlSession.all_sent``, issue 29)


MAX_SEALED_BLOCK = MAX_BLOCK - TAG_BYTES  # a sealed block and its tag must fit the frame limit


class PoolView(Protocol):
    """What a channel needs from the pool that owns it (``channels.ChannelPool``), so the arrow runs one way."""

    connector: Connector
    control: ControlSession
    stopping: threading.Event
    block_size: int

    def next_files(self, cluster: str, n: int) -> list[SrcFile]: ...
    def unopenable(self, sf: SrcFile, exc: FStreamError) -> None: ...
    def wait_for_work(self, timeout: float) -> None: ...
    def requeue_unstarted(self, f: InFlight) -> None: ...
    def count(self, f: InFlight, n: int) -> None: ...
    def pace(self, nbytes: int) -> float: ...


class Channel:
    """p data streams fed from one block queue, driven by a thread that pipelines files.

    :param cid: channel id.
    :param p: streams.
    :param pool: the owning pool (``channels.ChannelPool``; gives files, counters and pacing).
    """

    def __init__(self, cid: int, p: int, pool: PoolView) -> None:
        self.id, self.p, self.pool = cid, p, pool
        self.cluster: str | None = None
        self.pp = 0
        self.blocks: queue.Queue[tuple[InFlight, int, int] | None] = queue.Queue(maxsize=max(2, 2 * p))
        self.socks: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.closing = False
        self.busy = False
        self.carrying: str | None = None  # cluster of the file being sent (a reassigned channel finishes it first)
        self.moved = 0  # bytes this channel put on the wire
        self.version = VERSION  # the protocol version its connections speak (set as they open)
        self._direct: tuple[socket.socket, DataSealer | None] | None = None  # p = 1: the driver's own stream

    def start(self) -> None:
        sealers: list[DataSealer | None] = []
        for i in range(self.p):
            hs = self.pool.connector.connect_link(role="data", channel=self.id, stream=i)
            self.version = getattr(hs, "version", VERSION)  # issue 30: the connection's version, in every header
            self.socks.append(hs.link.sock)
            sealers.append(DataSealer(hs.keys) if hs.keys is not None and hs.keys.encrypt else None)
        if self.p == 1:  # the driver sends its blocks itself: no hand-off to a stream thread and back per file
            self._direct = (self.socks[0], sealers[0])
        else:
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
        poller = self._poller(self._direct[0]) if self._direct is not None else None
        try:
            while not self.closing and not pool.stopping.is_set():
                self._refill(pipeline)
                if not pipeline:
                    self.busy = False
                    self._idle(poller)
                    pool.wait_for_work(0.25)
                    continue
                self.busy = True
                cur = pipeline.popleft()
                self.carrying = cur.sf.cluster
                if not cur.opened.is_set():
                    self._idle(poller)
                while not cur.opened.wait(0.25):
                    if pool.stopping.is_set():
                        return
                    self._idle(poller)
                if cur.finished.is_set() or cur.reply is None:
                    continue  # refused or failed at open; already reported
                self._send_file(cur, pipeline)
                if self.pp == 0:
                    self._idle(poller)  # a COMMIT kept (under an earlier pp) goes before waiting for its answer
                    while not cur.finished.wait(0.25):  # no pipelining: wait for the round trip
                        if pool.stopping.is_set():
                            return
            for f in pipeline:
                pool.requeue_unstarted(f)
            if self._direct is not None:
                pool.control.flush_commits()
        except SourceModifiedError as exc:  # a direct send read short: as a stream's (``_stream_loop``)
            pool.control.fail(NetworkError(f"data stream closed after a short read: {exc}"))
        except OSError as exc:
            if not (self.closing or pool.stopping.is_set()):
                pool.control.fail(NetworkError(f"data stream of channel {self.id} lost: {exc}"))
        except FStreamError as exc:
            pool.control.fail(exc)
        except Exception as exc:  # noqa: BLE001
            log.exception("channel %d driver failed", self.id)
            pool.control.fail(FStreamError(f"channel {self.id} failed: {exc}", retryable=True))
        finally:
            self.busy = False
            self._end_streams()

    def _refill(self, pipeline: collections.deque[InFlight]) -> None:
        """Open files ahead, up to ``pp`` beyond the one being sent, every file ready now in one write (issue 29:
        one OPEN_BATCH with a receiver that speaks batch). Nothing waits for a batch to fill: when the next file
        is not answered yet (the driver would wait anyway), or nothing is in the pipeline, whatever room there is
        is filled now; while the next file is ready to go, the pipeline is topped up once a quarter of it is free,
        so that refills carry several OPENs rather than one each."""
        cluster = self.cluster
        pool = self.pool
        while cluster is not None:
            room = self.pp + 1 - len(pipeline)
            if room <= 0 or (pipeline and pipeline[0].opened.is_set() and room < max(1, (self.pp + 1) // 4)):
                return
            sfs = pool.next_files(cluster, min(room, BATCH_MAX))
            if not sfs:
                return
            if len(sfs) == 1:
                try:
                    pipeline.append(pool.control.open(sfs[0]))
                except SourceModifiedError as exc:
                    pool.unopenable(sfs[0], exc)  # that file only; the channel goes on
            else:
                pipeline.extend(pool.control.open_many(sfs, pool.unopenable))

    def _end_streams(self) -> None:
        """Queue one end marker per stream, behind every block this driver queued (only the driver queues
        blocks, so the file being sent when the channel closed is sent whole before its streams end)."""
        for t in self.threads[:self.p] if self._direct is None else ():
            while t.is_alive():
                try:
                    self.blocks.put(None, timeout=0.25)
                    break
                except queue.Full:
                    continue

    def _idle(self, poller: select.poll | None) -> None:
        """The driver is about to wait: with its own stream (p = 1), the COMMITs it kept go (every wait, or a file
        waited for at pp = 0 whose COMMIT was kept stalls until something else flushes: a deadline test in CI, 2 s),
        and a data connection the receiver closed fails the session at once (as an idle stream's ``_next_block``)."""
        if poller is None:
            return
        self.pool.control.flush_commits()
        why = self._peer_closed(poller)
        if why is not None:
            raise ConnectionResetError(f"idle data stream {why}")

    def _send_file(self, f: InFlight, pipeline: collections.deque[InFlight] | None = None) -> None:
        reply = f.reply or {}
        existing = reply.get("existing_hash")
        if existing:
            if self.pool.control.verify and f.hash_future.result() == existing:
                self.pool.control.skip(f)
                return
            self.pool.control.reopen(f)  # our copy differs: now the receiver makes room for it
            self._idle(self._poller(self._direct[0]) if self._direct is not None else None)
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
        if self._direct is not None:
            sock, sealer = self._direct
            for i, b in enumerate(blocks):  # the last block's COMMIT may wait for the next file's first write
                nxt = i + 1 < len(blocks) or bool(pipeline and pipeline[0].opened.is_set())
                if not self._send_block(sock, sealer, b, nxt):
                    return
            return
        for b in blocks:
            while True:
                try:
                    self.blocks.put(b, timeout=0.25)
                    break
                except queue.Full:
                    if self.pool.stopping.is_set() or self.pool.control.failed.is_set():
                        return

    # -- streams -------------------------------------------------------------------------------
    def _send_block(self, sock: socket.socket, sealer: DataSealer | None, item: tuple[InFlight, int, int],
                    keep: bool) -> bool:
        """Send one block on ``sock`` (sendfile, or sealed, or through TLS), count it, and COMMIT its file when it
        was the last; ``keep``: the caller has its next block at hand, so that COMMIT may wait for it
        (``ControlSession.all_sent``). False when the session stopped during a pacing wait."""
        pool = self.pool
        f, off, length = item
        if not hold(f):  # settled (refused, aborted): its blocks are dropped
            return True
        try:
            delay = pool.pace(length)
            # no COMMIT kept over a wait or a long send, nor longer than KEEP_MAX_S and this block
            pool.control.flush_commits(0.0 if delay > 0 or length > KEEP_BLOCK_MAX else KEEP_MAX_S)
            if delay > 0 and pool.stopping.wait(delay):  # QoS pacing; stopping cuts it short
                return False
            tls = isinstance(sock, ssl.SSLSocket)
            sent = 0  # bytes of this block that left: counted into the file once, whole or cut short
            try:
                if sealer is not None:
                    self._send_sealed(sock, sealer, f, off, length)
                    sent = length
                else:
                    sock.sendall(pack_header(Frame.DATA, f.file_id, off, length, self.version), 0 if tls else MSG_MORE)
                while sent < length:
                    if tls:
                        # pread, never a file object: streams share the fd, and a shared seek
                        # offset would interleave two blocks' bytes (caught by the checksum)
                        chunk = os.pread(f.fd, min(TLS_CHUNK, length - sent), off + sent)
                        sock.sendall(chunk)
                        n = len(chunk)
                    else:
                        t = gil_meter.clock()
                        n = os.sendfile(sock.fileno(), f.fd, off + sent, length - sent)
                        gil_meter.add(gil_meter.clock() - t)
                    if n == 0:
                        raise SourceModifiedError(f"{f.sf.src}: source shrank while being sent; not committed")
                    sent += n
                    pool.count(f, n)
                    self.moved += n
            except SourceModifiedError as exc:
                self._block_sent(f, sent, length)
                pool.control.abort(f, exc)
                raise
            except BaseException:
                self._block_sent(f, sent, length)  # a block cut short still counts what left
                raise
            if self._block_sent(f, sent, length):  # the last: its COMMIT may go with the next ones (``keep``)
                pool.control.all_sent(f, keep=keep)
        finally:
            release(f)
        return True

    def _send_sealed(self, sock: socket.socket, sealer: DataSealer, f: InFlight, off: int, length: int) -> None:
        """One block read with preadv into the connection's buffer, sealed into its other buffer (AAD = its header,
        whose length counts the tag) and sent."""
        sealed, plain = sealer.buffers.views(length + TAG_BYTES, length)
        got = 0
        while got < length:
            k = os.preadv(f.fd, [plain[got:]], off + got)
            if not k:
                raise SourceModifiedError(f"{f.sf.src}: source shrank while being sent; not committed")
            got += k
        header = pack_header(Frame.DATA, f.file_id, off, length + TAG_BYTES, self.version)
        sealer.seal_into(header, plain, sealed)
        sock.sendall(header, 0 if isinstance(sock, ssl.SSLSocket) else MSG_MORE)
        sock.sendall(sealed)
        self.pool.count(f, length)
        self.moved += length

    @staticmethod
    def _block_sent(f: InFlight, sent: int, length: int) -> bool:
        """Count the ``sent`` bytes of one block of ``f`` (of ``length``) that left, under ``f.lock`` once per block
        (issue 42: it was taken per ``sendfile``/``pread`` call), and the block itself when it left whole: True when
        it was the file's last."""
        with f.lock:
            f.bytes_sent += sent
            if sent < length:
                return False
            f.blocks_left -= 1
            return f.blocks_left == 0

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

    @staticmethod
    def _poller(sock: socket.socket) -> select.poll:
        """A poller for news on an idle data connection (``_peer_closed``)."""
        poller = select.poll()
        poller.register(sock.fileno(), getattr(select, "POLLRDHUP", 0))  # POLLHUP, POLLERR: always reported
        return poller

    def _next_block(self, sock: socket.socket) -> tuple[InFlight, int, int] | None:
        """The next block to send; while idle, notice a data connection the receiver closed and fail the
        session at once (it reconnects and resumes) instead of when the stall detector fires (issue 8, fault
        row "source modified mid-send")."""
        try:
            return self.blocks.get_nowait()
        except queue.Empty:
            self.pool.control.flush_commits()  # no block at hand: the COMMITs this stream kept go now
        poller = self._poller(sock)
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
        try:
            while True:
                item = self._next_block(sock)
                if item is None:
                    pool.control.flush_commits()
                    return
                if not self._send_block(sock, sealer, item, not self.blocks.empty()):
                    return
        except SourceModifiedError as exc:  # its file was aborted (``_send_block``)
            pool.control.fail(NetworkError(f"data stream closed after a short read: {exc}"))
        except OSError as exc:
            if not (self.closing or pool.stopping.is_set()):
                pool.control.fail(NetworkError(f"data stream of channel {self.id} lost: {exc}"))
        except FStreamError as exc:  # sending the COMMITs this stream kept: the control connection failed
            if not pool.stopping.is_set():
                pool.control.fail(exc)

    def stop(self) -> None:
        """Close the channel: the driver queues the rest of the file it is sending, takes no new file, hands the
        files opened ahead back to the pool and then ends the streams (``_end_streams``), which drain the queue.

        (It used to put the end markers here, from the pool's thread: while the driver was still queueing a
        file's blocks behind them, the streams ended mid-file and the rest was never sent.)"""
        self.closing = True

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


