"""Where a sensor or trigger looks (a local directory or ``sftp://``), and the seen-set scope derived from it."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from urllib.parse import unquote, urlparse


LOCAL_POLL_S = 0.25  # a local listing (or inotify) is cheap: look often, the latency goal is 1 s
REMOTE_POLL_S = 5.0  # an SFTP listing is a round trip and a directory read on someone else's host (Airflow's
                     # SFTPTrigger polls every 5 s too)


def default_poll_interval(path: str, given: float | None) -> float:
    """``given`` if set, else the default for where ``path`` is: local 0.25 s, ``sftp://`` 5 s."""
    if given not in (None, ""):
        return float(given)
    return REMOTE_POLL_S if str(path).startswith("sftp://") else LOCAL_POLL_S


@dataclass(frozen=True)
class Location:
    """Where to look: a local directory, or ``sftp://USER@HOST:PORT/DIR``.

    :param directory: absolute directory path on the host.
    :param host: SFTP host, or ``None`` for the local file system.
    :param port: SFTP port.
    :param username: SFTP user (default: the current user).
    """

    directory: str
    host: str | None = None
    port: int = 22
    username: str | None = None

    @classmethod
    def parse(cls, text: str) -> "Location":
        if not text:
            raise ValueError("path: a directory or sftp://USER@HOST:PORT/DIR is required")
        if text.startswith("sftp://"):
            u = urlparse(text)
            if not u.hostname:
                raise ValueError(f"path {text!r}: missing host in sftp:// URL")
            directory = unquote(u.path) or "/"
            return cls(directory=directory, host=u.hostname, port=u.port or 22,
                       username=unquote(u.username) if u.username else None)
        if "://" in text:
            raise ValueError(f"path {text!r}: only local directories and sftp:// URLs are supported")
        return cls(directory=os.path.abspath(text))

    @property
    def is_remote(self) -> bool:
        return self.host is not None

    def url(self) -> str:
        if not self.is_remote:
            return self.directory
        user = f"{self.username}@" if self.username else ""
        return f"sftp://{user}{self.host}:{self.port}{self.directory}"


def default_scope(location: str, pattern: str, recursive: bool) -> str:
    """A stable seen-set name for a watch: the same place and pattern share one memory."""
    loc = Location.parse(location)
    digest = hashlib.sha256(f"{loc.url()}\0{pattern}\0{int(recursive)}".encode()).hexdigest()[:16]
    return f"newfiles:{digest}"
