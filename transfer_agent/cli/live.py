"""Print a view once, or again every few seconds until interrupted (``fstream pools --watch``, ``fstream schedule --watch``)."""

from __future__ import annotations

import threading
from collections.abc import Callable

EXIT_OK = 0


def print_live(render: Callable[[], str], every_s: float | None) -> int:
    """Print ``render()``; with ``every_s``, print it again every ``every_s`` seconds until Ctrl-C."""
    stop = threading.Event()
    while True:
        print(render(), flush=True)
        if not every_s:
            return EXIT_OK
        try:
            if stop.wait(every_s):
                return EXIT_OK
        except KeyboardInterrupt:
            return EXIT_OK
        print()
