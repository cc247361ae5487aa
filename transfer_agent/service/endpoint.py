"""The daemons' HTTP endpoint on ``--metrics-listen`` (issue 30, "Prometheus metrics" and "Health"): one small
threaded server serving ``/metrics`` (the daemon's private registry, text or OpenMetrics as the scraper asks),
``/healthz`` (200 ``ok`` while the process serves) and ``/readyz`` (200 when every readiness check passes, else
503; the body lists each check with ok/failed and its reason).

Read-only: GET and HEAD only, nothing else is served. Each request runs in its own thread, so a slow check (a
hung file system, Redis timing out) never blocks ``/healthz`` or a scrape.
"""

from __future__ import annotations

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from transfer_agent.service.health import Readiness, report

log = logging.getLogger("fstream.service")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    endpoint: "ServiceEndpoint"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

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
            try:
                ready, text = report(ep.readiness())
            except Exception as exc:  # noqa: BLE001 - a check that crashed is a failed check, named
                log.exception("readiness checks failed to run")
                ready, text = False, f"not ready\nfailed: readiness checks: {type(exc).__name__}: {exc}\n"
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
    :param readiness: returns the readiness checks, run on every ``/readyz``.
    """

    def __init__(self, listen: tuple[str, int], registry: Any, readiness: Readiness) -> None:
        self.listen, self.registry, self.readiness = listen, registry, readiness
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
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> "ServiceEndpoint":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
