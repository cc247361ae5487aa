"""The live views' streams end when the api-server is asked to stop (issue 41), so a restart takes seconds.

An open FStream page or Transfer tab holds a server-sent-events response that never ends by itself. On SIGTERM,
uvicorn stops accepting connections and then waits for open responses to finish, for ``timeout_graceful_shutdown``
(Airflow sets it to ``[api] worker_timeout``, 120 s by default) before cancelling them: every api-server restart or
rollout took two minutes while anyone watched a transfer. Uvicorn tells the application nothing until the
connections are closed (its lifespan ``shutdown`` comes after), so the plugin chains its own handler in front of
the server's SIGTERM/SIGINT handlers when a stream starts: on the server's event loop, which runs in its main
thread, after uvicorn installed its handlers (the plugin's app is imported before that, so chaining at import
would be undone). The handler sets ``STOPPING`` and calls the server's. The streams (``ui.sse``) end within one
read when ``STOPPING`` is set; the browser's ``EventSource`` reconnects (``retry``) and resumes on the new server.

Where a stream runs off the main thread (no handler can be set there), nothing changes: the streams end at the
server's own timeout, as before.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

#: set once the process is asked to stop; the streams poll it
STOPPING = threading.Event()
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def install() -> bool:
    """Chain ``STOPPING`` in front of the current SIGTERM and SIGINT handlers (once); False off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in SIGNALS:
        prev = signal.getsignal(sig)
        if getattr(prev, "_fstream_stopping", False):
            continue
        signal.signal(sig, _chained(prev))
    return True


def _chained(prev: Any) -> Any:
    def handler(sig: int, frame: FrameType | None) -> None:
        STOPPING.set()
        if callable(prev):
            prev(sig, frame)
        elif prev == signal.SIG_DFL:  # nobody else handles it: what the signal does by default
            signal.signal(sig, signal.SIG_DFL)
            signal.raise_signal(sig)

    handler._fstream_stopping = True  # type: ignore[attr-defined]
    return handler
