"""The receiver's side of ``fstream doctor`` (issue 30): host facts, a bounded disk probe, a discarding rate sink.

A connection whose authenticated HELLO says ``role: "doctor"`` is served here (``Receiver._handle`` dispatches it
after the handshake, so an unauthenticated peer gets nothing); it opens no session and nothing lands:

* ``probe: "control"``: requests on the control link, one at a time: ``PING`` → ``PONG`` with this host's wall
  clock (the doctor's clock skew), ``FACTS`` → sysctls, free space of the root, the interface the connection
  arrived on and its MTU, TCP_INFO (``wire.hostnet``), ``DISK`` → a write of at most ``DISK_MAX_BYTES`` within
  ``DISK_MAX_S`` with fdatasync into a temp file under the key's subtree, removed after (one at a time per
  receiver), ``BYE`` ends it; so does ``IDLE_S`` without a request.
* ``probe: "sink"``: after WELCOME the client streams raw bytes; they are read and dropped for ``seconds`` (at most
  ``SINK_MAX_S``) from the first byte, then ``BYE`` reports the bytes and when they arrived (this host's monotonic
  clock, one sample per ``SAMPLE_S``); the client stops sending when it sees the report, and what was still on
  its way is dropped until it closes (at most ``SINK_DRAIN_S``). No half-close: it would end a TLS connection.

At most ``MAX_CONNECTIONS`` doctor connections are served at once.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any

from transfer_agent.errors import FStreamError, NetworkError, ProtocolError
from transfer_agent.storage.paths import open_parent
from transfer_agent.wire import hostnet
from transfer_agent.wire.protocol import Frame
from transfer_agent.wire.secure import ControlLink

MAX_CONNECTIONS = 64
IDLE_S = 60.0
SINK_MAX_S = 10.0
SINK_WAIT_S = 10.0  # for a sink's first byte
SINK_DRAIN_S = 10.0  # after a sink's report, for the client to see it and close
SAMPLE_S = 0.05
DISK_MAX_BYTES = 256 << 20
DISK_MAX_S = 10.0
DISK_SYNC_EVERY = 16 << 20  # fdatasync this often: the rate is of bytes on the disk, not in the page cache
DISK_MIN_FREE_SHARE = 4  # never write more than a quarter of the free space
TEMP_PREFIX = ".fstream-doctor-"


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
        name = f"{TEMP_PREFIX}{secrets.token_hex(6)}.tmp"
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


class DoctorService:
    """Serves ``fstream doctor``'s connections of one receiver.

    :param root: the receiver's destination root (the disk probe writes under a key's subtree of it).
    :param stop: set when the receiver stops: every probe ends.
    :param log: the receiver's logger.
    """

    def __init__(self, *, root: str, stop: threading.Event, log: logging.Logger) -> None:
        self.root, self._stop, self.log = root, stop, log
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._disk = threading.Lock()

    def serve(self, conn: socket.socket, link: ControlLink, hello: dict[str, Any], subtree: str, peer: str) -> None:
        """Serve one authenticated doctor connection to its end (``hello``: the client's HELLO)."""
        if not self._slots.acquire(blocking=False):
            link.send(Frame.ERROR, {"kind": "refused", "retryable": True,
                                    "message": f"too many doctor probes at once (limit {MAX_CONNECTIONS})"})
            return
        try:
            probe = hello.get("probe")
            if probe == "control":
                self._control(conn, link, subtree, peer)
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
            self._slots.release()

    def _control(self, conn: socket.socket, link: ControlLink, subtree: str, peer: str) -> None:
        link.send(Frame.WELCOME, {"probe": "control"})
        conn.settimeout(IDLE_S)  # a request that started arriving is read whole within this
        while _request(conn, IDLE_S, self._stop):
            try:
                ftype, _fid, body = link.recv()
            except NetworkError:
                return
            if ftype == Frame.PING:
                link.send(Frame.PONG, {"n": body.get("n"), "clock": time.time()})
            elif ftype == Frame.FACTS:
                link.send(Frame.FACTS, {**hostnet.host_facts(conn), "root": hostnet.free_space(self.root)})
            elif ftype == Frame.DISK:
                link.send(Frame.DISK, self._disk_probe(body, subtree, peer))
            elif ftype == Frame.BYE:
                link.send(Frame.BYE, {})
                return
            else:
                raise ProtocolError(f"unexpected {ftype.name} frame on a doctor connection")

    def _disk_probe(self, body: dict[str, Any], subtree: str, peer: str) -> dict[str, Any]:
        nbytes = int(_number(body, "bytes", 64 << 20, DISK_MAX_BYTES))
        max_s = _number(body, "seconds", 2.0, DISK_MAX_S)
        if not self._disk.acquire(blocking=False):
            return {"error": "another disk probe is running on this receiver; try again in a few seconds"}
        try:
            result = disk_probe(self.root, subtree, nbytes, max_s, self._stop)
        except FStreamError as exc:  # a symlink or non-directory on the way to the key's subtree
            result = {"error": str(exc)}
        except OSError as exc:  # the root itself cannot be opened
            result = {"error": f"cannot open the root: {exc.strerror}"}
        finally:
            self._disk.release()
        self.log.info("doctor %s: disk probe %s", peer, result.get("error") or
                      f"{result['bytes']} bytes in {result['seconds']:.2f} s")
        return result
