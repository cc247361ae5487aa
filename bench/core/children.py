"""Stop a child process a benchmark started: SIGTERM, a grace to exit, then SIGKILL."""

from __future__ import annotations

import subprocess


def end(proc: subprocess.Popen | None, grace: float = 30.0, kill_wait: float | None = 10.0) -> None:
    """SIGTERM ``proc`` if it still runs and wait ``grace`` s for it to exit; if it has not, SIGKILL it and wait
    ``kill_wait`` s (None: until it has exited)."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(kill_wait)
