"""The FStream wire protocol: fixed 20-byte frame headers, JSON control bodies, raw data payloads.

Every frame starts with ``HEADER`` = magic ``b"FS"``, protocol version, frame type, file id,
offset and length (network byte order). Control frames carry a JSON object of ``length``
bytes; ``DATA`` frames carry ``length`` raw bytes of file ``file_id`` at ``offset``. A frame
with a bad magic, an unknown version or type, or a length beyond the limits is a
``ProtocolError``: the connection that sent it is closed, nothing else is affected.

Versions (issue 30): every frame of a connection carries the version its HELLO stated; a receiver speaks
``SUPPORTED`` (3 and 2: a version-2 HELLO has no key generation and authenticates with the key's current one),
a sender speaks ``VERSION``. Functions take the connection's version (``version``/``versions``; default
``VERSION`` alone); ``expect_versioned`` reads a first frame of any version, so an unsupported peer is refused
naming both sides' versions.

Connection kinds (stated in ``HELLO``): one ``control`` connection per session (file
open/commit requests and replies, like GridFTP's control channel) and ``data`` connections,
grouped into channels of ``p`` streams, which carry only ``DATA`` frames.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import threading
from enum import IntEnum
from typing import Any

from transfer_agent.errors import NetworkError, ProtocolError

MAGIC = b"FS"
VERSION = 3  # 3: HELLO names its key's generation (kgen; issue 30); 2: transcript-bound proofs, MAC'd/sealed frames
SUPPORTED = (3, 2)  # what a receiver speaks (issue 30: upgrade one host at a time); a sender speaks VERSION
HEADER = struct.Struct("!2sBBIQI")  # magic, version, type, file_id, offset, length
HEADER_SIZE = HEADER.size
MAX_CONTROL = 1 << 20
PRE_AUTH_MAX_CONTROL = 4 << 10  # HELLO, CHALLENGE, AUTH: nothing bigger is needed before authentication
MAX_JSON_DEPTH = 32  # control bodies are flat; deeper nesting is refused before decoding
MAX_BLOCK = 64 << 20
MSG_MORE = getattr(socket, "MSG_MORE", 0)  # header and payload leave in one segment where supported
CAPABILITIES = ("sendfile", "ranges", "pipelining", "xxh3_128", "blake3", "blake3-keyed", "chacha20-poly1305",
                "group-commit", "batch")  # batch: the batch frames below (issue 29; ``wire.batch``)


class Frame(IntEnum):
    """Frame types."""

    HELLO = 1
    CHALLENGE = 2
    AUTH = 3
    WELCOME = 4
    ERROR = 5
    OPEN = 10
    OPEN_OK = 11
    COMMIT = 12
    COMMITTED = 13
    ABORT = 14
    SKIP = 15
    # issue 29 (``wire.batch``): envelopes of per-file frames, sent only to a peer that listed "batch"
    OPEN_BATCH = 16  # OPENs
    OPEN_OK_BATCH = 17  # their answers: OPEN_OK or a per-file ERROR
    COMMIT_BATCH = 18  # COMMITs
    COMMITTED_BATCH = 19  # COMMITTEDs (e.g. of one group commit)
    DATA = 20
    BYE = 30
    PING = 31
    PONG = 32
    FACTS = 40  # `fstream doctor` (issue 30): the receiver's host facts, asked and answered on a doctor connection
    DISK = 41  # `fstream doctor`: run the receiver's bounded disk write probe, and its result


_TYPES = {int(t) for t in Frame}


def pack_header(ftype: int, file_id: int = 0, offset: int = 0, length: int = 0, version: int = VERSION) -> bytes:
    return HEADER.pack(MAGIC, version, ftype, file_id, offset, length)


def speaks(versions: tuple[int, ...]) -> str:
    """``(3, 2)`` as "3 and 2": the versions a side speaks, for messages."""
    return " and ".join(map(str, versions))


def canonical(body: dict[str, Any]) -> bytes:
    """The canonical encoding of a body (sorted keys, no spaces): what MACs and transcripts cover."""
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def pack_control(ftype: int, body: dict[str, Any] | bytes, file_id: int = 0, version: int = VERSION) -> bytes:
    """A control frame: header and JSON body (``body`` may already be encoded)."""
    payload = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
    if len(payload) > MAX_CONTROL:
        raise ProtocolError(f"control frame {Frame(ftype).name} too large ({len(payload)} bytes)")
    return pack_header(ftype, file_id, 0, len(payload), version) + payload


def parse_header(raw: bytes, max_control: int = MAX_CONTROL, versions: tuple[int, ...] = (VERSION,)
                 ) -> tuple[Frame, int, int, int]:
    """Validate a header of a connection speaking ``versions``; return (type, file_id, offset, length). Control
    bodies over ``max_control`` are refused."""
    magic, version, ftype, file_id, offset, length = HEADER.unpack(raw)
    if magic != MAGIC:
        raise ProtocolError(f"malformed frame: bad magic {magic!r}")
    if version not in versions:
        raise ProtocolError(f"unsupported protocol version {version} (this side speaks {speaks(versions)})")
    if ftype not in _TYPES:
        raise ProtocolError(f"malformed frame: unknown frame type {ftype}")
    if ftype == Frame.DATA:
        if length == 0 or length > MAX_BLOCK:
            raise ProtocolError(f"malformed frame: data block of {length} bytes (limit {MAX_BLOCK})")
    elif length > max_control:
        raise ProtocolError(f"malformed frame: control body of {length} bytes (limit {max_control})")
    return Frame(ftype), file_id, offset, length


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly n bytes or raise ``NetworkError`` (peer closed) / ``ProtocolError`` (truncated)."""
    buf = bytearray(n)
    recv_exact_into(sock, memoryview(buf))
    return bytes(buf)


def recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock`` or raise as ``recv_exact`` does (a buffer the caller reuses: no object per read);
    on a blocking plain socket in as few calls as the kernel allows (``MSG_WAITALL``)."""
    n = len(view)
    got = 0
    flags = 0 if isinstance(sock, ssl.SSLSocket) else socket.MSG_WAITALL
    while got < n:
        try:
            k = sock.recv_into(view[got:], n - got, flags)
        except (ConnectionError, TimeoutError, OSError) as exc:
            raise NetworkError(f"connection lost while reading: {exc}") from exc
        if k == 0:
            if got == 0:
                raise NetworkError("connection closed by peer")
            raise ProtocolError(f"truncated frame: connection closed after {got} of {n} bytes")
        got += k


class FrameBuffer:
    """Control frames read through a buffer: one ``recv`` brings every frame already queued (with
    pipelining, an OPEN_OK or COMMITTED for many files), where ``recv_frame`` made two calls per frame
    (issue 13). Holds at most ``CHUNK`` bytes beyond the frame being read. Only for a connection that
    nothing else reads afterwards: bytes read ahead belong to this buffer.
    """

    CHUNK = 64 << 10

    def __init__(self, sock: socket.socket, versions: tuple[int, ...] = (VERSION,)) -> None:
        self.sock = sock
        self.versions = versions
        self._buf = bytearray()
        self._pos = 0

    def _take(self, n: int) -> bytes:
        while len(self._buf) - self._pos < n:
            if self._pos:
                del self._buf[:self._pos]
                self._pos = 0
            try:
                chunk = self.sock.recv(self.CHUNK)  # never a larger allocation, however large the frame
            except (ConnectionError, TimeoutError, OSError) as exc:
                raise NetworkError(f"connection lost while reading: {exc}") from exc
            if not chunk:
                if not self._buf:
                    raise NetworkError("connection closed by peer")
                raise ProtocolError(f"truncated frame: connection closed after {len(self._buf)} of {n} bytes")
            self._buf += chunk
        out = bytes(self._buf[self._pos:self._pos + n])
        self._pos += n
        return out

    def frame(self, max_control: int = MAX_CONTROL) -> tuple[Frame, int, bytes]:
        """The next frame's type, file id and raw body (a DATA frame's payload is not read)."""
        ftype, file_id, _offset, length = parse_header(self._take(HEADER_SIZE), max_control, self.versions)
        return ftype, file_id, (self._take(length) if length and ftype != Frame.DATA else b"")


def json_depth_exceeds(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when JSON text nests arrays/objects deeper than ``limit`` (brackets inside strings do not count).

    Cheap for ordinary bodies: text with no more than ``limit`` opening brackets cannot be too deep.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    depth = 0
    in_str = esc = False
    for c in raw:
        if in_str:
            if esc:
                esc = False
            elif c == 0x5C:  # backslash
                esc = True
            elif c == 0x22:  # quote
                in_str = False
        elif c == 0x22:
            in_str = True
        elif c in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        elif c in (0x5D, 0x7D):
            depth -= 1
    return False


def decode_body(ftype: Frame, raw: bytes) -> dict[str, Any]:
    """Decode a control body: a JSON object, nested at most ``MAX_JSON_DEPTH`` deep, else ``ProtocolError``."""
    if json_depth_exceeds(raw):
        raise ProtocolError(f"malformed {ftype.name} frame: body nested too deeply (limit {MAX_JSON_DEPTH})")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ProtocolError(f"malformed {ftype.name} frame: body nested too deeply") from None
    except ValueError as exc:
        raise ProtocolError(f"malformed {ftype.name} frame: body is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"malformed {ftype.name} frame: body is not an object")
    return body


def recv_raw(sock: socket.socket, max_control: int = MAX_CONTROL, versions: tuple[int, ...] = (VERSION,)
             ) -> tuple[Frame, int, int, int, bytes]:
    """Read one frame's header and, for a control frame, its undecoded body (``b""`` for a DATA frame,
    whose payload is left on the socket for the caller): (type, file id, offset, length, body)."""
    ftype, file_id, offset, length = parse_header(recv_exact(sock, HEADER_SIZE), max_control, versions)
    raw = recv_exact(sock, length) if length and ftype != Frame.DATA else b""
    return ftype, file_id, offset, length, raw


def recv_frame(sock: socket.socket, max_control: int = MAX_CONTROL, versions: tuple[int, ...] = (VERSION,)
               ) -> tuple[Frame, int, int, int, dict[str, Any] | None]:
    """Read one frame. Control frames return their decoded JSON body; DATA frames return
    ``None`` as body and leave the payload unread on the socket for the caller.

    :param max_control: largest control body accepted (``PRE_AUTH_MAX_CONTROL`` before authentication).
    """
    ftype, file_id, offset, length, raw = recv_raw(sock, max_control, versions)
    if ftype == Frame.DATA:
        return ftype, file_id, offset, length, None
    return ftype, file_id, offset, length, decode_body(ftype, raw) if raw else {}


def expect(sock: socket.socket, *types: Frame, max_control: int = MAX_CONTROL,
           versions: tuple[int, ...] = (VERSION,)) -> tuple[Frame, dict[str, Any]]:
    """Read one control frame of one of ``types``; an ERROR frame is raised as the error it names."""
    _v, ftype, body = _expect(sock, types, max_control, versions)
    return ftype, body


def expect_versioned(sock: socket.socket, *types: Frame, max_control: int = MAX_CONTROL
                     ) -> tuple[int, Frame, dict[str, Any]]:
    """The first frame of a connection, whatever version it is in: (its header's version, type, body), so the
    caller can refuse an unsupported peer naming both versions. An ERROR frame is raised as the error it names."""
    return _expect(sock, types, max_control, None)


def _expect(sock: socket.socket, types: tuple[Frame, ...], max_control: int, versions: tuple[int, ...] | None
            ) -> tuple[int, Frame, dict[str, Any]]:
    head = recv_exact(sock, HEADER_SIZE)
    version = head[2]
    ftype, _fid, _off, length = parse_header(head, max_control, versions or (version,))
    if ftype == Frame.DATA:
        raise ProtocolError(f"unexpected DATA frame (expected {', '.join(t.name for t in types)})")
    body = (decode_body(ftype, recv_exact(sock, length)) if length else {}) or {}
    if ftype == Frame.ERROR and Frame.ERROR not in types:
        raise error_from_body(body or {})
    if ftype not in types:
        raise ProtocolError(f"unexpected {ftype.name} frame (expected {', '.join(t.name for t in types)})")
    return version, ftype, body


def error_from_body(body: dict[str, Any]) -> Exception:
    """Turn an ERROR frame body back into the matching exception class."""
    from transfer_agent import errors

    kinds = {
        "auth": errors.AuthError,
        "protocol": errors.ProtocolError,
        "refused": errors.RefusedError,
        "network": errors.NetworkError,
        "source modified": errors.SourceModifiedError,
        "checksum": errors.ChecksumError,
        "stall": errors.StallError,
    }
    cls = kinds.get(body.get("kind", ""), errors.FStreamError)
    return cls(f"receiver: {body.get('message', 'unspecified error')}", retryable=bool(body.get("retryable", False)))


class ControlWriter:
    """Thread-safe writer of control frames on one socket."""

    def __init__(self, sock: socket.socket, version: int = VERSION) -> None:
        self.sock = sock
        self.version = version
        self._lock = threading.Lock()

    caps: tuple[str, ...] = ()  # what this side listed in its handshake, and the peer (``wire.auth`` sets them)
    peer_caps: tuple[str, ...] = ()

    def send(self, ftype: Frame, body: dict[str, Any] | bytes, file_id: int = 0) -> None:
        self.send_frames([(ftype, body, file_id)])

    def send_frames(self, frames: list[tuple[Frame, dict[str, Any] | bytes, int]]) -> None:
        """Send (type, body, file id) frames in one write (a body given as bytes is its JSON encoding)."""
        data = b"".join(pack_control(ftype, body, file_id, self.version) for ftype, body, file_id in frames)
        with self._lock:
            try:
                self.sock.sendall(data)
            except (ConnectionError, TimeoutError, OSError) as exc:
                raise NetworkError(f"connection lost while sending {frames[0][0].name}: {exc}") from exc
