"""Seen/claim stores: which files were already reported, so each is reported once (Redis or in memory).

"Reported once" is enforced by the store, not by the watcher: a file is *claimed* just before it is
reported and only the caller whose claim won reports it. The Redis store claims with ``SADD`` on the
scope's seen-set (key from the bus schema, :meth:`fstream_provider.bus.keys.Keys.seen`), so restarts,
retries, two triggerers running the same trigger, or an Airflow asset watcher re-running its trigger
after every event (apache/airflow issue 49900) never report a file twice; with this store alone the
claim happens just before the batch is returned, so delivery is at-most-once (a crash in between loses
the batch, never duplicates it); the event trigger claims through
:class:`fstream_provider.watch.pending.PendingBatches` instead, which keeps each batch until its
delivery is acknowledged (at-least-once). The Redis store remembers paths; the in-memory store (one agent's ``--watch``,
a channel) remembers each path's size and mtime, so a file rewritten after it was reported is new again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from fstream_provider.watch.packed_seen import PackedSeen, path_digest, sig_digest
from fstream_provider.watch.stability import FileStat

if TYPE_CHECKING:
    from fstream_provider.bus.keys import Keys


class SeenStore(Protocol):
    """Sync store: drop what was seen, claim what is about to be reported."""

    def unseen(self, files: list[FileStat]) -> list[FileStat]: ...

    def claim(self, files: list[FileStat]) -> list[FileStat]: ...


class AsyncSeenStore(Protocol):
    """The same over an async client (a trigger's event loop)."""

    async def aunseen(self, files: list[FileStat]) -> list[FileStat]: ...

    async def aclaim(self, files: list[FileStat]) -> list[FileStat]: ...


class MemorySeenStore:
    """Seen files in this process: a path with the size and mtime it was reported with.

    Kept packed (:class:`~fstream_provider.watch.packed_seen.PackedSeen`, 24 bytes a file), so a stream
    of a million files remembers them in tens of megabytes; :meth:`add_records` loads a landed journal.
    """

    def __init__(self) -> None:
        self._seen = PackedSeen()

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and self._seen.contains_path(path)

    def __len__(self) -> int:
        return len(self._seen)

    def same(self, path: str, size: int, mtime_ns: int) -> bool:
        """Whether ``path`` was reported with this size and mtime (what :class:`FileStat` would compare)."""
        return self._seen.get(path) == sig_digest((size, mtime_ns))

    def add_records(self, blob: bytes) -> int:
        """Mark the files of journal records (:func:`~fstream_provider.watch.packed_seen.record`) as seen."""
        return self._seen.add_records(blob)

    def unseen(self, files: list[FileStat]) -> list[FileStat]:
        return [f for f in files if self._seen.get(f.path) != sig_digest(f.signature)]

    def claim(self, files: list[FileStat]) -> list[FileStat]:
        won, items = [], []
        for f in files:
            sig = sig_digest(f.signature)
            if self._seen.get(f.path) != sig:
                items.append((path_digest(f.path), sig))
                won.append(f)
        self._seen.set_many(items)
        return won

    async def aunseen(self, files: list[FileStat]) -> list[FileStat]:
        return self.unseen(files)

    async def aclaim(self, files: list[FileStat]) -> list[FileStat]:
        return self.claim(files)


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


class RedisSeenStore:
    """A scope's seen-set in Redis; sync methods need a ``redis.Redis``, async ones a ``redis.asyncio`` client.

    :param client: the Redis client.
    :param key: the set's key (see :meth:`scoped`).
    """

    def __init__(self, client: Any, key: str) -> None:
        self.client = client
        self.key = key

    @classmethod
    def scoped(cls, client: Any, keys: Keys, scope: str) -> "RedisSeenStore":
        """The store of ``scope`` under the bus key schema."""
        return cls(client, keys.seen(scope))

    def unseen(self, files: list[FileStat]) -> list[FileStat]:
        return unseen(self.client, self.key, files)

    def claim(self, files: list[FileStat]) -> list[FileStat]:
        return claim(self.client, self.key, files)

    async def aunseen(self, files: list[FileStat]) -> list[FileStat]:
        return await aunseen(self.client, self.key, files)

    async def aclaim(self, files: list[FileStat]) -> list[FileStat]:
        return await aclaim(self.client, self.key, files)
