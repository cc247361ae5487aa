"""Objects shared per (running event loop, Redis URL): the triggers' one ``redis.asyncio`` client per loop.

The triggerer runs every trigger on one event loop; each trigger used to open its own client (and its own
connections). ``CLIENTS.acquire(url)`` hands every user on the same loop the same client for the same URL,
with at most ``MAX_COMMANDS`` commands in flight (so at most that many connections, however many triggers
share it), and closes it when the last user releases it. A client is never handed to another loop (tests
run many loops; a ``redis.asyncio`` connection belongs to the loop that opened it). If users never release
(a bug, or a loop stopped under them), the loop's shutdown (``loop.shutdown_asyncgens()``, which
``asyncio.run`` calls) closes what is left; what a loop closed without it still holds is dropped at the
next ``acquire`` (the registry knows loops by weak reference and never hands out an object of a closed loop),
and its sockets go with the client objects.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from fstream_provider.bus import client as bus_client

MAX_COMMANDS = 2  # commands in flight on a shared client = the connections it opens, per loop and URL

T = TypeVar("T")


@dataclass
class _Held(Generic[T]):
    obj: T
    users: int = 0


@dataclass
class _LoopShare(Generic[T]):
    """What one loop holds: its objects by key, and the async generator that closes them at the loop's shutdown."""

    loop: weakref.ref
    held: dict[str, _Held[T]] = field(default_factory=dict)
    guard: Any = None


class PerLoop(Generic[T]):
    """A registry of objects shared by key within one running event loop, reference counted.

    :param make: builds the object for a key (synchronously: no I/O; connections open on first use).
    :param close: closes an object (awaited on the loop that used it).
    """

    def __init__(self, make: Callable[[str], T], close: Callable[[T], Awaitable[None]]) -> None:
        self._make = make
        self._close = close
        self._loops: dict[int, _LoopShare[T]] = {}

    async def acquire(self, key: str) -> T:
        """The running loop's object for ``key`` (made on first use); give it back with ``release``."""
        loop = asyncio.get_running_loop()
        self._prune()
        share = self._loops.get(id(loop))
        if share is None or share.loop() is not loop:
            share = _LoopShare(weakref.ref(loop))
            self._loops[id(loop)] = share
            share.guard = self._guard(share)
            await share.guard.asend(None)  # runs to its ``yield``: registered with the loop's shutdown
        held = share.held.get(key)
        if held is None:
            held = share.held[key] = _Held(self._make(key))
        held.users += 1
        return held.obj

    async def release(self, key: str, obj: T) -> None:
        """One user fewer; the last one closes the object. Releasing what is no longer held is a no-op."""
        share = self._loops.get(id(asyncio.get_running_loop()))
        held = share.held.get(key) if share is not None else None
        if held is None or held.obj is not obj:
            return
        held.users -= 1
        if held.users > 0:
            return
        del share.held[key]
        if not share.held and self._loops.get(id(share.loop())) is share:
            del self._loops[id(share.loop())]
            await share.guard.aclose()  # nothing left for it to close
        await self._close(obj)

    def current(self, key: str) -> T | None:
        """The running loop's object for ``key`` if one is held (for tests and measurements)."""
        share = self._loops.get(id(asyncio.get_running_loop()))
        held = share.held.get(key) if share is not None else None
        return None if held is None else held.obj

    def held(self) -> int:
        """How many objects are held, over every loop (0 once every user released)."""
        self._prune()
        return sum(len(s.held) for s in self._loops.values())

    def _prune(self) -> None:
        """Drop what loops that are gone or closed still hold: it can never be used or closed on its loop."""
        for loop_id, share in list(self._loops.items()):
            loop = share.loop()
            if loop is None or loop.is_closed():
                del self._loops[loop_id]
                share.held = {}
                closing = share.guard.aclose()  # with nothing held it ends without awaiting: finish it here, so
                try:                            # the loop's finalizer hook is never called on a closed loop
                    closing.send(None)
                except StopIteration:
                    pass

    async def _guard(self, share: _LoopShare[T]) -> AsyncIterator[None]:
        """Closes whatever the loop still holds when the loop shuts down (``shutdown_asyncgens``)."""
        try:
            yield
        finally:
            if self._loops.get(id(share.loop())) is share:
                del self._loops[id(share.loop())]
            left, share.held = list(share.held.values()), {}
            for held in left:
                try:
                    await self._close(held.obj)
                except Exception:  # noqa: BLE001 - the loop is shutting down; a close that fails leaks nothing more
                    pass


def raise_if_cancelled() -> None:
    """Re-raise a cancellation of the current task that an awaited call swallowed.

    ``redis.asyncio`` can lose a ``CancelledError`` that lands while a blocking command's internal
    timeout fires (redis/redis-py#2551, #2028): the command returns normally and a trigger the
    triggerer cancelled (shutdown, reassignment) would keep running and fire later. ``Task.cancelling()``
    still counts the request, so checking it after every Redis call restores the cancellation.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError("trigger cancelled (the cancellation was swallowed by the Redis client)")


def bound_commands(client: Any, limit: int) -> Any:
    """Let at most ``limit`` commands of ``client`` be in flight at once; returns ``client``.

    Every command of a ``redis.asyncio`` client (``Redis``, a Sentinel master, ``RedisCluster``), scripts
    included, goes through its ``execute_command``; the pool opens a connection only when none is idle, so
    ``limit`` commands in flight means at most ``limit`` connections (per node for a Cluster). Pipelines take
    their own connection: the triggers use none on the async client.
    """
    gate = asyncio.Semaphore(limit)
    execute = client.execute_command

    async def execute_command(*args: Any, **options: Any) -> Any:
        async with gate:
            return await execute(*args, **options)

    client.execute_command = execute_command
    return client


def name_connections(client: Any, name: str) -> Any:
    """Name every connection ``client`` opens (``CLIENT SETNAME``, in the ``@connection`` ACL category every
    role has): ``CLIENT LIST`` then shows who holds which connection. Cluster clients keep no such setting."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if isinstance(kwargs, dict):
        kwargs["client_name"] = name
    return client


def connection_name(role: str) -> str:
    """``fstream-<role>-<pid>``: the name of this process's shared connections of one role."""
    return f"fstream-{role}-{os.getpid()}"


def _shared_client(url: str) -> Any:
    client = bus_client.connect_async(url)
    return bound_commands(name_connections(client, connection_name("shared")), MAX_COMMANDS)


async def _aclose(client: Any) -> None:
    await client.aclose()


#: the shared ``redis.asyncio`` client per (loop, URL): ``client = await CLIENTS.acquire(url)`` ...
#: ``await CLIENTS.release(url, client)``
CLIENTS: PerLoop[Any] = PerLoop(_shared_client, _aclose)
