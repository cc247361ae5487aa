"""The overview, read once per bus for every open overview page (issue 27).

``bus.live.overview`` reads every job's state and the running jobs' newest events: a handful of
pipelined round trips, too many to repeat per open page and per event. One ``OverviewFeed`` per bus (per
event loop) reads it every ``POLL_S`` while at least one page listens, in a worker thread (the client is
blocking), and bumps its ``version`` when something a page shows changed (ages aside), or every
``REFRESH_S`` so heartbeat ages stay honest. Each page's stream waits for a new version and filters the
shared snapshot for its user (``access.visible_overview``).

While reads fail (Redis down) the feed keeps the last overview it read (its ``generated_at`` says when), and
``error``/``error_since`` say why and since when (server clock), so a page can mark what it shows as stale; the
next good read clears both (issue 41).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from fstream_provider.bus.client import REDIS_UNREACHABLE
from fstream_provider.bus.live import SparkTrail, overview
from fstream_provider.ui import bus_conn

POLL_S = 0.5
REFRESH_S = 5.0
_AGES = ("heartbeat_age_s", "age_s")


def _signature(ov: dict) -> str:
    """What a page shows, minus the clock: two reads whose only difference is time passing are equal."""
    def strip(rows: list) -> list:
        return [{k: v for k, v in r.items() if k not in _AGES} for r in rows or []]

    return json.dumps({**ov, "generated_at": None, "agents": strip(ov.get("agents")), "jobs": strip(ov.get("jobs"))},
                      sort_keys=True, default=str)


class OverviewFeed:
    """The latest overview of one bus (``data``; ``error`` and ``error_since`` while Redis cannot be read) and its
    version."""

    def __init__(self, bus: bus_conn.Bus, reader: Any = None) -> None:
        self.bus = bus
        self.version = 0
        self.data: dict | None = None
        self.error: str | None = None
        self.error_since: float | None = None  # UNIX time of the first failed read of the current outage
        self.reads = 0  # how many overviews were read (tests and the log)
        trail = SparkTrail()  # sparklines read incrementally between polls (the plugin's main cost otherwise)
        self._reader = reader or (lambda: overview(bus_conn.client(bus), bus.keys, trail=trail,
                                                       owner=bus.submitter))
        self._changed = asyncio.Event()
        self._subscribers = 0
        self._task: asyncio.Task | None = None
        self._signature: str | None = None
        self._pushed = 0.0

    def subscribe(self) -> None:
        self._subscribers += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"fstream-overview-{self.bus.conn_id}")

    def unsubscribe(self) -> None:
        self._subscribers = max(0, self._subscribers - 1)

    async def wait(self, after: int, timeout: float) -> int:
        """The version once it is past ``after``, or ``after`` when ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        while self.version <= after:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._changed.clear()
            if self.version > after:
                break
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                break
        return self.version

    async def _run(self) -> None:
        while self._subscribers > 0:
            try:
                ov, err = await asyncio.to_thread(self._reader), None
                sig = _signature(ov)
            except Exception as exc:  # Redis down, a bad connection: shown on the page, read again next time
                what = "Redis unreachable" if isinstance(exc, REDIS_UNREACHABLE) else "reading the bus failed"
                ov, err = None, f"{what}: {type(exc).__name__}: {exc}"
                sig = "error:" + err
                if self.error_since is None:
                    self.error_since = time.time()
            self.reads += 1
            now = time.monotonic()
            if sig != self._signature or now - self._pushed >= REFRESH_S:
                self._signature, self._pushed = sig, now
                self.data, self.error = (ov, None) if err is None else (self.data, err)
                if err is None:
                    self.error_since = None
                self.version += 1
                self._changed.set()
            await asyncio.sleep(POLL_S)


_feeds: dict[tuple[int, str, str], OverviewFeed] = {}


def feed_for(bus: bus_conn.Bus) -> OverviewFeed:
    """The feed of ``bus`` on the running event loop (one per Redis URL and namespace)."""
    loop = asyncio.get_running_loop()
    key = (id(loop), bus.redis_url, bus.namespace)
    feed = _feeds.get(key)
    if feed is None:
        for k in [k for k in _feeds if k[0] != id(loop)]:  # feeds of a loop that is gone (tests' clients)
            del _feeds[k]
        feed = _feeds[key] = OverviewFeed(bus)
    return feed
