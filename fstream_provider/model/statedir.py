"""Where FStream keeps local state (embedded Redis, default secret, plots): the one place that decides it."""

from __future__ import annotations

import os
from pathlib import Path

ENV_STATE_DIR = "FSTREAM_STATE_DIR"
DEFAULT_STATE_DIR = "~/.local/state/fstream"


def state_dir() -> Path:
    """``$FSTREAM_STATE_DIR`` (``~`` expanded), else ``~/.local/state/fstream``; read at call time, never at import."""
    return Path(os.path.expanduser(os.environ.get(ENV_STATE_DIR) or DEFAULT_STATE_DIR))


def default_secret_file() -> Path:
    """The shared secret a receiver creates and a sender uses when none is given: ``<state dir>/secret``."""
    return state_dir() / "secret"
