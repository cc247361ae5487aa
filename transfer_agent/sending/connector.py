"""Opening authenticated connections to the receiver (control link and data streams) for one session.

Issue 30: a ``Connector`` is made as a session opens and reads its secret file then (``auth.reread_secret``), and
again before every connection it opens (control and data) when the file's stamp (inode, size, mtime) changed: a
rotated file's current generation is used by the next connection, so a session that outlives the old generation's
window opens its later data connections (retuning) with the new one. Receivers require only that a session's data
connections use the session's key id, not its generation; every connection of a session speaks one protocol version.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from typing import Any

from fstream_provider.model.secret_ring import file_stamp
from transfer_agent.errors import AuthError, NetworkError
from transfer_agent.wire import auth
from transfer_agent.wire.auth import Handshake, client_handshake


class Connector:
    """Opens authenticated connections to one receiver.

    :param host: receiver host.
    :param port: receiver port.
    :param secret: shared secret (HMAC) or None with TLS.
    :param ssl_ctx: client TLS context for mutual TLS, or None.
    :param hello: fields every HELLO carries (job, attempt, session).
    :param encrypt: seal data blocks and control bodies (needs ``secret``).
    :param key_id: the receiver's key ``secret`` belongs to, named in every HELLO (None: the receiver's
        ``"default"`` key); control and data connections of a session use the same key. A ``secret`` read from
        a file (``auth.load_secret``) is read again here, and before each connection when its file changed: the
        file's current generation then.
    :param timeout: the connect timeout (``--connect-timeout``): the TCP connect within it, then TLS and each
        read of the handshake within what the connect left of it; a timeout is retryable.
    """

    def __init__(self, host: str, port: int, secret: bytes | None, ssl_ctx: ssl.SSLContext | None,
                 hello: dict[str, Any], timeout: float = 15.0, encrypt: bool = False,
                 key_id: str | None = None) -> None:
        self._path = getattr(secret, "path", None)
        self._stamp = file_stamp(self._path) if self._path else None  # before the read: a change after it is seen
        self._secret_lock = threading.Lock()  # channels open their connections from several threads
        self.host, self.port, self.secret, self.ssl_ctx, self.hello, self.timeout = (
            host, port, auth.reread_secret(secret), ssl_ctx, hello, timeout)
        self.version = auth.CLIENT_VERSION  # the protocol this session speaks (tests may run a sender as 2)
        self.encrypt = encrypt
        self.key_id = key_id

    @property
    def peer(self) -> str:
        return f"{self.host}:{self.port}"

    def connect(self, **extra: Any) -> socket.socket:
        """An authenticated connection (its keys and control link: ``connect_link``)."""
        return self.connect_link(**extra).link.sock

    def current_secret(self) -> bytes | None:
        """The secret for the next connection: read again when its file's stamp changed since the last read (one
        ``stat`` per connection), so a generation promoted during a long session is used by its new connections
        (the old one may be past its window by then). An unusable file keeps the last good secret (a warning
        names the file and the reason, once per change)."""
        if not self._path:
            return self.secret
        with self._secret_lock:
            stamp = file_stamp(self._path)
            if stamp != self._stamp:
                self._stamp = stamp
                self.secret = auth.reread_secret(self.secret)
            return self.secret

    def connect_link(self, **extra: Any) -> Handshake:
        """Connect and authenticate; the result carries the socket (``.link.sock``), keys and control link."""
        secret = self.current_secret()
        started = time.monotonic()
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except TimeoutError:
            raise self._timed_out("cannot connect to receiver", "no answer") from None
        except OSError as exc:
            raise NetworkError(f"cannot connect to receiver {self.host}:{self.port}: {exc.strerror or exc}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.settimeout(max(0.001, self.timeout - (time.monotonic() - started)))  # what is left of it
            if self.ssl_ctx is not None:
                try:
                    sock = self.ssl_ctx.wrap_socket(sock, server_hostname=self.host)
                except TimeoutError:
                    raise self._timed_out("receiver", "no TLS handshake") from None
                except (ssl.SSLError, OSError) as exc:
                    raise AuthError(f"TLS handshake with {self.host}:{self.port} failed: {exc}") from None
            try:
                hs = client_handshake(sock, secret, {**self.hello, **extra}, tls=self.ssl_ctx is not None,
                                      encrypt=self.encrypt, peer=self.peer, key_id=self.key_id,
                                      version=self.version)
            except NetworkError as exc:
                if isinstance(exc.__cause__, TimeoutError):
                    raise self._timed_out("receiver", "no answer to the handshake") from None
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

    def _timed_out(self, what: str, reason: str) -> NetworkError:
        return NetworkError(f"{what} {self.peer}: {reason} within the connect timeout ({self.timeout:g} s)")
