"""Authentication that fails closed: an HMAC challenge on a shared secret, or mutual TLS.

Handshake (every connection, control or data):

1. client → ``HELLO`` {version, caps, role, session, nonce, ...}
2. server → ``CHALLENGE`` {version, caps, nonce, proof = HMAC(secret, "server" | c_nonce | s_nonce)}
3. client checks the server's proof, then → ``AUTH`` {proof = HMAC(secret, "client" | s_nonce | c_nonce)}
4. server checks it → ``WELCOME`` or ``ERROR`` {kind: auth}

Both sides prove knowledge of the secret without sending it; fresh nonces on both sides make
a recorded handshake useless. With TLS, both sides present certificates checked against the
given CA (``CERT_REQUIRED``) before any frame is exchanged; a shared secret, if also given, is
checked on top. There is no unauthenticated mode.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transfer_agent.errors import AuthError, ProtocolError
from transfer_agent.protocol import CAPABILITIES, VERSION, ControlWriter, Frame, expect

NONCE_BYTES = 32


def load_secret(path: str | os.PathLike[str] | None) -> bytes | None:
    """Read a shared secret file; refuse empty or world-readable-by-mistake secrets loudly."""
    if path is None:
        return None
    p = Path(path)
    try:
        data = p.read_bytes().strip()
    except FileNotFoundError:
        raise AuthError(f"secret file {p}: does not exist") from None
    except OSError as exc:
        raise AuthError(f"secret file {p}: cannot read ({exc.strerror})") from None
    if len(data) < 16:
        raise AuthError(f"secret file {p}: too short ({len(data)} bytes; need at least 16)")
    return data


def create_secret_file(path: str | os.PathLike[str]) -> Path:
    """Create a random secret readable only by the owner (if it does not exist)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if not p.exists():
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    return p


def _proof(secret: bytes, label: bytes, a: bytes, b: bytes) -> str:
    return hmac.new(secret, label + b"|" + a + b"|" + b, hashlib.sha256).hexdigest()


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
                     tls: bool = False) -> dict[str, Any]:
    """Run the client side; return the server's WELCOME body. Raises ``AuthError`` on failure."""
    if secret is None and not tls:
        raise AuthError("no shared secret and no TLS certificates: refusing to connect unauthenticated "
                        "(pass --secret-file, or --tls-cert/--tls-key/--tls-ca)")
    writer = ControlWriter(sock)
    c_nonce = secrets.token_bytes(NONCE_BYTES)
    writer.send(Frame.HELLO, {**hello, "version": VERSION, "caps": list(CAPABILITIES), "nonce": c_nonce.hex(),
                              "auth": "hmac" if secret is not None else "tls"})
    _t, chal = expect(sock, Frame.CHALLENGE)
    if chal.get("version") != VERSION:
        raise ProtocolError(f"receiver speaks protocol version {chal.get('version')}, we speak {VERSION}")
    try:
        s_nonce = bytes.fromhex(str(chal.get("nonce", "")))
    except ValueError:
        raise ProtocolError("malformed CHALLENGE: nonce is not hex") from None
    if len(s_nonce) != NONCE_BYTES:
        raise ProtocolError("malformed CHALLENGE: nonce has the wrong length")
    server_ok = True
    if chal.get("auth") == "hmac":
        if secret is None:
            raise AuthError("receiver requires a shared secret (pass --secret-file)")
        server_ok = hmac.compare_digest(str(chal.get("proof", "")), _proof(secret, b"server", c_nonce, s_nonce))
        writer.send(Frame.AUTH, {"proof": _proof(secret, b"client", s_nonce, c_nonce)})
    else:
        writer.send(Frame.AUTH, {})
    if not server_ok:
        raise AuthError("authentication failed: the receiver does not know our shared secret "
                        "(wrong --secret-file on one side?)")
    _t, welcome = expect(sock, Frame.WELCOME)
    return welcome


def server_handshake(sock: socket.socket, secret: bytes | None, tls: bool = False) -> dict[str, Any]:
    """Run the server side; return the client's HELLO body. On failure sends ERROR and raises ``AuthError``."""
    if secret is None and not tls:
        raise AuthError("receiver has neither a shared secret nor TLS certificates")
    writer = ControlWriter(sock)
    _t, hello = expect(sock, Frame.HELLO)
    if hello.get("version") != VERSION:
        msg = f"unsupported protocol version {hello.get('version')} (receiver speaks {VERSION})"
        writer.send(Frame.ERROR, {"kind": "protocol", "message": msg})
        raise ProtocolError(msg)
    try:
        c_nonce = bytes.fromhex(str(hello.get("nonce", "")))
    except ValueError:
        raise ProtocolError("malformed HELLO: nonce is not hex") from None
    if len(c_nonce) != NONCE_BYTES:
        raise ProtocolError("malformed HELLO: nonce has the wrong length")
    s_nonce = secrets.token_bytes(NONCE_BYTES)
    body: dict[str, Any] = {"version": VERSION, "caps": list(CAPABILITIES), "nonce": s_nonce.hex(),
                            "auth": "hmac" if secret is not None else "tls"}
    if secret is not None:
        body["proof"] = _proof(secret, b"server", c_nonce, s_nonce)
    writer.send(Frame.CHALLENGE, body)
    _t, auth = expect(sock, Frame.AUTH)
    if secret is not None:
        if not hmac.compare_digest(str(auth.get("proof", "")), _proof(secret, b"client", s_nonce, c_nonce)):
            msg = "authentication failed: wrong shared secret"
            try:
                writer.send(Frame.ERROR, {"kind": "auth", "message": msg})
            except Exception:  # noqa: BLE001 - peer may already be gone; the refusal stands
                pass
            raise AuthError(msg)
    return hello
