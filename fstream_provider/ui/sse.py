"""Server-sent events for the live views (issue 27): pushed, not polled.

- ``job_stream``: one job, fed by its Redis event stream. A ``hello`` (the job id: a page that held another
  job, the task's previous try, starts over), a ``snapshot`` (``bus.live.job_detail``: the row, intervals,
  tuning, files, and the newest claims, retries and errors), then every event as it is appended
  (``XREAD BLOCK`` on a ``redis.asyncio`` client, never a blocking call in the event loop), each as an
  ``event`` whose SSE ``id`` is its Redis stream id, followed by the job's fresh ``row`` (state, attempt,
  ETA, lag, deadline from the job hash). A browser that reconnects sends ``Last-Event-ID``: the stream then says ``resume``
  and continues after that id, so nothing is missed or repeated; a reload starts again from a snapshot.
  A new attempt (an agent restarted) is just more events on the same stream. An interval shorter than a tenth
  of the one before (the sliver that ends a transfer) comes as ``fold``: the two as one interval
  (``model.intervals``), which replaces the page's last one, so the chart shows no dip the log does not.
  After the ``done`` event (or when the job turns out finished or gone) the stream says ``end`` and closes.
  While Redis cannot be read the stream stays open and says ``problem`` (``message``, and ``since``: when it
  last read Redis, UNIX seconds, None before its first read) every ``block_ms``; the first read that succeeds
  after that (or the first of a resumed stream) says ``ok`` (``at``), so the page can mark its numbers stale
  and clear it.
- ``overview_stream``: the overview (``overview_feed``), filtered for the user, whenever it changed, with
  ``sent_at`` (the server's clock, so a page can age what it shows); while Redis cannot be read, a ``problem``
  (``message`` and ``since``) before the last overview read, which a page marks stale until a newer one comes.

Both send keep-alive comments, stop when the client is gone (``request.is_disconnected``) or the api-server is
asked to stop (``shutdown.STOPPING``: the browser reconnects to the next one and resumes), and hold one
of ``MAX_STREAMS`` slots per process while open (``SLOTS``; the routes answer 503 when none is free).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from fastapi.responses import StreamingResponse

from fstream_provider.bus.client import REDIS_UNREACHABLE
from fstream_provider.bus.job_state import TERMINAL_STATES, JobState, decode_event
from fstream_provider.bus.jobs import RESULT_TOTALS
from fstream_provider.bus.live import job_detail, job_row
from fstream_provider.model.intervals import LiveFold
from fstream_provider.ui import bus_conn, shutdown
from fstream_provider.ui.access import visible_overview
from fstream_provider.ui.overview_feed import OverviewFeed

MAX_STREAMS = 64
KEEPALIVE_S = 15.0
BLOCK_MS = 2000  # an XREAD waits this long, then the stream checks the client and the job
RETRY_MS = 3000  # what the browser waits before reconnecting (the SSE ``retry`` field)
DAG_IDS_REFRESH_S = 30.0
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(event: str | None = None, data: Any = None, *, id: str | None = None, retry: int | None = None) -> str:
    """One SSE message (JSON data on one line)."""
    out = []
    if retry is not None:
        out.append(f"retry: {int(retry)}")
    if id is not None:
        out.append(f"id: {id}")
    if event is not None:
        out.append(f"event: {event}")
    out.append("data: " + json.dumps(data, default=str, separators=(",", ":")))
    return "\n".join(out) + "\n\n"


KEEPALIVE = ": keep-alive\n\n"


class Slots:
    """A bound on the streams open in this process (one event loop: no lock needed)."""

    def __init__(self, size: int = MAX_STREAMS) -> None:
        self.size, self.open = size, 0

    def take(self) -> bool:
        if self.open >= self.size:
            return False
        self.open += 1
        return True

    def give(self) -> None:
        self.open = max(0, self.open - 1)


SLOTS = Slots()


def response(stream: AsyncIterator[str], slots: Slots = SLOTS) -> StreamingResponse:
    """A ``text/event-stream`` response of ``stream`` holding one slot (taken by the caller) until it ends."""
    async def body() -> AsyncIterator[str]:
        shutdown.install()  # on the server's loop (its main thread), after the server installed its handlers
        try:
            async for chunk in stream:
                yield chunk
        finally:
            slots.give()
            with anyio.CancelScope(shield=True):
                await stream.aclose()  # type: ignore[attr-defined]

    return StreamingResponse(body(), media_type="text/event-stream", headers=HEADERS)


# what the job view lists as the job's story (claims, restarts, retries, errors, the end), besides its numbers
NOTABLE = ("queued", "claimed", "released", "requeued", "scheduled", "preempted", "retry", "error", "log", "cancel",
           "done")
RECENT = 50


def _snapshot(store: Any, job_id: str) -> dict | None:
    """``job_detail`` with its newest ``RECENT`` notable events, from its one pass over the job's events
    (blocking: run in a thread)."""
    detail = job_detail(store, job_id, story=NOTABLE, recent=RECENT)
    if detail is not None:
        detail["recent_events"] = [_slim(ev, eid) for eid, ev in detail["recent_events"]]
    return detail


def _slim(ev: dict, eid: str) -> dict:
    """An event as the page gets it: a ``done`` event's ``result`` (every interval again) cut to its totals."""
    out = {**ev, "id": eid}
    result = out.pop("result", None)
    if isinstance(result, dict):
        out["result"] = {k: result.get(k) for k in RESULT_TOTALS if k in result}
    return out


