"""The daemons' HTTP endpoint on ``--metrics-listen`` (issue 30, "Prometheus metrics" and "Health"): one small
threaded server serving ``/metrics`` (the daemon's private registry, text or OpenMetrics as the scraper asks),
``/healthz`` (200 ``ok`` while the process serves) and ``/readyz`` (200 when every readiness check passes, else
503; the body lists each check with ok/failed and its reason).

Read-only: GET and HEAD only, nothing else is served. Each request runs in its own thread, so a slow check (a
hung file system, Redis timing out) never blocks ``/healthz`` or a scrape.

Bounded, since it is unauthenticated (issue 30 review): at most ``max_connections`` connections are handled at
once (one more is answered ``503`` at once from the accepting thread and closed; no thread is started for it);
each handled connection waits at most ``timeout`` seconds for any read or write and lives at most ``deadline``
seconds in all (a client trickling bytes is cut too); ``/readyz`` answers from a result at most ``ready_cache``
seconds old, so a flood of it makes at most one round of checks (one write and fsync in each data root) per
period (``health.CachedReadiness``).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from transfer_agent.service.health import CachedReadiness, Readiness, report

log = logging.getLogger("fstream.service")

_BUSY_BODY = b"busy: too many connections, try again\n"
BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    endpoint: "ServiceEndpoint"

    def setup_limits(self, max_connections: int) -> None:
        self.slots = threading.BoundedSemaphore(max_connections)
        self.deadlines: dict[socket.socket, float] = {}  # connection -> when it is cut (monotonic)
        self.deadlines_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.endpoint.refused += 1
            try:
                request.setblocking(False)
                request.send(BUSY)  # fits the socket's buffer; never waits for the client
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            threading.Thread(target=self.process_request_thread, args=(request, client_address),
                             name="fstream-metrics-conn", daemon=True).start()
        except BaseException:
            self.slots.release()
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def service_actions(self) -> None:  # the serve_forever loop, every poll interval
        self.cut(time.monotonic())

    def cut(self, now: float) -> None:
        """Shut down every handled connection whose deadline is at or before ``now``."""
        with self.deadlines_lock:
            for sock, until in list(self.deadlines.items()):
                if now >= until:
                    del self.deadlines[sock]
                    try:
                        sock.shutdown(socket.SHUT_RDWR)  # wakes the handler's read or write: it ends
                    except OSError:
                        pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("metrics endpoint: connection from %s ended with an error", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def setup(self) -> None:
        ep = self.server.endpoint
        self.timeout = ep.timeout  # every read and write of the connection (StreamRequestHandler sets it)
        with self.server.deadlines_lock:
            self.server.deadlines[self.request] = time.monotonic() + ep.deadline
        super().setup()

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.server.deadlines_lock:
                self.server.deadlines.pop(self.request, None)

    def version_string(self) -> str:
        return "fstream"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._serve(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(body=False)

    def _serve(self, body: bool) -> None:
        ep = self.server.endpoint
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            from prometheus_client.exposition import choose_encoder

            encode, ctype = choose_encoder(self.headers.get("Accept", ""))
            self._reply(200, encode(ep.registry), ctype, body)
        elif path == "/healthz":
            self._reply(200, b"ok\n", "text/plain; charset=utf-8", body)
        elif path == "/readyz":
            ready, text = report(ep.readiness())
            self._reply(200 if ready else 503, text.encode(), "text/plain; charset=utf-8", body)
        else:
            self._reply(404, b"not found: /metrics, /healthz and /readyz are served\n", "text/plain; charset=utf-8",
                        body)

    def _reply(self, code: int, data: bytes, ctype: str, body: bool) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug("%s %s", self.address_string(), format % args)


class ServiceEndpoint:
    """``/metrics``, ``/healthz`` and ``/readyz`` on ``listen``.

    :param listen: (host, port) to bind; port 0 picks a free one (see ``address``).
    :param registry: the daemon's ``CollectorRegistry``.
    :param readiness: returns the readiness checks; run by ``/readyz`` at most once per ``ready_cache`` seconds.
    :param timeout: seconds a connection may stay silent (or not take what is written) before it is closed.
    :param deadline: seconds a connection may live in all.
    :param max_connections: connections handled at once; more are answered ``503`` and closed (``refused``).
    :param ready_cache: seconds a readiness result is served again.
    """

    def __init__(self, listen: tuple[str, int], registry: Any, readiness: Readiness, *, timeout: float = 5.0,
                 deadline: float = 15.0, max_connections: int = 16, ready_cache: float = 1.0) -> None:
        if timeout <= 0 or deadline <= 0 or max_connections < 1 or ready_cache < 0:
            raise ValueError(f"metrics endpoint limits: timeout {timeout}, deadline {deadline} and max_connections "
                             f"{max_connections} must be positive, ready_cache {ready_cache} not negative")
        self.listen, self.registry = listen, registry
        self.readiness = CachedReadiness(readiness, max_age=ready_cache, wait=timeout)
        self.timeout, self.deadline, self.max_connections = timeout, deadline, max_connections
        self.refused = 0  # connections answered 503 because max_connections were being handled
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "ServiceEndpoint":
        host, port = self.listen
        server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6}) if ":" in host else _Server
        try:
            server = server_cls((host, port), _Handler)
        except OSError as exc:
            raise ValueError(f"--metrics-listen {host}:{port}: cannot listen: {exc.strerror or exc}") from None
        server.endpoint = self
        server.setup_limits(self.max_connections)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="fstream-metrics", daemon=True)
        self._thread.start()
        log.info("metrics and health on %s (/metrics, /healthz, /readyz)", self.url)
        return self

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None, "endpoint not started"
        return self._server.server_address[0], self._server.server_address[1]

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server.cut(float("inf"))  # connections still handled end now, not at their timeout
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> "ServiceEndpoint":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
