"""The service options of ``fstream receive`` and ``fstream agent`` (issue 30, "Prometheus metrics" and
"Health"): ``--metrics-listen``, ``--free-space-floor`` (receiver), ``--log-level`` and ``--check``.

Only argparse here: building the parser imports nothing else (``tests/test_cli_startup.py``); the metrics
and the server are imported by ``attach`` when ``--metrics-listen`` or ``--check`` is given.
"""

from __future__ import annotations

import argparse

DEFAULT_FREE_SPACE_FLOOR = "1GiB"
LOG_LEVELS = ("debug", "info", "warning", "error")


def parse_listen(text: str, option: str = "--metrics-listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``; port 0: any free one) → (host, port); ValueError naming ``option``."""
    host, sep, port = (text or "").rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{option} {text!r}: expected HOST:PORT (e.g. 127.0.0.1:9464; port 0 picks a free one)")
    return host, int(port)


def add_service_options(p: argparse.ArgumentParser, *, receiver: bool) -> None:
    """Add the service options to the ``receive`` (``receiver``) or ``agent`` parser."""
    p.add_argument("--metrics-listen", metavar="HOST:PORT",
                   help="serve Prometheus metrics (/metrics) and health (/healthz, /readyz) on this address (port "
                        "0: any free port, printed); off by default (docs/metrics.md)")
    if receiver:
        p.add_argument("--free-space-floor", metavar="SIZE", default=DEFAULT_FREE_SPACE_FLOOR,
                       help="/readyz and --check fail while the root has less free space than this "
                            f"(default {DEFAULT_FREE_SPACE_FLOOR})")
        what = "the root is writable (a file created and removed) and has free space above --free-space-floor"
    else:
        what = ("Redis is reachable and may read the jobs stream, its consumer group exists or none does yet (the "
                "agent creates it when it starts), and every source root is readable")
    p.add_argument("--log-level", choices=LOG_LEVELS, default=None,
                   help="what the daemon logs (default: -v's, else warning); SIGHUP applies a new one")
    p.add_argument("--check", action="store_true",
                   help=f"run the readiness checks once ({what}), print them, exit 0 when all pass, else 1")
