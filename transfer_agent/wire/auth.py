"""Authentication that fails closed: an HMAC challenge on a shared secret, or mutual TLS (issue 8, defect 1).

Handshake (every connection, control or data):

1. client → ``HELLO`` {version, caps, role, session, nonce, auth, encrypt, ...}
2. server → ``CHALLENGE`` {version, caps, nonce, auth, encrypt, proof = HMAC(secret, "server" | T)}
3. client checks the server's proof, then → ``AUTH`` {proof = HMAC(secret, "client" | T)}
4. server checks it → ``WELCOME`` (authenticated with the new session keys) or ``ERROR`` {kind: auth}

``T`` = c_nonce | s_nonce | sha256(canonical HELLO) | sha256(canonical CHALLENGE without proof), so
both proofs bind every field either side sent: stripping ``encrypt`` from HELLO or altering any
field in transit breaks authentication, and fresh nonces on both sides make a recorded
handshake useless. Each side decides its mode from its OWN configuration, never from the
peer's claim: with a shared secret configured, the peer's proof is mandatory whatever its
``auth`` field says (a missing or wrong proof is a terminal ``AuthError`` naming the peer).
Before authentication, control frames are limited to ``PRE_AUTH_MAX_CONTROL`` bytes.

Keys (issue 32): a receiver may hold several shared secrets, each under a key id. The client names its
key in HELLO (``key``, absent = ``"default"``); the server looks it up (an unknown id is a terminal
``AuthError`` that does not list the receiver's keys) and runs the challenge with that key's secret.
The key id is part of the HELLO, so the transcript, and with it both proofs, bind it.

Generations (issue 30, protocol 3): a key's secret file may hold generations (``model.secret_ring``). The client
names the generation it uses (HELLO ``kgen``: its file's current one; bound by the transcript like ``key``; the
secret never travels); the server accepts it when that generation is current or next on its side, or previous
within its window. Any other generation gets the decoy challenge of an unknown key (the client sees a receiver
that "does not know our shared secret at generation ..."), and the server's ``AuthError`` names the key id, the
generation and why, never the other generations. A version-2 HELLO names none: its key's current generation.
``load_secret`` returns a ``Secret`` that knows its file: a sender re-reads it per session (``reread_secret``).

Versions (issue 30): a server speaks ``protocol.SUPPORTED`` (3 and 2), a client ``CLIENT_VERSION``; a peer
speaking another version is refused naming both ("sender speaks protocol 1; this receiver speaks 3 and 2").

Capabilities: HELLO and CHALLENGE list what each side speaks (``caps``: ``CLIENT_CAPS``, ``SERVER_CAPS``; bound by
the proofs like every field); the link keeps both lists (``caps``, ``peer_caps``). Batch frames (issue 29,
``wire.batch``) are used only on a connection where both sides listed ``"batch"``: no version bump was needed.
Likewise ``--encrypt`` seals with AES-256-GCM only where both sides listed ``"aes-256-gcm"`` (issue 43), else with
ChaCha20-Poly1305 (``secure.choose_aead``).

With TLS, both sides present certificates checked against the given CA (``CERT_REQUIRED``)
before any frame is exchanged; a shared secret, if also given, is checked on top. There is no
unauthenticated mode. After the handshake, ``transfer_agent.wire.secure`` derives the connection's
keys (control-frame MACs, the keyed file digest, AEAD keys); see its docstring for what each
mode protects against.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
import secrets
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fstream_provider.model.keyfile import KEY_ID, KeyFileError
from fstream_provider.model.secret_ring import GEN_ID_RULE, LEGACY_GEN, SecretRing, read_ring, valid_gen_id
from transfer_agent.errors import AuthError, FStreamError, NetworkError, ProtocolError
from transfer_agent.wire.protocol import (CAPABILITIES, MAGIC, PRE_AUTH_MAX_CONTROL, SUPPORTED, VERSION, ControlWriter,
                                     Frame, error_from_body, expect, expect_versioned, recv_frame, speaks)
from transfer_agent.wire.secure import ControlLink, SessionKeys, aead_caps, choose_aead, derive_keys, transcript_hash

NONCE_BYTES = 32
DEFAULT_KEY = "default"  # the key a HELLO without ``key`` names
KEY_ID_RE = KEY_ID  # the one rule (``model.keyfile``): jobs name keys by the ids receivers hold
KEY_ID_RULE = "1 to 64 of A-Z a-z 0-9 . _ -"
SecretLookup = Callable[[str], "bytes | None"]  # key id -> its secret (None: TLS only); KeyError if unknown
# key id, the generation a HELLO named (None: the current one) -> (that generation, its secret); KeyError if the key
# is unknown, ``KeyRefused`` (naming only that generation) if the generation is not accepted now
GenLookup = Callable[[str, "str | None"], "tuple[str, bytes | None]"]
# The protocol a client (sender) speaks. Tests set ``auth.CLIENT_VERSION = 2`` (monkeypatch) to run a sender as a
# protocol-2 one (no ``kgen``, frames of version 2) against a receiver that speaks 3 and 2.
CLIENT_VERSION = VERSION
# The capabilities each side lists (HELLO ``caps``, CHALLENGE ``caps``; both bound by the proofs). Tests take one
# away (monkeypatch, e.g. ``auth.SERVER_CAPS`` without "batch") to run that side as an older peer. AES-256-GCM is
# listed where this CPU has AES instructions (``secure.aead_caps``; issue 43).
CLIENT_CAPS: tuple[str, ...] = CAPABILITIES + aead_caps()
SERVER_CAPS: tuple[str, ...] = CAPABILITIES + aead_caps()
log = logging.getLogger("fstream.auth")


class KeyRefused(KeyError):
    """A key's generation that a server does not accept now; ``reason`` names only that generation."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Secret(bytes):
    """A shared secret's bytes (its file's current generation) that knows where it came from (issue 30).

    :param path: the file it was read from (None: given as bytes).
    :param ring: the file's generations (what a receiver accepts); None: one generation, ``"0"``.
    Its ``repr`` names the file and the generation, never the bytes.
    """

    path: str | None
    ring: SecretRing | None
    generation: str

    def __new__(cls, data: bytes, path: str | None = None, ring: SecretRing | None = None) -> "Secret":
        self = super().__new__(cls, data)
        self.path, self.ring = path, ring
        self.generation = ring.current.gen_id if ring is not None else LEGACY_GEN
        return self

    def __repr__(self) -> str:
        return f"<secret generation {self.generation!r} of {self.path or 'bytes'}>"


