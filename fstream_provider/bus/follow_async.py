"""Following one job's event stream on ``redis.asyncio`` (triggers): the same rules as ``follow_job``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fstream_provider.bus.aio_shared import raise_if_cancelled
from fstream_provider.bus.follow import JobFollow, OnEvent
from fstream_provider.bus.follow_mux import mux_follower
from fstream_provider.bus.job_state import decode_event

__all__ = ["afollow_job", "job_event_reader", "follow_mux_enabled", "raise_if_cancelled", "ReadEvents"]

ReadEvents = Callable[..., Awaitable[list[tuple[str, dict]]]]

#: ``FSTREAM_FOLLOW_MUX=0`` puts the triggers back on the path before issue 28 (a client of their own, one
#: ``XREAD BLOCK`` each): for ``bench/airflow/triggerer.py``'s comparison only, not a setting to run with
FOLLOW_MUX_ENV = "FSTREAM_FOLLOW_MUX"


def follow_mux_enabled() -> bool:
    """True unless ``FSTREAM_FOLLOW_MUX`` is ``0``/``false``/``no``/``off`` (read at each call, never at import)."""
    return os.environ.get(FOLLOW_MUX_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@contextlib.asynccontextmanager
async def job_event_reader(url: str, key: str, after: str = "0-0") -> AsyncIterator[ReadEvents]:
    """A ``read_events`` for ``afollow_job`` that reads ``key`` through the running loop's shared mux for ``url``
    (``bus.follow_mux``: one ``XREAD BLOCK`` for every stream followed on the loop); unregistered on exit.

    It answers as ``FStreamAsyncHook.read_events`` does: ``await read_events(job_id, after=, block_ms=, count=)``
    gives the decoded events after ``after``, waiting up to ``block_ms`` for the first (none: one look).
    """
    async with mux_follower(url, key, after) as follower:
        async def read_events(_job_id: str = "", *, after: str = "0-0", block_ms: int | None = None,
                              count: int = 100) -> list[tuple[str, dict]]:
            entries = await follower.read(after=after, block_ms=block_ms, count=count)
            return [decode_event(eid, fields) for eid, fields in entries]

        yield read_events


async def afollow_job(get_state: Callable[[str], Awaitable[Any]], read_events: ReadEvents, job_id: str, *,
                      on_event: OnEvent | None = None, after: str = "0-0", block_ms: int = 5000,
                      count: int = 500, on_idle: Callable[[Any], Awaitable[None]] | None = None
                      ) -> tuple[str, dict]:
    """Follow a job's events until it ends; returns ``(entry_id, done_event)``.

    Same rules as ``fstream_provider.bus.follow.follow_job`` (``JobFollow``): raises ``JobNotFoundError``
    if the job does not exist, ``JobLostError`` if its state vanishes; after every Redis call a
    swallowed cancellation is re-raised (``raise_if_cancelled``).

    :param get_state: ``await get_state(job_id)``: the ``JobState`` or None (``FStreamAsyncHook.get_state``).
    :param read_events: ``await read_events(job_id, after=, block_ms=, count=)``: ``FStreamAsyncHook.event_reader``
        gives one that reads through the loop's shared mux (``job_event_reader``).
    :param on_event: called as ``on_event(entry_id, event)`` for every event after ``after``.
    :param on_idle: awaited with the fresh state after every read that brought nothing (may raise).
    """
    f = JobFollow(job_id, after)
    state = await get_state(job_id)
    raise_if_cancelled()
    f.found(state)
    while True:
        batch = await read_events(job_id, after=f.after, block_ms=f.block_ms(block_ms), count=count)
        raise_if_cancelled()
        batch = f.advance(batch)
        if on_event is not None:
            for eid, ev in batch:
                on_event(eid, ev)
        if f.done is not None:
            state = f.still_there(await get_state(job_id))
            raise_if_cancelled()
            if f.settled(state):
                return f.after, f.done_event()
            continue
        if not batch:
            state = await get_state(job_id)
            raise_if_cancelled()
            if f.after_empty_read(state):
                return f.after, f.done_event()
            if on_idle is not None:
                await on_idle(state)
