"""The receiver's side of ``fstream doctor`` (issue 30): host facts, a bounded disk probe, a discarding rate sink.

A connection whose authenticated HELLO says ``role: "doctor"`` is served here (``Receiver._handle`` dispatches it
after the handshake, so an unauthenticated peer gets nothing); it opens no session and nothing lands:

* ``probe: "control"``: requests on the control link, one at a time: ``PING`` → ``PONG`` with this host's wall
  clock (the doctor's clock skew), ``FACTS`` → sysctls, free space of the root, the interface the connection
  arrived on and its MTU, TCP_INFO (``wire.hostnet``), native hashing in use or not (``tree_hash``), ``DISK`` →
  a write of at most ``DISK_MAX_BYTES`` within ``DISK_MAX_S`` with fdatasync into a temp file under the key's
  subtree, removed after (one at a time per receiver), ``BYE`` ends it; so does ``IDLE_S`` without a request.
* ``probe: "sink"``: after WELCOME the client streams raw bytes; they are read and dropped for ``seconds`` (at most
  ``SINK_MAX_S``) from the first byte, then ``BYE`` reports the bytes and when they arrived (this host's monotonic
  clock, one sample per ``SAMPLE_S``); the client stops sending when it sees the report, and what was still on
  its way is dropped until it closes (at most ``SINK_DRAIN_S``). No half-close: it would end a TLS connection.

At most ``MAX_CONNECTIONS`` doctor connections are served at once, each for at most ``MAX_LIFETIME_S`` whatever it
asks (a control connection is then told so and closed; a socket shutdown backs that up). A key may run one disk probe
per ``DISK_EVERY_S`` (a second is refused naming when it may run again), of at most what its quota has left. The
probe's temp file (``.fstream-doctor-*.tmp``) is removed after it; ``start`` (as the receiver starts) removes any
older than ``STALE_S`` that a killed receiver left in the root or a key's subtree directory (no walk of the tree).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import secrets
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from transfer_agent.errors import FStreamError, NetworkError, ProtocolError
from transfer_agent.receiving.keyring import ReceiverKey
from transfer_agent.storage import tree_hash
from transfer_agent.storage.paths import open_parent
from transfer_agent.wire import hostnet
from transfer_agent.wire.protocol import Frame
from transfer_agent.wire.secure import ControlLink

MAX_CONNECTIONS = 64
IDLE_S = 60.0
MAX_LIFETIME_S = 120.0  # a doctor connection's whole life, PINGs or not
LIFETIME_GRACE_S = 5.0  # then its socket is shut down, whatever it is doing
SINK_MAX_S = 10.0
SINK_WAIT_S = 10.0  # for a sink's first byte
SINK_DRAIN_S = 10.0  # after a sink's report, for the client to see it and close
SAMPLE_S = 0.05
DISK_MAX_BYTES = 256 << 20
DISK_MAX_S = 10.0
DISK_SYNC_EVERY = 16 << 20  # fdatasync this often: the rate is of bytes on the disk, not in the page cache
DISK_MIN_FREE_SHARE = 4  # never write more than a quarter of the free space
DISK_EVERY_S = 60.0  # one disk probe per key this often
TEMP_PREFIX, TEMP_SUFFIX = ".fstream-doctor-", ".tmp"
STALE_S = 3600.0  # temp files older than this are a killed receiver's leftovers


def _number(body: dict[str, Any], name: str, default: float, limit: float) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= limit:
        raise ProtocolError(f"malformed doctor request: {name} must be a number in (0, {limit:g}]")
    return float(value)


def disk_probe(root: str, subtree: str, nbytes: int, max_s: float, stop: threading.Event) -> dict[str, Any]:
    """Write up to ``nbytes`` (or for ``max_s``) into a new temp file under ``root/subtree`` with fdatasync every
    ``DISK_SYNC_EVERY`` and at the end; remove it; return bytes, seconds, rate (bits/s) and the temp file's name."""
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        name = f"{TEMP_PREFIX}{secrets.token_hex(6)}{TEMP_SUFFIX}"
        try:
            dir_fd, base = open_parent(root_fd, f"{subtree}/{name}" if subtree else name, create=False)
        except FileNotFoundError:
            return {"error": f"this key's subtree {subtree}/ does not exist under the root yet (the probe writes "
                             "only there and creates no directory)"}
        try:
            free = os.fstatvfs(dir_fd)
            nbytes = min(nbytes, free.f_bavail * free.f_frsize // DISK_MIN_FREE_SHARE)
            if nbytes < 1 << 20:
                return {"error": "not probed: less than 4 MiB free"}
            fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dir_fd)
            try:
                block = os.urandom(1 << 20)  # incompressible: a compressing filesystem must not flatter the rate
                written = synced = 0
                t0 = time.monotonic()
                while written < nbytes and time.monotonic() - t0 < max_s and not stop.is_set():
                    written += os.write(fd, block[:min(len(block), nbytes - written)])
                    if written - synced >= DISK_SYNC_EVERY:
                        os.fdatasync(fd)
                        synced = written
                os.fdatasync(fd)
                seconds = time.monotonic() - t0
            finally:
                os.close(fd)
                os.unlink(base, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        return {"error": "disk full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else str(exc.strerror)}
    finally:
        os.close(root_fd)
    return {"bytes": written, "seconds": seconds, "bps": written * 8 / seconds if seconds > 0 else 0.0,
            "file": name, "where": f"{subtree}/" if subtree else "the root", "removed": True}


def sink(conn: socket.socket, seconds: float, stop: threading.Event) -> dict[str, Any]:
    """Read and drop what arrives for ``seconds`` from its first byte (less if the peer closes first, nothing if it
    sends nothing within ``SINK_WAIT_S``); return the bytes and ``[[monotonic time, bytes so far], ...]``."""
    view = memoryview(bytearray(1 << 20))
    end = time.monotonic() + SINK_WAIT_S
    total, eof = 0, False
    samples: list[list[float]] = []
    last: list[float] = []
    conn.settimeout(0.5)
    while not stop.is_set() and time.monotonic() < end:
        try:
            n = conn.recv_into(view)
        except TimeoutError:
            continue
        except OSError:
            break
        if n == 0:
            eof = True
            break
        total += n
        last = [round(time.monotonic(), 6), total]
        if not samples:
            end = last[0] + seconds  # the window: from the first byte
        if not samples or last[0] - samples[-1][0] >= SAMPLE_S:
            samples.append(last)
    if last and samples[-1] is not last:
        samples.append(last)
    return {"bytes": total, "eof": eof, "samples": samples}


def drain(conn: socket.socket, limit_s: float, stop: threading.Event) -> None:
    """After the sink's report: drop what is still on its way until the peer closes (at most ``limit_s``), so that
    closing sends no reset that could overtake the report."""
    view = memoryview(bytearray(1 << 20))
    end = time.monotonic() + limit_s
    while not stop.is_set() and time.monotonic() < end:
        if not hostnet.readable(conn, 0.5):
            continue
        try:
            if conn.recv_into(view) == 0:
                return
        except TimeoutError:
            continue
        except OSError:
            return


def _request(conn: socket.socket, idle_s: float, stop: threading.Event) -> bool:
    """Wait until a request arrives: False after ``idle_s`` without one, or once the receiver stops."""
    end = time.monotonic() + idle_s
    while not stop.is_set() and time.monotonic() < end:
        if hostnet.readable(conn, 0.5):
            return True
    return False


def sweep_stale(root: str, subtrees: Iterable[str], max_age: float = STALE_S) -> list[str]:
    """Remove ``.fstream-doctor-*.tmp`` regular files older than ``max_age`` from the root and the ``subtrees``
    directories (each listed once; nothing below them walked; symlinks not followed); their relative paths."""
    removed: list[str] = []
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return removed  # no root yet: nothing left behind
    now = time.time()
    try:
        for sub in sorted({"", *subtrees}):
            try:
                dir_fd, _base = open_parent(root_fd, f"{sub}/x" if sub else "x", create=False)
            except (OSError, FStreamError):
                continue
            try:
                with os.scandir(dir_fd) as entries:
                    for e in entries:
                        if not (e.name.startswith(TEMP_PREFIX) and e.name.endswith(TEMP_SUFFIX)):
                            continue
                        try:
                            st = e.stat(follow_symlinks=False)
                            if stat.S_ISREG(st.st_mode) and now - st.st_mtime > max_age:
                                os.unlink(e.name, dir_fd=dir_fd)
                                removed.append(f"{sub}/{e.name}" if sub else e.name)
                        except OSError:
                            continue
            finally:
                os.close(dir_fd)
    finally:
        os.close(root_fd)
    return removed


class DoctorService:
    """Serves ``fstream doctor``'s connections of one receiver.

    :param root: the receiver's destination root (the disk probe writes under a key's subtree of it).
    :param stop: set when the receiver stops: every probe ends.
    :param log: the receiver's logger.
    :param quota_used: the bytes a key holds under its subtree (``quota.Quotas.used``): a key with a quota probes
        at most what it has left; None: quotas are not looked at.
    """

    def __init__(self, *, root: str, stop: threading.Event, log: logging.Logger,
                 quota_used: Callable[[ReceiverKey], int] | None = None) -> None:
        self.root, self._stop, self.log, self._quota_used = root, stop, log, quota_used
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._disk = threading.Lock()
        self._disk_runs: dict[str, float] = {}  # key id -> when its last disk probe started (monotonic)

    def start(self, subtrees: Iterable[str]) -> list[str]:
        """As the receiver starts: remove stale temp files (``sweep_stale``) of earlier runs; their paths."""
        removed = sweep_stale(self.root, subtrees)
        for rel in removed:
            self.log.info("removed the stale doctor temp file %s (older than %.0f s)", rel, STALE_S)
        return removed

    def serve(self, conn: socket.socket, link: ControlLink, hello: dict[str, Any], key: ReceiverKey,
              peer: str) -> None:
        """Serve one authenticated doctor connection to its end (``hello``: the client's HELLO; ``key``: the key it
        authenticated with), for at most ``MAX_LIFETIME_S``."""
        if not self._slots.acquire(blocking=False):
            link.send(Frame.ERROR, {"kind": "refused", "retryable": True,
                                    "message": f"too many doctor probes at once (limit {MAX_CONNECTIONS})"})
            return
        end = time.monotonic() + MAX_LIFETIME_S
        cut = threading.Timer(MAX_LIFETIME_S + LIFETIME_GRACE_S, _shut, args=(conn,))
        cut.daemon = True
        try:
            cut.start()
            probe = hello.get("probe")
            if probe == "control":
                self._control(conn, link, key, peer, end)
            elif probe == "sink":
                seconds = _number(hello, "seconds", 3.0, SINK_MAX_S)
                link.send(Frame.WELCOME, {"probe": "sink", "seconds": seconds})
                link.send(Frame.BYE, sink(conn, seconds, self._stop))
                drain(conn, SINK_DRAIN_S, self._stop)
            else:
                msg = f"malformed HELLO: doctor probe {probe!r} (expected 'control' or 'sink')"
                link.send(Frame.ERROR, {"kind": "protocol", "message": msg})
                raise ProtocolError(msg)
        finally:
            cut.cancel()
            self._slots.release()

    def _control(self, conn: socket.socket, link: ControlLink, key: ReceiverKey, peer: str, end: float) -> None:
        link.send(Frame.WELCOME, {"probe": "control"})
        while True:
            left = end - time.monotonic()
            if left <= 0:
                link.send(Frame.ERROR, {"kind": "refused", "retryable": True, "message": (
                    f"doctor connection closed: open for {MAX_LIFETIME_S:g} s, the limit of one; connect again")})
                self.log.info("doctor %s: connection closed at its lifetime limit (%g s)", peer, MAX_LIFETIME_S)
                return
            conn.settimeout(min(IDLE_S, left + LIFETIME_GRACE_S))  # a request that started arriving is read whole
            if not _request(conn, min(IDLE_S, left), self._stop):
                if self._stop.is_set() or time.monotonic() < end:
                    return  # the receiver stops, or idle for IDLE_S
                continue
            try:
                ftype, _fid, body = link.recv()
            except NetworkError:
                return
            if ftype == Frame.PING:
                link.send(Frame.PONG, {"n": body.get("n"), "clock": time.time()})
            elif ftype == Frame.FACTS:
                link.send(Frame.FACTS, {**hostnet.host_facts(conn), "root": hostnet.free_space(self.root),
                                        "native_hashing": tree_hash.native_status()})
            elif ftype == Frame.DISK:
                link.send(Frame.DISK, self._disk_probe(body, key, peer))
            elif ftype == Frame.BYE:
                link.send(Frame.BYE, {})
                return
            else:
                raise ProtocolError(f"unexpected {ftype.name} frame on a doctor connection")

    def _disk_probe(self, body: dict[str, Any], key: ReceiverKey, peer: str) -> dict[str, Any]:
        nbytes = int(_number(body, "bytes", 64 << 20, DISK_MAX_BYTES))
        max_s = _number(body, "seconds", 2.0, DISK_MAX_S)
        if not self._disk.acquire(blocking=False):
            return {"error": "another disk probe is running on this receiver; try again in a few seconds"}
        try:
            now = time.monotonic()
            last = self._disk_runs.get(key.key_id)
            if last is not None and now - last < DISK_EVERY_S:
                wait = DISK_EVERY_S - (now - last)
                return {"error": f"disk probe refused: key {key.key_id!r} ran one {now - last:.0f} s ago and may run "
                                 f"one per {DISK_EVERY_S:g} s: try again in {math.ceil(wait)} s",
                        "retry_after_s": round(wait, 1)}
            if key.quota is not None and self._quota_used is not None:
                try:
                    left = key.quota - self._quota_used(key)
                except OSError as exc:
                    return {"error": f"not probed: the bytes key {key.key_id!r} holds cannot be counted: "
                                     f"{exc.strerror}"}
                if left < 1 << 20:
                    return {"error": f"not probed: key {key.key_id!r} has {max(left, 0)} bytes of its quota left "
                                     "(the probe writes 1 MiB at least)"}
                nbytes = min(nbytes, left)
            self._disk_runs[key.key_id] = now  # whatever its outcome: one per key per DISK_EVERY_S
            try:
                result = disk_probe(self.root, key.subtree, nbytes, max_s, self._stop)
            except FStreamError as exc:  # a symlink or non-directory on the way to the key's subtree
                result = {"error": str(exc)}
            except OSError as exc:  # the root itself cannot be opened
                result = {"error": f"cannot open the root: {exc.strerror}"}
        finally:
            self._disk.release()
        self.log.info("doctor %s: disk probe for key %s %s", peer, key.key_id, result.get("error") or
                      f"{result['bytes']} bytes in {result['seconds']:.2f} s")
        return result


def _shut(conn: socket.socket) -> None:
    """End a connection past its lifetime, whatever its thread is doing (the plain socket's shutdown: also under
    TLS); its reads and writes fail, and the serving thread ends."""
    try:
        socket.socket.shutdown(conn, socket.SHUT_RDWR)
    except OSError:
        pass
