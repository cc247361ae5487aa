"""The jobs waiting for an agent, read from Redis at scrape time with a timeout and cached (issue 30, "Prometheus
metrics": the agent's queue depth).

One ``XINFO GROUPS`` of the jobs stream per read: the ``agents`` group's ``lag`` (entries not yet delivered to any
agent) and ``pending`` (delivered, not yet acknowledged). Redis reports no lag once entries were deleted from
the stream (``trim_acked``): then the undelivered entries are counted with one ``XRANGE`` after the group's last
delivered id, up to ``COUNT_CAP``. Reads go through their own client (short timeouts, no retries), at most one
per ``max_age`` seconds; a failed read keeps the last value and is counted.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger("fstream.service")

COUNT_CAP = 10_000  # undelivered entries counted one by one at most (when Redis has no lag to report)


class QueueDepth:
    """Cached ``(waiting, pending)`` of the jobs stream's consumer group.

    :param redis_url: the bus (the agent's ``--redis``).
    :param keys: the key schema (``fstream_provider.bus.keys.Keys``).
    :param timeout: seconds a read may take (connect and reply).
    :param max_age: a cached value younger than this is served without asking Redis.
    :param client: a client to use instead of one made from ``redis_url`` (tests).
    """

    def __init__(self, redis_url: str, keys: Any, *, timeout: float = 0.5, max_age: float = 1.0,
                 client: Any = None) -> None:
        self.redis_url, self.keys = redis_url, keys
        self.timeout, self.max_age = timeout, max_age
        self._client = client
        self._lock = threading.Lock()
        self._value: tuple[int, int] | None = None
        self._read_at = -float("inf")
        self.errors = 0
        self.last_error = ""

    def read(self) -> tuple[int, int] | None:
        """``(waiting, pending)``, fresh or cached; None while Redis has never answered."""
        with self._lock:  # one scrape at a time asks Redis; the others get what it found
            if time.monotonic() - self._read_at < self.max_age:
                return self._value
            try:
                self._value = self._ask()
            except Exception as exc:  # noqa: BLE001 - a scrape must answer whatever Redis does
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.debug("queue depth: Redis read failed (%s); keeping the last value", self.last_error)
            self._read_at = time.monotonic()
            return self._value

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def _ask(self) -> tuple[int, int] | None:
        if self._client is None:
            from fstream_provider.bus.client import connect

            self._client = connect(self.redis_url, socket_timeout=self.timeout, connect_timeout=self.timeout,
                                   retries=0)
        stream, group = self.keys.jobs_stream(), self.keys.jobs_group()
        import redis

        try:
            groups = self._client.xinfo_groups(stream)
        except redis.ResponseError:  # no stream yet: nothing was ever submitted
            return 0, 0
        mine = next((g for g in groups if g.get("name") == group), None)
        if mine is None:
            return None
        lag = mine.get("lag")
        if lag is None:
            last = mine.get("last-delivered-id") or "0-0"
            lag = len(self._client.xrange(stream, min=f"({last}", max="+", count=COUNT_CAP))
        return int(lag), int(mine.get("pending") or 0)
