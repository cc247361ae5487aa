"""Session keys, authenticated control frames and sealed data blocks (issue 8, "Authentication and keys").

What each mode protects against (README "Never losing data" says the same):

* **Shared secret** (``--secret-file``): both sides prove the secret over a transcript that
  binds both nonces and every HELLO/CHALLENGE field, so an impostor on either side, a replayed
  handshake, or a field stripped in transit (e.g. ``encrypt``) fails authentication. A key
  derived per connection then authenticates every control frame (HMAC-SHA256 truncated to
  16 bytes over direction, sequence number, frame type, file id and the canonical body: a frame
  altered, dropped, replayed or reordered ends the session), and keys the end-to-end file digest
  (``blake3-keyed``): someone in the path who rewrites data *and* the digest is caught at
  commit, the file is discarded and re-sent. Data is readable in transit (not confidential), and
  tampering of data blocks is only found at commit.
* **Shared secret + ``--encrypt``**: in addition, every data block and every control body after
  the handshake is sealed with an AEAD (nonce = per-direction counter, associated data = the
  frame header): data is confidential, and a tampered, truncated, replayed or reordered block is
  refused before it is written. The receiver can insist (``--require-encryption``). The AEAD is
  AES-256-GCM when both sides list ``aes-256-gcm`` (each lists it only where its CPU has AES and
  carry-less multiply instructions, ``hardware_aes``), else ChaCha20-Poly1305 (issue 43: on this
  project's CPU AES-256-GCM opens 8.3 GiB/s on one core against ChaCha20-Poly1305's 2.6). Both
  lists are bound by the handshake's proofs, so the choice cannot be changed in transit, and both
  AEADs give the same guarantees; whether to encrypt at all stays each side's own configuration.
* **Mutual TLS** (``--tls-*``): TLS gives confidentiality and integrity in transit and both sides
  check certificates against the CA; the file digest stays the fast unkeyed xxh3-128. With a
  shared secret as well, everything above applies on top.

Neither mode hides sizes, names' lengths or timing from someone watching the path, and
``--no-verify`` turns the end-to-end digest off (then only in-transit protection remains).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import platform
import struct
import threading
from dataclasses import dataclass
from typing import Any

from transfer_agent.errors import NetworkError, ProtocolError
from transfer_agent.wire.protocol import (MAX_CONTROL, VERSION, Frame, FrameBuffer, canonical, decode_body,
                                         error_from_body, pack_control, recv_raw)

MAC_BYTES = 16
TAG_BYTES = 16  # AEAD tag appended to every sealed payload
KDF_LABEL = b"fstream session key v1"
CHACHA = "chacha20-poly1305"  # every side speaks it (``protocol.CAPABILITIES``)
AES_GCM = "aes-256-gcm"  # listed by a side whose CPU has AES instructions (``aead_caps``)
#: per machine, the /proc/cpuinfo flags that make AES-GCM fast and constant-time (AES rounds, GHASH's multiply)
AES_FLAGS = {"x86_64": ("aes", "pclmulqdq"), "aarch64": ("aes", "pmull")}


@functools.lru_cache(maxsize=1)
def hardware_aes(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when this CPU has the instructions AES-GCM needs to be fast (``AES_FLAGS``), as /proc/cpuinfo says;
    False where it cannot be told (another OS, an unknown machine): ChaCha20-Poly1305 is then used."""
    need = AES_FLAGS.get(platform.machine())
    if need is None:
        return False
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as fh:
            for line in fh:
                name, _, value = line.partition(":")
                if name.strip() in ("flags", "Features"):
                    have = set(value.split())
                    return all(flag in have for flag in need)
    except OSError:
        pass
    return False


def aead_caps() -> tuple[str, ...]:
    """The AEADs this side lists beyond ChaCha20-Poly1305: AES-256-GCM where the CPU has AES instructions."""
    return (AES_GCM,) if hardware_aes() else ()


def choose_aead(own: tuple[str, ...] | list[str], peer: tuple[str, ...] | list[str]) -> str:
    """The AEAD of a connection: AES-256-GCM when both sides listed it, else ChaCha20-Poly1305. Both sides compute
    it from the same two lists, which the handshake's proofs bind."""
    return AES_GCM if AES_GCM in own and AES_GCM in peer else CHACHA


def _hmac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"|".join(parts), hashlib.sha256).digest()


