"""Readiness checks of ``fstream receive`` and ``fstream agent`` (issue 30, "Health"): what ``/readyz`` serves
and what ``--check`` prints once.

Each check is real, never inferred: a data root is writable when a temporary file could be created in it and
removed again; its free space is ``statvfs`` against ``--free-space-floor``; a source root is readable when it
could be opened and listed; Redis is reachable when it answered ``PING`` within the timeout; the jobs consumer
group is present when ``XINFO GROUPS`` of the jobs stream lists it (``--check``, run before the agent starts,
also passes when there is no stream or group yet: the agent creates them). Every result names what was checked and,
when it failed, why. Nothing secret is shown (Redis URLs are printed with their password masked).

``CachedReadiness`` is what ``/readyz`` asks: the checks run at most once per period, one at a time, so a flood
of ``/readyz`` makes at most one round of probes (one file created, fsync'd and removed per data root) per period.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

READY_PROBE = ".fstream-ready-"  # prefix of the temporary file a writability check creates and removes


@dataclass(frozen=True)
class Check:
    """One readiness check: ``name`` (what was checked), ``ok``, and ``detail`` (what was found, or why not)."""

    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok' if self.ok else 'failed'}: {self.name}: {self.detail}"


Readiness = Callable[[], list[Check]]


def report(checks: Iterable[Check]) -> tuple[bool, str]:
    """(all ok, the text ``/readyz`` and ``--check`` show: ``ready``/``not ready`` then one line per check)."""
    checks = list(checks)
    ready = all(c.ok for c in checks)
    return ready, "\n".join(["ready" if ready else "not ready", *(c.line() for c in checks)]) + "\n"


class CachedReadiness:
    """``checks`` run at most once per ``max_age`` seconds and one at a time; callers in between get the last
    result. A caller that finds a round still running after ``wait`` seconds (a hung file system) gets a failed
    check saying so instead of waiting on. Checks that raise give a failed check naming the exception.

    ``runs`` counts the rounds of checks made.
    """

    def __init__(self, checks: Readiness, max_age: float = 1.0, wait: float = 5.0) -> None:
        self.checks, self.max_age, self.wait = checks, max_age, wait
        self.runs = 0
        self._lock = threading.Lock()
        self._last: tuple[float, list[Check]] | None = None  # (when the round ended, its checks)

    def _fresh(self) -> list[Check] | None:
        last = self._last
        if last is not None and time.monotonic() - last[0] < self.max_age:
            return last[1]
        return None

    def __call__(self) -> list[Check]:
        fresh = self._fresh()
        if fresh is not None:
            return fresh
        if not self._lock.acquire(timeout=self.wait):
            return [Check("readiness checks", False, f"a round of checks still running after {self.wait:g} s")]
        try:
            fresh = self._fresh()
            if fresh is not None:
                return fresh
            self.runs += 1
            try:
                result = list(self.checks())
            except Exception as exc:  # noqa: BLE001 - a check that crashed is a failed check, named
                logging.getLogger("fstream.service").exception("readiness checks failed to run")
                result = [Check("readiness checks", False, f"{type(exc).__name__}: {exc}")]
            self._last = (time.monotonic(), result)
            return result
        finally:
            self._lock.release()


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


# -- data and source roots -----------------------------------------------------------------------------
def root_writable(root: str) -> Check:
    """Create a temporary file in ``root`` (``O_EXCL``, fsync'd) and remove it."""
    name = f"data root {root} writable"
    path = os.path.join(root, f"{READY_PROBE}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return Check(name, False, f"cannot create a file in it: {_why(exc)}")
    failed = ""
    try:
        os.write(fd, b"ready\n")
        os.fsync(fd)
    except OSError as exc:
        failed = f"cannot write a file in it: {_why(exc)}"
    finally:
        os.close(fd)
    try:
        os.unlink(path)
    except OSError as exc:
        failed = failed or f"cannot remove a file from it: {_why(exc)}"
    return Check(name, not failed, failed or "created, wrote and removed a file")


def free_space(root: str, floor: int) -> Check:
    """``root``'s free bytes (for unprivileged writers) at least ``floor``."""
    name = f"data root {root} free space"
    try:
        st = os.statvfs(root)
    except OSError as exc:
        return Check(name, False, f"cannot read it: {_why(exc)}")
    free = st.f_bavail * st.f_frsize
    if free < floor:
        return Check(name, False, f"{_size(free)} free, below the floor of {_size(floor)} (--free-space-floor)")
    return Check(name, True, f"{_size(free)} free (floor {_size(floor)})")


def source_readable(root: str) -> Check:
    """Open ``root`` as a directory and read one entry of it."""
    name = f"source root {root} readable"
    try:
        with os.scandir(root) as it:
            next(it, None)
    except OSError as exc:
        return Check(name, False, f"cannot list it: {_why(exc)}")
    return Check(name, True, "listed")


def _size(n: float) -> str:
    from fstream_provider.model.units import format_bytes

    return format_bytes(n)


# -- Redis -------------------------------------------------------------------------------------------------
def redis_checks(client: Any, url: str, keys: Any, first_start: bool = False) -> list[Check]:
    """Redis answers ``PING``; the jobs stream's consumer group (the agents') exists.

    ``first_start`` (``fstream agent --check``, before the agent runs): a bus with no jobs stream or no ``agents``
    group yet passes, saying the agent creates them when it starts (a fresh Redis, or one that lost its data). A
    running agent's ``/readyz`` keeps failing without the group. Anything else Redis answers (a refused command:
    the ACL user may not read the stream; a key of another type) fails, naming the key and Redis's reason."""
    import redis

    from fstream_provider.bus.client import describe

    where = describe(url)
    try:
        client.ping()
    except redis.RedisError as exc:
        return [Check("redis reachable", False, f"{where}: {type(exc).__name__}: {exc}"),
                Check("jobs consumer group present", False, "Redis unreachable")]
    stream, group = keys.jobs_stream(), keys.jobs_group()
    checks = [Check("redis reachable", True, f"{where} answered PING")]
    name = "jobs consumer group present"
    try:
        names = [g.get("name") for g in client.xinfo_groups(stream)]
    except redis.ResponseError as exc:
        if "no such key" not in str(exc).lower():  # NOPERM (the ACL), WRONGTYPE, ...: a real problem
            return [*checks, Check(name, False, f"XINFO GROUPS {stream} refused: {type(exc).__name__}: {exc}")]
        if first_start:
            return [*checks, Check(name, True, f"no stream {stream!r} yet (first start on this bus, or Redis lost "
                                               f"its data): the agent creates it and group {group!r} when it starts")]
        names = []
    except redis.RedisError as exc:
        return [*checks, Check(name, False, f"{type(exc).__name__}: {exc}")]
    if group in names:
        checks.append(Check(name, True, f"group {group!r} on stream {stream!r}"))
    elif first_start:
        checks.append(Check(name, True, f"no group {group!r} on stream {stream!r} yet (no agent has started on this "
                                        "namespace): the agent creates it when it starts"))
    else:
        checks.append(Check(name, False,
                            f"no group {group!r} on stream {stream!r} (no agent has started on this namespace yet, "
                            "or Redis lost its data)"))
    return checks


# -- per daemon --------------------------------------------------------------------------------------------
def receiver_readiness(roots: list[str], floor: int, draining: Any = None) -> Readiness:
    """The receiver's checks: each data root writable and above the free-space ``floor``; not draining."""
    def checks() -> list[Check]:
        out = []
        for root in roots:
            out += [root_writable(root), free_space(root, floor)]
        if draining is not None:
            out.append(Check("accepting sessions", not draining.is_set(),
                             "draining (stopping): no new sessions" if draining.is_set() else "yes"))
        return out

    return checks


def agent_readiness(url: str, keys: Any, source_roots: list[str], timeout: float = 1.0,
                    client: Any = None, first_start: bool = False) -> Readiness:
    """The agent's checks: Redis reachable within ``timeout``, the jobs consumer group present (with
    ``first_start``, before the agent runs: or not made yet, ``redis_checks``), each source root readable. Uses
    its own client (short timeouts, no retries), made on first use."""
    holder = {"client": client}

    def checks() -> list[Check]:
        if holder["client"] is None:
            from fstream_provider.bus.client import connect

            try:
                holder["client"] = connect(url, socket_timeout=timeout, connect_timeout=timeout, retries=0)
            except ValueError as exc:
                return [Check("redis reachable", False, str(exc))]
        out = redis_checks(holder["client"], url, keys, first_start)
        if not source_roots:
            out.append(Check("source roots", False, "none configured (every job would be refused)"))
        return out + [source_readable(root) for root in source_roots]

    return checks
