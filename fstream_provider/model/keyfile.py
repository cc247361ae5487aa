"""Reading a key from a file: the one place that decides whether a secret on disk may be used.

Shared secrets (receivers, agents' keyrings) and submitters' signing keys are files of at least 16
bytes readable by their owner only. A file that group or others may read or write is refused: a
key that another account can read is not a secret, and one it can write is not ours.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

MIN_KEY_BYTES = 16
KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")  # a key's id in agents' and receivers' keyrings (fullmatch)


class KeyFileError(ValueError):
    """A key file that cannot be used; the message names the file and the reason."""


def read_key_file(path: str | os.PathLike[str], what: str = "secret file", min_bytes: int = MIN_KEY_BYTES) -> bytes:
    """The stripped contents of ``path``; ``KeyFileError`` if missing, unreadable, shared or shorter than
    ``min_bytes`` (a shared secret or signing key: 16; a password: whatever its owner chose)."""
    data = read_private_file(path, what)[0].strip()
    if len(data) < min_bytes:
        raise KeyFileError(f"{what} {Path(path)}: too short ({len(data)} bytes; need at least {min_bytes})")
    return data


def read_private_file(path: str | os.PathLike[str], what: str = "secret file") -> tuple[bytes, os.stat_result]:
    """The raw contents of ``path`` and its ``fstat`` (read from the same descriptor); ``KeyFileError`` if missing,
    unreadable, or readable or writable by group or others (issue 30: a secret ring file, ``model.secret_ring``)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise KeyFileError(f"{what} {p}: does not exist") from None
    except OSError as exc:
        raise KeyFileError(f"{what} {p}: cannot read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        mode = st.st_mode
        if mode & 0o077:
            raise KeyFileError(f"{what} {p}: readable or writable by others (mode {mode & 0o777:03o}); "
                               f"refusing to use it: run chmod 600 {p}")
        try:
            return f.read(), st
        except OSError as exc:
            raise KeyFileError(f"{what} {p}: cannot read ({exc.strerror})") from None