@dataclass(frozen=True)
class SessionKeys:
    """Keys of one authenticated connection (derived by ``derive_keys``; never sent).

    :param mac_c2s: control-frame MAC key, client → server.
    :param mac_s2c: control-frame MAC key, server → client.
    :param digest: 32-byte key of the ``blake3-keyed`` file digest (the control connection's is used).
    :param aead_c2s: AEAD key, client → server.
    :param aead_s2c: AEAD key, server → client.
    :param encrypt: payloads and control bodies are sealed (the client asked, bound by the transcript).
    :param aead: the AEAD they are sealed with (``choose_aead``: ``AES_GCM`` or ``CHACHA``).
    """

    mac_c2s: bytes
    mac_s2c: bytes
    digest: bytes
    aead_c2s: bytes
    aead_s2c: bytes
    encrypt: bool = False
    aead: str = CHACHA


def transcript_hash(hello: dict[str, Any], challenge: dict[str, Any]) -> bytes:
    """sha256(canonical HELLO) | sha256(canonical CHALLENGE without its proof)."""
    chal = {k: v for k, v in challenge.items() if k != "proof"}
    return hashlib.sha256(canonical(hello)).digest() + hashlib.sha256(canonical(chal)).digest()


def derive_keys(secret: bytes, c_nonce: bytes, s_nonce: bytes, transcript: bytes, *, encrypt: bool,
                aead: str = CHACHA) -> SessionKeys:
    """HMAC-based KDF: a session key over the secret, both nonces and the transcript, then one key per use."""
    k = _hmac(secret, KDF_LABEL, c_nonce, s_nonce, transcript)
    return SessionKeys(mac_c2s=_hmac(k, b"mac c2s"), mac_s2c=_hmac(k, b"mac s2c"), digest=_hmac(k, b"digest"),
                       aead_c2s=_hmac(k, b"aead c2s"), aead_s2c=_hmac(k, b"aead s2c"), encrypt=encrypt, aead=aead)


def _nonce(counter: int) -> bytes:
    return b"\0\0\0\0" + struct.pack("!Q", counter)


class Sealer:
    """An AEAD (``aead``: ChaCha20-Poly1305 or AES-256-GCM) in one direction; the nonce is a counter, so every
    message is sealed once, in order."""

    def __init__(self, key: bytes, aead: str = CHACHA) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

        if aead not in (CHACHA, AES_GCM):
            raise ValueError(f"unknown AEAD {aead!r} (this side speaks {CHACHA} and {AES_GCM})")
        self.aead = aead
        self._aead = AESGCM(key) if aead == AES_GCM else ChaCha20Poly1305(key)
        self._n = 0

    def seal(self, data: bytes, aad: bytes) -> bytes:
        out = self._aead.encrypt(_nonce(self._n), data, aad)
        self._n += 1
        return out

    def open(self, data: bytes, aad: bytes, what: str) -> bytes:
        from cryptography.exceptions import InvalidTag

        try:
            out = self._aead.decrypt(_nonce(self._n), data, aad)
        except InvalidTag:
            raise ProtocolError(f"{what} failed authentication (tampered, replayed or reordered in transit)") from None
        self._n += 1
        return out

    def seal_into(self, data: memoryview, aad: bytes, out: memoryview) -> None:
        """``seal`` into ``out`` (exactly ``len(data) + TAG_BYTES`` bytes)."""
        into = getattr(self._aead, "encrypt_into", None)
        if into is None:
            out[:] = self._aead.encrypt(_nonce(self._n), bytes(data), aad)
        else:
            into(_nonce(self._n), data, aad, out)
        self._n += 1

    def open_into(self, data: memoryview, aad: bytes, what: str, out: memoryview) -> None:
        """``open`` into ``out`` (exactly ``len(data) - TAG_BYTES`` bytes): no plaintext object per message where
        ``cryptography`` has ``decrypt_into``. A tampered message raises, and then ``out`` holds bytes nobody
        may use (``decrypt_into`` fills it before it checks the tag): the caller writes ``out`` only when this
        returns."""
        from cryptography.exceptions import InvalidTag

        into = getattr(self._aead, "decrypt_into", None)
        try:
            if into is None:
                out[:] = self._aead.decrypt(_nonce(self._n), bytes(data), aad)
            else:
                into(_nonce(self._n), data, aad, out)
        except InvalidTag:
            raise ProtocolError(f"{what} failed authentication (tampered, replayed or reordered in transit)") from None
        self._n += 1