def _event_frame(live: LiveFold, eid: str, ev: dict) -> str:
    """An ``event`` message; for an interval that is a sliver of the one before (``model.intervals``), a ``fold``
    message instead: that interval and the sliver as one, which replaces the page's last interval (issue 41)."""
    if ev.get("kind") == "interval":
        folded = live.add(ev)
        if folded is not None:
            return frame("fold", _slim(folded, eid), id=eid)
    return frame("event", _slim(ev, eid), id=eid)


async def _last_interval(aclient: Any, keys: Any, job_id: str, upto: str) -> dict | None:
    """The job's newest interval event up to ``upto`` (a resumed stream folds a sliver into it), or None."""
    try:
        entries = await aclient.xrevrange(keys.job_events(job_id), max=upto, count=RECENT * 4)
    except REDIS_UNREACHABLE:
        return None
    return next((decode_event(eid, f)[1] for eid, f in entries if f.get("kind") == "interval"), None)




async def _row(aclient: Any, keys: Any, job_id: str) -> dict | None:
    h = await aclient.hgetall(keys.job(job_id))
    if not h or "job_id" not in h or "spec" not in h:
        return None
    row = job_row(JobState.from_hash(h))
    row.pop("spark", None)  # the page draws its own from the events
    return row


async def job_stream(request: Any, bus: bus_conn.Bus, job_id: str, last_event_id: str | None = None,
                     *, block_ms: int = BLOCK_MS) -> AsyncIterator[str]:
    """The SSE messages of one job (see the module docstring)."""
    keys = bus.keys
    aclient = bus_conn.async_client(bus)
    live = LiveFold()  # the last interval the page has, into which a sliver is folded
    read_at: float | None = None  # when Redis was last read (a ``problem`` says since when it is not)
    healthy = False  # the page was told the reads succeed (a snapshot, or an ``ok``)

    def problem(exc: BaseException) -> str:
        return frame("problem", {"message": f"Redis unreachable: {exc}", "since": read_at})

    try:
        yield frame("hello", {"job_id": job_id}, retry=RETRY_MS)
        if last_event_id:
            after = last_event_id
            yield frame("resume", {"job_id": job_id, "after": after})
            live.last = await _last_interval(aclient, keys, job_id, after)
        else:
            try:
                detail = await asyncio.to_thread(_snapshot, bus_conn.store(bus), job_id)
            except REDIS_UNREACHABLE as exc:  # the browser reconnects after ``retry`` and tries again
                yield problem(exc)
                return
            read_at, healthy = time.time(), True
            if detail is None:
                yield frame("end", {"job_id": job_id, "state": None, "message": f"FStream job {job_id} is not on "
                                    "the bus (expired or removed)"})
                return
            after = detail["events_last_id"]
            live.last = (detail.get("intervals") or [None])[-1]
            yield frame("snapshot", detail, id=after)
            if detail.get("done"):
                yield frame("end", {"job_id": job_id, "state": detail.get("done")})
                return
        beat = time.monotonic()
        while not shutdown.STOPPING.is_set() and not await request.is_disconnected():
            try:
                resp = await aclient.xread({keys.job_events(job_id): after}, count=500, block=block_ms)
                entries = [decode_event(eid, fields) for _s, es in resp or [] for eid, fields in es]
                done = any(ev.get("kind") == "done" for _eid, ev in entries)
                row = await _row(aclient, keys, job_id) if entries else None
                state = None if entries else await aclient.hget(keys.job(job_id), "state")
                if not entries and (state is None or state in TERMINAL_STATES):
                    row = await _row(aclient, keys, job_id) if state else None
            except REDIS_UNREACHABLE as exc:
                healthy = False
                yield problem(exc)
                await asyncio.sleep(block_ms / 1000)
                continue
            read_at = time.time()
            out = []
            if not healthy:
                out.append(frame("ok", {"at": read_at}))
                healthy = True
            if entries:
                for eid, ev in entries:
                    out.append(_event_frame(live, eid, ev))
                    after = eid
                if row is not None:
                    out.append(frame("row", row))
                if done:
                    out.append(frame("end", {"job_id": job_id, "state": row and row.get("state")}))
                yield "".join(out)
                beat = time.monotonic()
                if done:
                    return
                continue
            if state is None or state in TERMINAL_STATES:  # gone, or finished before ``after`` (a late resume)
                if row is not None:
                    out.append(frame("row", row))
                gone = None if state else f"FStream job {job_id} is no longer on the bus"
                out.append(frame("end", {"job_id": job_id, "state": state, "message": gone}))
                yield "".join(out)
                return
            if out:
                yield "".join(out)
                beat = time.monotonic()
            elif time.monotonic() - beat >= KEEPALIVE_S:
                yield KEEPALIVE
                beat = time.monotonic()
    finally:
        with anyio.CancelScope(shield=True):
            await aclient.aclose()


async def overview_stream(request: Any, feed: OverviewFeed, dag_ids: Callable[[], set[str]],
                          *, check_s: float = 1.0) -> AsyncIterator[str]:
    """The overview whenever it changed, as the user may see it (``dag_ids``: blocking, read now and then)."""
    feed.subscribe()
    try:
        yield frame("hello", {"conn_id": feed.bus.conn_id}, retry=RETRY_MS)
        readable = await asyncio.to_thread(dag_ids)
        read_at = beat = time.monotonic()
        version = 0
        while not shutdown.STOPPING.is_set() and not await request.is_disconnected():
            new = await feed.wait(version, check_s)
            now = time.monotonic()
            if new == version:
                if now - beat >= KEEPALIVE_S:
                    yield KEEPALIVE
                    beat = now
                continue
            version = new
            if now - read_at >= DAG_IDS_REFRESH_S:
                readable, read_at = await asyncio.to_thread(dag_ids), now
            if feed.error is not None:
                yield frame("problem", {"message": feed.error, "since": feed.error_since})
            if feed.data is not None:
                yield frame("overview", {**visible_overview(feed.data, readable), "sent_at": time.time()})
            beat = now
    finally:
        feed.unsubscribe()
