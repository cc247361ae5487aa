"""``FStreamAsyncHook``: native ``redis.asyncio`` access to the FStream bus, for triggers in the triggerer."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from fstream_provider.hooks.fstream import (
    DEFAULT_CONN_ID,
    FStreamSettings,
    missing_connection,
    settings_from_connection,
)


class FStreamAsyncHook(BaseHook):
    """Read job state and follow job events without blocking the triggerer's event loop.

    Every hook on one event loop uses the same client for the same Redis (``bus.aio_shared.CLIENTS``: at most
    two connections, however many triggers run), and follows events through the loop's one reader
    (``event_reader``, ``bus.follow_mux``); ``close`` gives the client back. ``FSTREAM_FOLLOW_MUX=0`` restores the
    path before (a client per hook, an ``XREAD BLOCK`` per follow) for a benchmark's comparison only.

    :param fstream_conn_id: the ``fstream`` connection (one that does not exist is an ``AirflowNotFoundException``).
    """

    conn_name_attr = "fstream_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = "fstream"
    hook_name = "FStream (async)"

    def __init__(self, *, fstream_conn_id: str = DEFAULT_CONN_ID) -> None:
        super().__init__()
        self.fstream_conn_id = fstream_conn_id
        self._settings: FStreamSettings | None = None
        self._client: Any = None
        self._shared_url: str | None = None  # set while ``_client`` is the loop's shared client for that URL
        self._keys: Any = None
        self._trust: Any = None

    async def get_settings(self) -> FStreamSettings:
        if self._settings is None:
            try:
                conn = await self.aget_connection(self.fstream_conn_id)
            except AirflowNotFoundException:
                raise missing_connection(self.fstream_conn_id) from None
            else:
                self._settings = settings_from_connection(conn)
        return self._settings

    async def get_client(self) -> Any:
        """The ``redis.asyncio`` client: the running loop's shared one for the connection's Redis (got on first use)."""
        if self._client is None:
            from fstream_provider.bus.follow_async import follow_mux_enabled

            url = (await self.get_settings()).redis_url
            if follow_mux_enabled():
                from fstream_provider.bus.aio_shared import CLIENTS

                client = await CLIENTS.acquire(url)
                if self._client is not None:  # another call of this hook got one meanwhile
                    await CLIENTS.release(url, client)
                else:
                    self._client, self._shared_url = client, url
            else:
                from fstream_provider.bus.client import connect_async

                self._client = connect_async(url)
        return self._client

    async def get_keys(self) -> Any:
        """The key schema of the connection's namespace."""
        if self._keys is None:
            from fstream_provider.bus.keys import Keys

            self._keys = Keys((await self.get_settings()).namespace)
        return self._keys

    async def get_state(self, job_id: str) -> Any:
        """The job's ``JobState`` as the connection's trusted agents vouch for it (``authz.outcome.trusted_view``:
        a success none of them signed is ``unverified``), or ``None`` if the job does not exist (or expired)."""
        from fstream_provider.bus.job_state import JobState
        from fstream_provider.authz.outcome import trusted_view

        client, keys = await self.get_client(), await self.get_keys()
        h = await client.hgetall(keys.job(job_id))
        if not h or "job_id" not in h:
            return None
        if self._trust is None:
            self._trust = (await self.get_settings()).trust()
        return trusted_view(JobState.from_hash(h), keys.namespace, self._trust)

    async def read_events(self, job_id: str, *, after: str = "0-0", block_ms: int | None = None,
                          count: int = 100) -> list[tuple[str, dict[str, Any]]]:
        """Events after ``after``; with ``block_ms`` waits up to that long for the first one."""
        from fstream_provider.bus.job_state import decode_event

        client, keys = await self.get_client(), await self.get_keys()
        resp = await client.xread({keys.job_events(job_id): after}, count=count, block=block_ms)
        return [decode_event(eid, fields) for _stream, entries in resp or [] for eid, fields in entries]

    @contextlib.asynccontextmanager
    async def event_reader(self, job_id: str, after: str = "0-0") -> AsyncIterator[Any]:
        """A ``read_events`` for ``bus.follow_async.afollow_job`` following ``job_id``'s events from ``after``: through
        the loop's shared reader (``job_event_reader``), or ``read_events`` under ``FSTREAM_FOLLOW_MUX=0``."""
        from fstream_provider.bus.follow_async import follow_mux_enabled, job_event_reader

        if not follow_mux_enabled():
            yield self.read_events
            return
        url, keys = (await self.get_settings()).redis_url, await self.get_keys()
        async with job_event_reader(url, keys.job_events(job_id), after) as read_events:
            yield read_events

    async def request_cancel(self, job_id: str, reason: str) -> bool:
        """Ask the agent to cancel ``job_id``: the same Lua script as ``JobStore.cancel``, on the async client.

        Returns False if the job is unknown or already finished.
        """
        from fstream_provider.bus.jobs import acancel

        client, keys = await self.get_client(), await self.get_keys()
        return await acancel(client, job_id, reason, keys=keys)

    async def close(self) -> None:
        """Give the shared client back (closed with its last user), or close this hook's own."""
        client, self._client = self._client, None
        url, self._shared_url = self._shared_url, None
        if client is None:
            return
        if url is not None:
            from fstream_provider.bus.aio_shared import CLIENTS

            await CLIENTS.release(url, client)
        else:
            await client.aclose()
