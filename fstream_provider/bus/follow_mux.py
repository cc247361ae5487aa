"""One ``XREAD BLOCK`` for every job event stream followed on an event loop: the triggers' follows, multiplexed.

Before, each deferred transfer task's trigger held its own Redis connection blocked in ``XREAD BLOCK`` on
its job's event stream: 200 deferred tasks, 200 connections and 200 blocked reads on one triggerer. Now
each (loop, Redis URL) has one ``StreamMux``: its reader task issues one ``XREAD BLOCK MUX_BLOCK_MS
STREAMS k1 k2 ... id1 id2 ...`` for every stream being followed, hands each follower the entries of its
stream, and re-issues with the ids moved on. A follower registers its stream key and the id it reads after
(``MuxFollower``) and reads what the reader found for it, in order, each entry once.

Connections per loop and URL: the reader's own (one, blocked at most ``MUX_BLOCK_MS``) and the shared
command client's (``aio_shared.CLIENTS``: at most ``MAX_COMMANDS``), whatever the number of followers.
A blocked ``XREAD`` cannot be interrupted without closing its connection (``CLIENT UNBLOCK`` is an
``@admin`` command no FStream role has), so a stream that starts being followed joins the read at the next
round, at most ``MUX_BLOCK_MS`` later; its first read looks once on its own (catch-up), so events already
written arrive at once. After a round that brought entries the next one waits until ``MIN_ROUND_S`` after
the last one started: with many busy streams the reader batches their entries instead of re-issuing a read
of every key for each one. One ``XREAD`` names at most ``MAX_KEYS`` streams; with more, the reader polls:
one non-blocking ``XREAD`` per group of streams every ``POLL_S``.

Redis Cluster: ``XREAD`` over several keys works when they share a hash slot. The streams are grouped by
slot (every job event stream of a namespace carries the ``{ns}`` hash tag: one group per namespace), so one
namespace is one blocking read as on a single Redis; several namespaces on one cluster URL poll as above.

Errors: the reader's client retries as every FStream client does (``bus.client``); an error that outlasts
those retries is raised to every follower in that round, from its next ``read`` (as a follower's own
``XREAD`` raised it before), and the reader tries again after ``ERROR_PAUSE_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from redis.crc import key_slot

from fstream_provider.bus import client as bus_client
from fstream_provider.bus.aio_shared import CLIENTS, PerLoop, connection_name, name_connections, raise_if_cancelled

MUX_BLOCK_MS = 1000  # the reader's block: how late a newly followed stream joins the shared read, at most
MAX_KEYS = 500  # streams named by one XREAD
COUNT = 500  # entries per stream per read; a follower holding this many unread is skipped until it reads
MIN_ROUND_S = 0.05  # after a round that brought entries, the next starts no sooner than this after it
POLL_S = 0.1  # more than one group of streams: non-blocking reads this often
ERROR_PAUSE_S = 1.0  # after a failed round


def stream_id(entry_id: str) -> tuple[int, int]:
    """``"ms-seq"`` as a pair that sorts as Redis sorts stream ids (``"0"`` is ``(0, 0)``)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class MuxFollower:
    """One follower of one stream: the id the reader reads after, and the entries read for it, in order.

    :param mux: the loop's ``StreamMux``.
    :param key: the stream.
    :param after: the id to read after.
    """

    def __init__(self, mux: StreamMux, key: str, after: str) -> None:
        self.mux = mux
        self.key = key
        self.last_id = after  # the newest entry handed to this follower (read, or waiting in ``ready``)
        self._last = stream_id(after)
        self.ready: deque[tuple[str, dict]] = deque()
        self.error: BaseException | None = None
        self._wake = asyncio.Event()
        self._fresh = True

    def deliver(self, entries: list) -> bool:
        """Take the entries after ``last_id`` (each once, in order); True if there was any."""
        took = False
        for eid, fields in entries:
            sid = stream_id(eid)
            if sid > self._last:
                self.ready.append((eid, fields))
                self.last_id, self._last = eid, sid
                took = True
        if took:
            self._wake.set()
        return took

    def fail(self, exc: BaseException) -> None:
        """The reader's round failed: the next ``read`` raises ``exc``."""
        self.error = exc
        self._wake.set()

    @property
    def full(self) -> bool:
        return len(self.ready) >= COUNT

    def _raise_error(self) -> None:
        if self.error is not None:
            exc, self.error = self.error, None
            raise exc.with_traceback(None)

    async def read(self, *, after: str = "0-0", block_ms: int | None = None, count: int = 100
                   ) -> list[tuple[str, dict]]:
        """Entries after ``after``, at most ``count``; with ``block_ms`` waits up to that long for the first one
        (``0``: for ever, as ``XREAD BLOCK 0``), without it looks once on its own (a drain).

        Raises the error of a failed round of the reader.
        """
        self._raise_error()
        if not self.ready and (block_ms is None or self._fresh):
            self._fresh = False
            self.deliver(await self.mux.read_now(self.key, self.last_id, count))
            raise_if_cancelled()
        if not self.ready and block_ms is not None:
            self._wake.clear()
            try:
                async with asyncio.timeout(block_ms / 1000 if block_ms else None):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._raise_error()
        was_full = self.full
        floor, out = stream_id(after), []
        while self.ready and len(out) < count:
            eid, fields = self.ready.popleft()
            if stream_id(eid) > floor:
                out.append((eid, fields))
        if was_full and not self.full:
            self.mux.changed.set()  # its stream was left out of the reads: read it again
        return out