def generation_secret(secret: bytes | None, gen: str | None, now: float | None = None) -> tuple[str, bytes | None]:
    """(generation, its secret) for the generation a HELLO named (None: the current one) of a key whose secret is
    ``secret`` (a ``Secret`` knows its ring; plain bytes are generation "0"; None: a TLS-only key). ``KeyRefused``
    when that generation is unknown, or previous past its window."""
    ring = getattr(secret, "ring", None)
    if secret is None:
        return gen or "", None
    if ring is None:
        if gen not in (None, LEGACY_GEN):
            raise KeyRefused(f"generation {gen!r} is unknown")
        return LEGACY_GEN, secret
    if gen is None:
        return ring.current.gen_id, ring.current.secret
    why = ring.refusal(gen, time.time() if now is None else now)
    if why:
        raise KeyRefused(why)
    g = ring.get(gen)
    assert g is not None
    return gen, g.secret


def valid_key_id(key_id: object) -> bool:
    """True when ``key_id`` is a string of 1 to 64 characters out of ``[A-Za-z0-9._-]``."""
    return isinstance(key_id, str) and KEY_ID_RE.fullmatch(key_id) is not None


def load_secret(path: str | os.PathLike[str] | None) -> Secret | None:
    """Read a shared secret file, one line or a ring of generations (``model.secret_ring``): its current
    generation, as a ``Secret`` that knows the file and its ring. Short secrets and files readable or writable by
    group or others are refused (as ``AuthError``)."""
    if path is None:
        return None
    try:
        ring = read_ring(path)
    except KeyFileError as exc:
        raise AuthError(str(exc)) from None
    return Secret(ring.current.secret, os.fspath(path), None if ring.legacy else ring)


