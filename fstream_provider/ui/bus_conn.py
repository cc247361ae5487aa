"""Which Redis bus a live view reads (issue 27): an existing ``fstream`` connection, never a URL from the request.

The overview reads ``fstream_default`` (the operator's default) unless ``?conn_id=`` names another
connection; a job view reads the connection its task recorded (XCom ``fstream_conn_id``). Either way the
id must name a connection Airflow knows, of type ``fstream``: anything else is a 404/400 naming it, so a
request cannot point the api-server at a host of its choosing. Blocking clients are kept per Redis URL
(thread-safe pools, used from worker threads); streams open their own ``redis.asyncio`` client.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException

from fstream_provider.bus.keys import Keys
from fstream_provider.hooks.fstream import DEFAULT_CONN_ID

__all__ = ["DEFAULT_CONN_ID", "Bus", "resolve", "client", "store", "async_client"]

_lock = threading.Lock()
_clients: dict[str, Any] = {}
MAX_CLIENTS = 16


@dataclass(frozen=True)
class Bus:
    """One ``fstream`` connection as a view uses it (the URL never leaves the server)."""

    conn_id: str
    redis_url: str
    namespace: str
    submitter: str | None = None  # the connection's submitter: its not yet claimed jobs are listed too (issue 40)

    @property
    def keys(self) -> Keys:
        return Keys(self.namespace)


def resolve(conn_id: str | None) -> Bus:
    """The bus of ``conn_id`` (default ``fstream_default``); ``HTTPException`` 404 (unknown) or 400 (not fstream).

    Blocking (it reads Airflow's secrets backends and database): call it from a worker thread.
    """
    from airflow.models.connection import Connection

    from fstream_provider.hooks.fstream import settings_from_connection

    conn_id = conn_id or DEFAULT_CONN_ID
    try:
        conn = Connection.get_connection_from_secrets(conn_id)
    except Exception as exc:  # AirflowNotFoundException (task SDK's or core's): said, not a 500
        if type(exc).__name__ == "AirflowNotFoundException":
            raise HTTPException(status_code=404, detail=f"no Airflow connection {conn_id!r}") from None
        raise HTTPException(status_code=400, detail=f"Airflow connection {conn_id!r}: {exc}") from None
    if (conn.conn_type or "") != "fstream":
        raise HTTPException(status_code=400, detail=f"Airflow connection {conn_id!r} is of type "
                                                    f"{conn.conn_type!r}, not 'fstream'")
    try:
        settings = settings_from_connection(conn)
    except ValueError as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    return Bus(conn_id, settings.redis_url, settings.namespace, settings.submitter)


def client(bus: Bus) -> Any:
    """A blocking ``redis.Redis`` for the bus, shared by the process (one pool per URL)."""
    with _lock:
        c = _clients.get(bus.redis_url)
        if c is None:
            from fstream_provider.bus.client import connect

            if len(_clients) >= MAX_CLIENTS:  # connections edited many times: drop the oldest pool
                _clients.pop(next(iter(_clients))).close()
            c = _clients[bus.redis_url] = connect(bus.redis_url)
        return c


def store(bus: Bus) -> Any:
    """A ``JobStore`` on the bus's shared client (reads only, here)."""
    from fstream_provider.bus.jobs import JobStore

    return JobStore(client(bus), keys=bus.keys)


def async_client(bus: Bus) -> Any:
    """A new ``redis.asyncio`` client with the hooks' options (``bus.client.connect_async``); the caller closes it."""
    from fstream_provider.bus.client import connect_async

    return connect_async(bus.redis_url)