class ControlLink:
    """Control frames on one connection after the handshake: plain (TLS only), MAC'd (shared secret) or sealed.

    Same ``send`` as ``ControlWriter`` (thread-safe); ``recv`` returns (type, file id, body) and raises
    ``ProtocolError("control frame failed authentication")`` on a missing, wrong or out-of-order MAC.

    :param sock: the connection.
    :param keys: the connection's keys, or None (TLS only: frames go as they are).
    :param client: this side opened the connection (picks the direction keys).
    :param version: the protocol version the connection's HELLO stated (issue 30): its frames carry it.
    """

    caps: tuple[str, ...] = ()  # what this side listed in the handshake (set by ``wire.auth``; ``wire.batch``)
    peer_caps: tuple[str, ...] = ()  # and what the peer listed

    def __init__(self, sock: Any, keys: SessionKeys | None, *, client: bool, peer: str = "peer",
                 version: int = VERSION) -> None:
        self.sock, self.keys, self.peer, self.version = sock, keys, peer, version
        self._lock = threading.Lock()
        self._frames: FrameBuffer | None = None
        self._send_seq = self._recv_seq = 0
        self._seal = self._open = None
        if keys is not None:
            self._mac_out, self._mac_in = (keys.mac_c2s, keys.mac_s2c) if client else (keys.mac_s2c, keys.mac_c2s)
            if keys.encrypt:
                out, inn = (keys.aead_c2s, keys.aead_s2c) if client else (keys.aead_s2c, keys.aead_c2s)
                self._seal, self._open = Sealer(out, keys.aead), Sealer(inn, keys.aead)

    @staticmethod
    def _aad(seq: int, ftype: int, fid: int) -> bytes:
        return struct.pack("!QBI", seq, int(ftype), fid)

    def _mac(self, key: bytes, seq: int, ftype: int, fid: int, body: dict[str, Any] | bytes) -> str:
        """HMAC-SHA256 (truncated) of the frame's sequence, type, file id and canonical body; one-shot
        ``hmac.digest`` (OpenSSL, no HMAC object per frame: issue 13's per-file cost)."""
        canon = body if isinstance(body, bytes) else canonical(body)
        return hmac.digest(key, self._aad(seq, ftype, fid) + canon, "sha256")[:MAC_BYTES].hex()

    def send(self, ftype: Frame, body: dict[str, Any] | bytes, file_id: int = 0) -> None:
        """Send one frame; ``body`` may be given as its canonical encoding (bytes), which is then MAC'd or sealed
        as it is."""
        self.send_frames([(ftype, body, file_id)])

    def send_frames(self, frames: list[tuple[Frame, dict[str, Any] | bytes, int]]) -> None:
        """Send (type, body, file id) frames in one write, each MAC'd or sealed under its own sequence number."""
        with self._lock:
            seq = self._send_seq
            parts = []
            for ftype, body, file_id in frames:
                wire: dict[str, Any] | bytes = body
                if self.keys is not None:
                    canon = body if isinstance(body, bytes) else canonical(body)
                    if self._seal is not None:
                        sealed = self._seal.seal(canon, self._aad(seq, ftype, file_id))
                        wire = {"sealed": base64.b64encode(sealed).decode()}
                    else:  # the canonical encoding the MAC covers is the payload too, with the MAC added last
                        wire = with_mac(canon, self._mac(self._mac_out, seq, ftype, file_id, canon))
                parts.append(pack_control(ftype, wire, file_id, self.version))
                seq += 1
            try:
                self.sock.sendall(parts[0] if len(parts) == 1 else b"".join(parts))
            except (ConnectionError, TimeoutError, OSError) as exc:
                raise NetworkError(f"connection lost while sending {frames[0][0].name}: {exc}") from exc
            self._send_seq = seq

    def read_ahead(self) -> None:
        """From now on read frames through a buffer (``FrameBuffer``): for a session's control connection
        once the handshake is done, never for a data connection (its payload is spliced from the socket)."""
        self._frames = FrameBuffer(self.sock, (self.version,))

    def recv(self, *, max_control: int = MAX_CONTROL, plain_error: bool = False) -> tuple[Frame, int, dict[str, Any]]:
        """Read and authenticate one control frame. ``plain_error``: an unauthenticated ERROR (sent before the
        peer could authenticate, e.g. a refused handshake) is raised as the error it names."""
        if self._frames is not None:
            ftype, fid, raw = self._frames.frame(max_control)
        else:
            ftype, fid, _off, _len, raw = recv_raw(self.sock, max_control, (self.version,))
        if ftype == Frame.DATA:
            raise ProtocolError(f"unexpected DATA frame on the control connection from {self.peer}")
        body = decode_body(ftype, raw) if raw else {}
        if self.keys is None:
            return ftype, fid, body
        seq = self._recv_seq
        if self._open is not None and set(body) == {"sealed"}:
            try:
                raw = base64.b64decode(str(body["sealed"]), validate=True)
            except ValueError:
                raise ProtocolError(f"control frame {ftype.name} from {self.peer} failed authentication "
                                    "(sealed body is not base64)") from None
            plain = self._open.open(raw, self._aad(seq, ftype, fid), f"control frame {ftype.name} from {self.peer}")
            self._recv_seq = seq + 1
            return ftype, fid, decode_body(ftype, plain)
        mac = body.pop("mac", None)
        if (self._open is None and isinstance(mac, str) and mac.isascii()  # compare_digest raises on non-ASCII
                and self._mac_ok(mac, seq, ftype, fid, raw, body)):
            self._recv_seq = seq + 1
            return ftype, fid, body
        if plain_error and ftype == Frame.ERROR:
            raise error_from_body(body)
        raise ProtocolError(f"control frame {ftype.name} from {self.peer} failed authentication "
                            f"({'missing' if mac is None and 'sealed' not in body else 'bad'} MAC or sequence "
                            f"{seq}; tampered in transit?)")

    def _mac_ok(self, mac: str, seq: int, ftype: int, fid: int, raw: bytes, body: dict[str, Any]) -> bool:
        """The MAC checked over the bytes received when they are ``with_mac``'s form (the body's canonical
        encoding, then the MAC): no second encoding (issue 13). A body sent another way (an older sender
        put the MAC among the fields) is checked over its canonical encoding, as before. Either way the
        body returned is the one decoded from bytes the key holder authenticated."""
        tail = _mac_member(mac)
        if raw.endswith(b"," + tail) or raw == b"{" + tail:
            canon = raw[:-len(tail) - 1] + b"}" if raw != b"{" + tail else b"{}"
            if hmac.compare_digest(mac, self._mac(self._mac_in, seq, ftype, fid, canon)):
                return True
        return hmac.compare_digest(mac, self._mac(self._mac_in, seq, ftype, fid, body))


