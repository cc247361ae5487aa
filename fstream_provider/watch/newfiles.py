"""Find new, complete files in a local directory or over SFTP, and report each once via a Redis seen-set.

Shared by ``FStreamNewFilesSensor`` (sync, poke) and ``FStreamNewFilesTrigger`` (async). This is the
thesis' "streaming data finder" (fstream-thesis ch. 2): scan, keep only files whose size and mtime
did not change between two looks (the writer closed them), and skip what was already shipped.

"Reported once" is enforced by Redis, not by the process: a file is *claimed* with ``SADD`` on the
scope's seen-set and only the caller whose ``SADD`` returned 1 reports it. So restarts, retries, two
triggerers running the same trigger, or an Airflow asset watcher re-running its trigger after every
event (apache/airflow issue 49900) never report a file twice. The claim happens just before the event
is emitted: delivery is at-most-once (a crash in between loses the notification, never duplicates it).
No Airflow import here.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath
import stat as statmod
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterable
from urllib.parse import unquote, urlparse


@dataclass(frozen=True)
class FileStat:
    """One file seen by a scan.

    :param path: absolute path on the host that holds it.
    :param size: bytes.
    :param mtime: modification time (UNIX seconds).
    """

    path: str
    size: int
    mtime: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def _matches(rel: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(rel, pattern) or fnmatch.fnmatchcase(posixpath.basename(rel), pattern)


def _hidden_or_partial(name: str) -> bool:
    # Dot-files include our own ".NAME.<job>.<attempt>.part" temps and most writers' temp files.
    return name.startswith(".") or name.endswith((".part", ".tmp", ".swp"))


def list_local(directory: str, pattern: str = "*", recursive: bool = False) -> list[FileStat]:
    """Regular files under ``directory`` matching ``pattern`` (on the relative path or the name)."""
    out: list[FileStat] = []
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"watch directory {directory!r} does not exist or is not a directory")
    stack = [directory]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except FileNotFoundError:
            continue  # removed while scanning
        for e in entries:
            if _hidden_or_partial(e.name):
                continue
            try:
                if e.is_dir(follow_symlinks=False):
                    if recursive:
                        stack.append(e.path)
                    continue
                if not e.is_file(follow_symlinks=False):
                    continue
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            rel = os.path.relpath(e.path, directory)
            if _matches(rel, pattern):
                out.append(FileStat(path=e.path, size=st.st_size, mtime=st.st_mtime))
    out.sort(key=lambda f: (f.mtime, f.path))
    return out


def list_sftp(sftp: Any, directory: str, pattern: str = "*", recursive: bool = False) -> list[FileStat]:
    """Like :func:`list_local` over a ``paramiko.SFTPClient``."""
    out: list[FileStat] = []
    stack = [directory]
    while stack:
        d = stack.pop()
        try:
            attrs = sftp.listdir_attr(d)
        except FileNotFoundError:
            if d == directory:
                raise FileNotFoundError(f"remote watch directory {directory!r} does not exist") from None
            continue
        for a in attrs:
            if _hidden_or_partial(a.filename):
                continue
            path = posixpath.join(d, a.filename)
            mode = a.st_mode or 0
            if statmod.S_ISDIR(mode):
                if recursive:
                    stack.append(path)
                continue
            if not statmod.S_ISREG(mode):
                continue
            rel = posixpath.relpath(path, directory)
            if _matches(rel, pattern):
                out.append(FileStat(path=path, size=int(a.st_size or 0), mtime=float(a.st_mtime or 0)))
    out.sort(key=lambda f: (f.mtime, f.path))
    return out


def open_sftp(location: Location, *, key_file: str | None = None, password: str | None = None,
              known_hosts: str | None = None, timeout: float = 10.0) -> tuple[Any, Any]:
    """Connect with paramiko; unknown host keys are refused. Returns ``(ssh_client, sftp_client)``."""
    import paramiko

    ssh = paramiko.SSHClient()
    if known_hosts:
        ssh.load_host_keys(known_hosts)
    else:
        ssh.load_system_host_keys()
    ssh.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        ssh.connect(location.host, port=location.port, username=location.username, key_filename=key_file,
                    password=password, timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
                    allow_agent=False, look_for_keys=key_file is None and password is None)
        return ssh, ssh.open_sftp()
    except Exception as exc:
        ssh.close()
        raise ConnectionError(f"SFTP {location.url()}: cannot connect ({type(exc).__name__}: {exc})") from exc


class StabilityTracker:
    """Keeps the previous look at each file; a file is complete once size and mtime held still.

    :param min_age: a file whose mtime is at least this many seconds old counts as complete on the
        first look (so a restarted watcher does not wait for a second scan of old files); ``0``
        always requires two looks.
    """

    def __init__(self, *, min_age: float = 0.0) -> None:
        self.min_age = min_age
        self._last: dict[str, tuple[int, float]] = {}

    def observe(self, files: Iterable[FileStat], now: float | None = None) -> list[FileStat]:
        """Record this look; return the files that are complete."""
        now = time.time() if now is None else now
        current: dict[str, tuple[int, float]] = {}
        stable: list[FileStat] = []
        for f in files:
            sig = (f.size, f.mtime)
            current[f.path] = sig
            if self._last.get(f.path) == sig or (self.min_age > 0 and now - f.mtime >= self.min_age):
                stable.append(f)
        self._last = current
        return stable

    def forget(self, paths: Iterable[str]) -> None:
        for p in paths:
            self._last.pop(p, None)


def select_batch(candidates: list[FileStat], max_files: int | None) -> list[FileStat]:
    """Oldest first, at most ``max_files``."""
    return candidates[:max_files] if max_files else list(candidates)


def unseen(client: Any, key: str, files: list[FileStat]) -> list[FileStat]:
    """Drop files already in the seen-set (sync redis client)."""
    if not files:
        return []
    flags = client.smismember(key, [f.path for f in files])
    return [f for f, seen in zip(files, flags) if not int(seen)]


def claim(client: Any, key: str, files: list[FileStat]) -> list[FileStat]:
    """Atomically claim each file in the seen-set; return those this caller won (sync client)."""
    if not files:
        return []
    pipe = client.pipeline(transaction=False)
    for f in files:
        pipe.sadd(key, f.path)
    return [f for f, added in zip(files, pipe.execute()) if int(added) == 1]


async def aunseen(client: Any, key: str, files: list[FileStat]) -> list[FileStat]:
    """Async variant of :func:`unseen` (``redis.asyncio`` client)."""
    if not files:
        return []
    flags = await client.smismember(key, [f.path for f in files])
    return [f for f, seen in zip(files, flags) if not int(seen)]


async def aclaim(client: Any, key: str, files: list[FileStat]) -> list[FileStat]:
    """Async variant of :func:`claim` (``redis.asyncio`` client)."""
    if not files:
        return []
    pipe = client.pipeline(transaction=False)
    for f in files:
        pipe.sadd(key, f.path)
    results = await pipe.execute()
    return [f for f, added in zip(files, results) if int(added) == 1]


def seen_key(namespace: str, scope: str) -> str:
    """The Redis key of a scope's seen-set (from the shared key schema when available)."""
    from fstream_provider.bus.keys import Keys

    return Keys(namespace).seen(scope)