def reread_secret(secret: bytes | None) -> bytes | None:
    """The current generation of the file ``secret`` was read from: a sender calls it as each session opens, so a
    rotation takes effect at the next session without a restart. ``secret`` itself when it came from no file, or
    when the file cannot be used now (a warning names the file and the reason: the last good secret is kept)."""
    path = getattr(secret, "path", None)
    if not path:
        return secret
    try:
        return load_secret(path)
    except AuthError as exc:
        log.warning("%s; keeping generation %r read before", exc, getattr(secret, "generation", LEGACY_GEN))
        return secret


def create_secret_file(path: str | os.PathLike[str]) -> Path:
    """Create a random secret readable only by the owner (if it does not exist)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if not p.exists():
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    return p


def _proof(secret: bytes, label: bytes, c_nonce: bytes, s_nonce: bytes, transcript: bytes) -> str:
    """HMAC(secret, label | c_nonce | s_nonce | transcript hash): binds both nonces and every handshake field."""
    return hmac.new(secret, b"|".join((label, c_nonce, s_nonce, transcript)), hashlib.sha256).hexdigest()


@dataclass
class Handshake:
    """What a completed handshake gives: the peer's body, the connection's keys and its control link.

    :param peer: the server's WELCOME body (client side) or the client's HELLO body (server side).
    :param keys: session keys (None when no shared secret is configured: TLS only).
    :param link: control frames after the handshake (MAC'd or sealed with ``keys``).
    :param key_id: the key the connection authenticated with (the one the client named, or ``"default"``).
    :param generation: that key's generation (None: TLS only); on the server, the current one for a v2 HELLO.
    :param version: the protocol version the connection speaks.
    """

    peer: dict[str, Any]
    keys: SessionKeys | None
    link: ControlLink
    key_id: str = DEFAULT_KEY
    generation: str | None = None
    version: int = VERSION


def peer_caps(body: dict[str, Any]) -> tuple[str, ...]:
    """The capabilities a HELLO or CHALLENGE lists (its ``caps``; what is not a string is ignored)."""
    caps = body.get("caps")
    return tuple(c for c in caps if isinstance(c, str)) if isinstance(caps, list) else ()


def _nonce_of(body: dict[str, Any], what: str) -> bytes:
    try:
        nonce = bytes.fromhex(str(body.get("nonce", "")))
    except ValueError:
        raise ProtocolError(f"malformed {what}: nonce is not hex") from None
    if len(nonce) != NONCE_BYTES:
        raise ProtocolError(f"malformed {what}: nonce has the wrong length")
    return nonce


@dataclass(frozen=True)
class TLSConfig:
    """Certificate, key and CA for mutual TLS.

    :param cert: this side's certificate (PEM).
    :param key: this side's private key (PEM).
    :param ca: CA bundle that must have signed the peer's certificate.
    """

    cert: str
    key: str
    ca: str

    def server_context(self) -> ssl.SSLContext:
        return self._context(server=True)

    def client_context(self) -> ssl.SSLContext:
        return self._context(server=False)

    def _context(self, *, server: bool) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        ctx.load_verify_locations(self.ca)
        if not server:
            ctx.check_hostname = False  # peers are identified by the CA, not by DNS names
        ctx.verify_mode = ssl.CERT_REQUIRED  # both sides present and check certificates
        return ctx


def client_handshake(sock: socket.socket, secret: bytes | None, hello: dict[str, Any],
                     tls: bool = False, *, encrypt: bool = False, peer: str = "the receiver",
                     key_id: str | None = None, kgen: str | None = None, version: int | None = None) -> Handshake:
    """Run the client side; return the WELCOME body, keys and link. Raises ``AuthError`` on failure.

    The mode comes from our configuration only: with ``secret``, the receiver's proof is mandatory
    whatever its CHALLENGE claims; without it, TLS must be configured (``tls``). ``key_id`` names the
    receiver's key ``secret`` belongs to (sent as HELLO ``key``; None: not sent, the receiver uses ``"default"``).
    ``kgen`` names the generation ``secret`` is (default: the one a ``Secret`` knows, else "0"; sent from protocol
    3 on); ``version``: the protocol spoken (default ``CLIENT_VERSION``).
    """
    version = CLIENT_VERSION if version is None else version
    if secret is not None:
        kgen = kgen if kgen is not None else getattr(secret, "generation", LEGACY_GEN)
        if not valid_gen_id(kgen):
            raise AuthError(f"generation {kgen!r} is not valid ({GEN_ID_RULE})")
    if key_id is not None and not valid_key_id(key_id):
        raise AuthError(f"key id {key_id!r} is not valid ({KEY_ID_RULE})")
    if secret is None and not tls:
        raise AuthError("no shared secret and no TLS certificates: refusing to connect unauthenticated "
                        "(pass --secret-file, or --tls-cert/--tls-key/--tls-ca)")
    if encrypt and secret is None:
        raise AuthError("--encrypt needs a shared secret (--secret-file); with TLS alone the channel is "
                        "already encrypted")
    writer = ControlWriter(sock, version)
    c_nonce = secrets.token_bytes(NONCE_BYTES)
    sent = {**hello, "version": version, "caps": list(CLIENT_CAPS), "nonce": c_nonce.hex(),
            "auth": "hmac" if secret is not None else "tls", "encrypt": bool(encrypt)}
    if key_id is not None:
        sent["key"] = key_id
    if secret is not None and version >= 3:
        sent["kgen"] = kgen
    writer.send(Frame.HELLO, sent)
    hv, _t, chal = expect_versioned(sock, Frame.CHALLENGE, max_control=PRE_AUTH_MAX_CONTROL)
    if hv != version or chal.get("version") != version:
        raise ProtocolError(f"receiver {peer} speaks protocol {chal.get('version', hv)}; this sender speaks {version}")
    s_nonce = _nonce_of(chal, "CHALLENGE")
    keys: SessionKeys | None = None
    if secret is not None:
        transcript = transcript_hash(sent, chal)
        proof = chal.get("proof")
        if not isinstance(proof, str) or not proof:
            raise AuthError(f"authentication failed: receiver {peer} sent no proof of our shared secret "
                            f"(it claims auth {chal.get('auth')!r}); not the receiver we meant? nothing was sent")
        if not hmac.compare_digest(proof, _proof(secret, b"server", c_nonce, s_nonce, transcript)):
            at = f" at generation {kgen!r}" if "kgen" in sent else ""
            raise AuthError(f"authentication failed: receiver {peer} does not know our shared secret{at} (wrong "
                            "--secret-file on one side, a generation the receiver does not accept: unknown to it, or "
                            "previous past its window; or a handshake altered in transit); nothing was sent")
        if encrypt and chal.get("encrypt") is not True:
            raise AuthError(f"receiver {peer} did not agree to encrypt (it does not support --encrypt)")
        writer.send(Frame.AUTH, {"proof": _proof(secret, b"client", c_nonce, s_nonce, transcript)})
        keys = derive_keys(secret, c_nonce, s_nonce, transcript, encrypt=encrypt,
                           aead=choose_aead(sent["caps"], peer_caps(chal)))
    else:
        if chal.get("auth") == "hmac" or chal.get("proof"):
            raise AuthError(f"receiver {peer} requires a shared secret (pass --secret-file)")
        writer.send(Frame.AUTH, {})
    link = ControlLink(sock, keys, client=True, peer=f"receiver {peer}", version=version)
    link.caps, link.peer_caps = tuple(sent["caps"]), peer_caps(chal)
    ftype, _fid, welcome = link.recv(plain_error=True)
    if ftype == Frame.ERROR:
        raise error_from_body(welcome)
    if ftype != Frame.WELCOME:
        raise ProtocolError(f"receiver {peer}: unexpected {ftype.name} frame (expected WELCOME)")
    return Handshake(welcome, keys, link, key_id=str(sent.get("key", DEFAULT_KEY)),
                     generation=kgen if secret is not None else None, version=version)


def _refuse(writer: ControlWriter, kind: str, msg: str) -> None:
    try:
        writer.send(Frame.ERROR, {"kind": kind, "message": msg})
    except FStreamError:  # the peer may already be gone; the refusal stands
        pass


def _single(secret: bytes | None) -> SecretLookup:
    def lookup(key_id: str) -> bytes | None:
        if key_id != DEFAULT_KEY:
            raise KeyError(key_id)
        return secret
    return lookup


def refuse_plaintext(conn: socket.socket) -> None:
    """On a TLS receiver, before the TLS handshake, peek: a plaintext FStream HELLO gets a plaintext, terminal auth
    ERROR ("the receiver requires TLS") instead of a TLS failure the client would see as a reset and retry."""
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


def server_handshake(sock: socket.socket, secret: bytes | None = None, tls: bool = False, *,
                     secret_for: SecretLookup | None = None, require_hmac: bool | None = None,
                     require_encryption: bool = False, peer: str = "the sender",
                     secret_at: GenLookup | None = None) -> Handshake:
    """Run the server side; return the HELLO body, keys, link, key id, generation and version (the caller sends
    WELCOME on the link).

    The key is the one HELLO names (``key``, default ``"default"``), at the generation it names (``kgen``; a
    version-2 HELLO: the current one): ``secret_at(key_id, kgen)`` gives (generation, secret) (secret None: a
    TLS-only key), raising ``KeyError`` for an unknown key and ``KeyRefused`` for a generation not accepted now.
    Without ``secret_at``, ``secret_for(key_id)`` gives a key's secret (its generations: ``generation_secret``);
    without either, ``secret`` is the one key ``"default"``. The mode comes from the receiver's configuration,
    never from the HELLO: ``require_hmac`` (default: ``secret is not None``, or True with a lookup) makes a proof
    with the named key's secret mandatory; a key that has a secret is always checked. On failure sends ERROR and
    raises ``AuthError``/``ProtocolError``.
    """
    if require_hmac is not None:
        hmac_required = require_hmac
    else:
        hmac_required = True if secret_for is not None or secret_at is not None else secret is not None
    if secret_at is None:
        lookup = secret_for if secret_for is not None else _single(secret)
        secret_at = lambda key_id, gen: generation_secret(lookup(key_id), gen)  # noqa: E731
    if not hmac_required and not tls:
        raise AuthError("receiver has neither a shared secret nor TLS certificates")
    hv, _t, hello = expect_versioned(sock, Frame.HELLO, max_control=PRE_AUTH_MAX_CONTROL)
    if hv not in SUPPORTED or hello.get("version") != hv:
        msg = (f"sender speaks protocol {hv}; this receiver speaks {speaks(SUPPORTED)}" if hv not in SUPPORTED else
               f"malformed HELLO: version {hello.get('version')!r} in protocol-{hv} frames")
        _refuse(ControlWriter(sock, hv), "protocol", msg)  # in the peer's version: an older peer can read it
        raise ProtocolError(f"{peer}: {msg}")
    version = hv
    writer = ControlWriter(sock, version)
    c_nonce = _nonce_of(hello, "HELLO")
    key_id = hello.get("key", DEFAULT_KEY)
    if not valid_key_id(key_id):
        msg = f"malformed HELLO: key is not a key id ({KEY_ID_RULE})"
        _refuse(writer, "protocol", msg)
        raise ProtocolError(msg)
    kgen = hello.get("kgen") if version >= 3 else None
    if kgen is not None and not valid_gen_id(kgen):
        msg = f"malformed HELLO: kgen is not a generation id ({GEN_ID_RULE})"
        _refuse(writer, "protocol", msg)
        raise ProtocolError(msg)
    unknown = ""  # why the key or its generation is not accepted (then the challenge is a decoy)
    try:
        generation, secret = secret_at(key_id, kgen)
    except KeyError as exc:
        why = exc.reason if isinstance(exc, KeyRefused) else "no such key on this receiver"
        if not hmac_required:
            msg = f"authentication failed: unknown key {key_id!r}"
            _refuse(writer, "auth", msg)
            raise AuthError(f"{peer}: {msg}") from None
        # a decoy secret: before authenticating, an unknown key id or a generation not accepted looks exactly like
        # a wrong secret, so neither the key ids nor the generations a receiver holds can be enumerated
        unknown, generation, secret = why, kgen or "", secrets.token_bytes(32)
    if secret is None and hmac_required:  # a key without a secret on a receiver that requires one: fail closed
        msg = f"authentication failed: key {key_id!r} has no shared secret on this receiver"
        _refuse(writer, "auth", msg)
        raise AuthError(f"{peer}: {msg}")
    encrypt = hello.get("encrypt", False)
    if not isinstance(encrypt, bool):
        raise ProtocolError("malformed HELLO: encrypt is not a boolean")
    if encrypt and secret is None:
        msg = "encryption (--encrypt) needs a shared secret on the receiver; this one uses TLS, which already encrypts"
        _refuse(writer, "auth", msg)
        raise AuthError(msg)
    if require_encryption and not encrypt and not tls:
        msg = "this receiver requires encryption: send with --encrypt"
        _refuse(writer, "auth", msg)
        raise AuthError(f"{peer}: refused: {msg}")
    s_nonce = secrets.token_bytes(NONCE_BYTES)
    body: dict[str, Any] = {"version": version, "caps": list(SERVER_CAPS), "nonce": s_nonce.hex(),
                            "auth": "hmac" if secret is not None else "tls", "encrypt": encrypt}
    keys: SessionKeys | None = None
    if secret is not None:
        transcript = transcript_hash(hello, body)  # binds the HELLO, its key id and generation included
        body["proof"] = _proof(secret, b"server", c_nonce, s_nonce, transcript)
    writer.send(Frame.CHALLENGE, body)
    try:
        _t, auth = expect(sock, Frame.AUTH, max_control=PRE_AUTH_MAX_CONTROL, versions=(version,))
    except NetworkError:
        if unknown:  # the client could not check our decoy proof and left: say why on this side
            raise AuthError(f"{peer}: authentication failed for key {key_id!r}: {unknown} (the sender gave up on "
                            "the decoy challenge)") from None
        raise
    if secret is not None:
        proof = auth.get("proof")
        if unknown or not isinstance(proof, str) or not hmac.compare_digest(
                proof, _proof(secret, b"client", c_nonce, s_nonce, transcript)):
            msg = (f"authentication failed: wrong shared secret for key {key_id!r}" if proof else
                   "authentication failed: no proof of the shared secret (this receiver requires one)")
            _refuse(writer, "auth", msg)
            raise AuthError(f"{peer}: {msg}" + (f" ({unknown})" if unknown else ""))
        keys = derive_keys(secret, c_nonce, s_nonce, transcript, encrypt=encrypt,
                           aead=choose_aead(body["caps"], peer_caps(hello)))
    link = ControlLink(sock, keys, client=False, peer=f"sender {peer}", version=version)
    link.caps, link.peer_caps = tuple(body["caps"]), peer_caps(hello)
    return Handshake(hello, keys, link, key_id=key_id, generation=generation if secret is not None else None,
                     version=version)