def _mac_member(mac: str) -> bytes:
    """The MAC as the last member of a control body, with the body's closing brace."""
    return b'"mac":"' + mac.encode() + b'"}'


def with_mac(canon: bytes, mac: str) -> bytes:
    """``canon`` (a canonical JSON object) with ``"mac": mac`` added as its last member, without encoding
    the body a second time; it decodes to the body plus ``mac``, which is all the receiver reads."""
    tail = _mac_member(mac)
    return b"{" + tail if canon == b"{}" else canon[:-1] + b"," + tail


class SealedBuffers:
    """The two buffers one data connection reuses for its blocks, sealed and plain (issue 43: each block's bytes
    objects, and their fresh pages, were allocated per block, on both sides). Blocks larger than
    ``KEEP`` get buffers of their own, so a connection holds at most 2 × ``KEEP`` between blocks."""

    KEEP = 8 << 20

    def __init__(self) -> None:
        self._wire = self._plain = bytearray(0)

    def views(self, wire: int, plain: int) -> tuple[memoryview, memoryview]:
        """A view of ``wire`` bytes for the sealed block and one of ``plain`` bytes for its plaintext."""
        if wire > self.KEEP:
            return memoryview(bytearray(wire)), memoryview(bytearray(plain))
        if len(self._wire) < wire:
            self._wire, self._plain = bytearray(wire), bytearray(wire)
        return memoryview(self._wire)[:wire], memoryview(self._plain)[:plain]


class DataSealer:
    """Seals (sender) or opens (receiver) the DATA payloads of one data connection; AAD = the frame header."""

    def __init__(self, keys: SessionKeys) -> None:
        self._s = Sealer(keys.aead_c2s, keys.aead)  # data only flows client → server
        self.aead = keys.aead
        self.buffers = SealedBuffers()  # one thread uses a data connection's sealer

    def seal(self, header: bytes, data: bytes) -> bytes:
        return self._s.seal(data, header)

    def open(self, header: bytes, data: bytes, what: str) -> bytes:
        return self._s.open(data, header, what)

    def seal_into(self, header: bytes, data: memoryview, out: memoryview) -> None:
        self._s.seal_into(data, header, out)

    def open_into(self, header: bytes, data: memoryview, what: str, out: memoryview) -> None:
        self._s.open_into(data, header, what, out)
