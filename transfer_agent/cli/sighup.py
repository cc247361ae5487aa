"""SIGHUP for a daemon, with the reload machinery imported on the first one (issue 42).

``cli.reload`` (re-parse, diff, apply) is only needed when someone asks for a reload. A daemon installs
``Hangup`` at start: the handler only sets an event, a thread waits on it and builds the real
``reload.Reloader`` from ``factory`` the first time, then runs one reload per signal. A daemon that is
never reloaded never imports ``cli.reload``, so a change there is not a change to what a transfer runs
(what a benchmark's provenance hashes: ``fstream_bench.core.provenance``).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("fstream.reload")


class Hangup:
    """On SIGHUP, ``factory()`` (once; it imports ``cli.reload`` and returns its ``Reloader``), then ``reload()``."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.factory = factory
        self.reloader: Any = None
        self.requested = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def install(self) -> "Hangup":
        try:
            signal.signal(signal.SIGHUP, lambda *_: self.requested.set())
        except ValueError:  # not the main thread
            pass
        self._thread = threading.Thread(target=self._loop, name="fstream-reload", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self.requested.set()

    def _loop(self) -> None:
        while True:
            self.requested.wait()
            if self._stop.is_set():
                return
            self.requested.clear()
            try:
                if self.reloader is None:
                    self.reloader = self.factory()
                self.reloader.reload()
            except Exception:  # noqa: BLE001 - a reload never ends the daemon, nor its reload thread
                log.exception("configuration reload failed; the running configuration stays")
