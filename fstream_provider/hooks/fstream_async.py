"""``FStreamAsyncHook``: native ``redis.asyncio`` access to the FStream bus, for triggers in the triggerer."""

from __future__ import annotations

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
        self._keys: Any = None

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
        """The ``redis.asyncio`` client (created on first use)."""
        if self._client is None:
            from fstream_provider.bus.client import connect_async

            self._client = connect_async((await self.get_settings()).redis_url)
        return self._client

    async def get_keys(self) -> Any:
        """The key schema of the connection's namespace."""
        if self._keys is None:
            from fstream_provider.bus.keys import Keys

            self._keys = Keys((await self.get_settings()).namespace)
        return self._keys

    async def get_state(self, job_id: str) -> Any:
        """The job's ``JobState``, or ``None`` if the job does not exist (or expired)."""
        from fstream_provider.bus.job_state import JobState

        client, keys = await self.get_client(), await self.get_keys()
        h = await client.hgetall(keys.job(job_id))
        if not h or "job_id" not in h:
            return None
        return JobState.from_hash(h)

    async def read_events(self, job_id: str, *, after: str = "0-0", block_ms: int | None = None,
                          count: int = 100) -> list[tuple[str, dict[str, Any]]]:
        """Events after ``after``; with ``block_ms`` waits up to that long for the first one."""
        from fstream_provider.bus.job_state import decode_event

        client, keys = await self.get_client(), await self.get_keys()
        resp = await client.xread({keys.job_events(job_id): after}, count=count, block=block_ms)
        return [decode_event(eid, fields) for _stream, entries in resp or [] for eid, fields in entries]

    async def request_cancel(self, job_id: str, reason: str) -> bool:
        """Ask the agent to cancel ``job_id``: the same Lua script as ``JobStore.cancel``, on the async client.

        Returns False if the job is unknown or already finished.
        """
        from fstream_provider.bus.jobs import acancel

        client, keys = await self.get_client(), await self.get_keys()
        return await acancel(client, job_id, reason, keys=keys)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
