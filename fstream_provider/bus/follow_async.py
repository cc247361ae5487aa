"""Following one job's event stream on ``redis.asyncio`` (triggers): the same rules as ``follow_job``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fstream_provider.bus.follow import JobFollow, OnEvent


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


async def afollow_job(get_state: Callable[[str], Awaitable[Any]],
                      read_events: Callable[..., Awaitable[list[tuple[str, dict]]]], job_id: str, *,
                      on_event: OnEvent | None = None, after: str = "0-0", block_ms: int = 5000,
                      count: int = 500, on_idle: Callable[[Any], Awaitable[None]] | None = None
                      ) -> tuple[str, dict]:
    """Follow a job's events until it ends; returns ``(entry_id, done_event)``.

    Same rules as ``fstream_provider.bus.follow.follow_job`` (``JobFollow``): raises ``JobNotFoundError``
    if the job does not exist, ``JobLostError`` if its state vanishes; after every Redis call a
    swallowed cancellation is re-raised (``raise_if_cancelled``).

    :param get_state: ``await get_state(job_id)``: the ``JobState`` or None (``FStreamAsyncHook.get_state``).
    :param read_events: ``await read_events(job_id, after=, block_ms=, count=)`` (``FStreamAsyncHook.read_events``).
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
            return f.after, f.done
        if not batch:
            state = await get_state(job_id)
            raise_if_cancelled()
            if f.after_empty_read(state):
                return f.after, f.done_event()
            if on_idle is not None:
                await on_idle(state)