class StreamMux:
    """The reader of one (loop, Redis URL): one ``XREAD BLOCK`` for every followed stream.

    :param url: the Redis URL (``bus.client.connect_async``).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.reader = name_connections(bus_client.connect_async(url), connection_name("mux"))
        self.followers: dict[str, set[MuxFollower]] = {}
        self.changed = asyncio.Event()
        self.rounds = 0  # XREADs issued by the reader (tests, the benchmark)
        self._cluster = _is_cluster(self.reader)
        self._client: Any = None
        self._task: asyncio.Task | None = None

    def follow(self, key: str, after: str = "0-0") -> MuxFollower:
        """Register a follower of ``key`` from ``after``; read it with ``MuxFollower.read``, end with ``unfollow``."""
        f = MuxFollower(self, key, after)
        self.followers.setdefault(key, set()).add(f)
        self.changed.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"fstream-mux {self.url}")
        return f

    def unfollow(self, follower: MuxFollower) -> None:
        group = self.followers.get(follower.key)
        if group is not None:
            group.discard(follower)
            if not group:
                del self.followers[follower.key]

    async def read_now(self, key: str, after: str, count: int) -> list:
        """One non-blocking ``XREAD`` of ``key`` on the shared command client (a follower's catch-up or drain)."""
        if self._client is None:
            client = await CLIENTS.acquire(self.url)
            if self._client is None:
                self._client = client
            else:
                await CLIENTS.release(self.url, client)
        resp = await self._client.xread({key: after}, count=count)
        return [e for k, entries in _streams(resp) if k == key for e in entries]

    def _wanted(self) -> dict[str, str]:
        """Each followed stream with a follower that is not full, and the oldest id such a follower read to."""
        out: dict[str, str] = {}
        for key, group in self.followers.items():
            ids = [f.last_id for f in group if not f.full]
            if ids:
                out[key] = min(ids, key=stream_id)
        return out

    def _groups(self, wanted: dict[str, str]) -> list[dict[str, str]]:
        """``wanted`` cut into reads of at most ``MAX_KEYS`` streams, each within one hash slot on a Cluster."""
        by_slot: dict[int, list[str]] = {}
        for key in wanted:
            by_slot.setdefault(key_slot(key.encode()) if self._cluster else 0, []).append(key)
        return [{k: wanted[k] for k in keys[i:i + MAX_KEYS]}
                for keys in by_slot.values() for i in range(0, len(keys), MAX_KEYS)]

    def _dispatch(self, resp: Any) -> bool:
        got = False
        for key, entries in _streams(resp):
            for f in list(self.followers.get(key, ())):
                got = f.deliver(entries) or got
        return got

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less if a follower came or made room meanwhile."""
        try:
            async with asyncio.timeout(seconds):
                await self.changed.wait()
        except TimeoutError:
            pass

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self.followers:
            self.changed.clear()
            wanted = self._wanted()
            if not wanted:  # every follower holds a full batch: wait until one reads
                await self._pause(MUX_BLOCK_MS / 1000)
                continue
            groups = self._groups(wanted)
            started = loop.time()
            try:
                if len(groups) == 1:
                    self.rounds += 1
                    got = self._dispatch(await self.reader.xread(groups[0], count=COUNT, block=MUX_BLOCK_MS))
                else:
                    got = False
                    for g in groups:
                        self.rounds += 1
                        got = self._dispatch(await self.reader.xread(g, count=COUNT)) or got
                    if not got:
                        await self._pause(POLL_S)
            except Exception as exc:  # noqa: BLE001 - Redis unreachable after retries, or refused: the followers see it
                for key in wanted:
                    for f in self.followers.get(key, ()):
                        f.fail(exc)
                raise_if_cancelled()
                await self._pause(ERROR_PAUSE_S)
                continue
            raise_if_cancelled()
            if got:
                await asyncio.sleep(max(0.0, started + MIN_ROUND_S - loop.time()))

    async def aclose(self) -> None:
        """Stop the reader and close its client; give the shared command client back."""
        self.followers.clear()
        task, self._task = self._task, None
        try:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        finally:
            try:
                await self.reader.aclose()
            finally:
                client, self._client = self._client, None
                if client is not None:
                    await CLIENTS.release(self.url, client)


def _is_cluster(client: Any) -> bool:
    from redis.asyncio.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def _streams(resp: Any) -> list[tuple[str, list]]:
    """``XREAD``'s reply as ``[(key, entries)]`` (RESP2 gives a list of pairs, RESP3 a map)."""
    if not resp:
        return []
    if isinstance(resp, dict):  # RESP3: {key: [entries]} (entries are tuples, the wrapper a list)
        return [(k, v[0] if len(v) == 1 and isinstance(v[0], list) else v) for k, v in resp.items()]
    return [(k, entries) for k, entries in resp]


async def _aclose(mux: StreamMux) -> None:
    await mux.aclose()


#: the loop's ``StreamMux`` per Redis URL
MUXES: PerLoop[StreamMux] = PerLoop(StreamMux, _aclose)


@contextlib.asynccontextmanager
async def mux_follower(url: str, key: str, after: str = "0-0") -> AsyncIterator[MuxFollower]:
    """Follow ``key`` from ``after`` through the running loop's mux for ``url``; unregistered on exit."""
    mux = await MUXES.acquire(url)
    follower = mux.follow(key, after)
    try:
        yield follower
    finally:
        mux.unfollow(follower)
        await MUXES.release(url, mux)