def batch_payload(files: list[FileStat], *, scope: str, location: str) -> dict[str, Any]:
    """The XCom / TriggerEvent body for a batch of new files."""
    total = sum(f.size for f in files)
    return {
        "status": "success",
        "message": f"{len(files)} new complete file(s), {total} bytes, in {location}",
        "files": [f.path for f in files],
        "details": [f.to_dict() for f in files],
        "bytes": total,
        "scope": scope,
        "location": location,
    }


class Scanner:
    """Lists a :class:`Location`, locally or over one reused SFTP session (sync).

    :param location: where to look.
    :param pattern: glob on the relative path or the file name.
    :param recursive: descend into subdirectories.
    :param key_file: SSH private key for SFTP.
    :param password: SSH password for SFTP (prefer keys).
    :param known_hosts: known_hosts file to trust; unknown host keys are always refused.
    """

    def __init__(self, location: Location, *, pattern: str = "*", recursive: bool = False,
                 key_file: str | None = None, password: str | None = None,
                 known_hosts: str | None = None) -> None:
        self.location = location
        self.pattern = pattern
        self.recursive = recursive
        self.key_file = key_file
        self.password = password
        self.known_hosts = known_hosts
        self._ssh: Any = None
        self._sftp: Any = None

    def scan(self) -> list[FileStat]:
        if not self.location.is_remote:
            return list_local(self.location.directory, self.pattern, self.recursive)
        if self._sftp is None:
            self._ssh, self._sftp = open_sftp(self.location, key_file=self.key_file, password=self.password,
                                              known_hosts=self.known_hosts)
        try:
            return list_sftp(self._sftp, self.location.directory, self.pattern, self.recursive)
        except FileNotFoundError:
            raise
        except Exception as exc:  # OSError, EOFError, paramiko.SSHException: the session is broken
            self.close()  # reconnect on the next scan
            raise ConnectionError(f"SFTP {self.location.url()}: listing failed ({type(exc).__name__}: {exc})") from exc

    def close(self) -> None:
        if self._ssh is not None:
            self._ssh.close()
        self._ssh = self._sftp = None
