"""``FStreamTransferTrigger``: follow a job's event stream in the triggerer until its ``done`` event."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from fstream_provider.bus.agents import NoAgentError, NoAgentWatch, alive_agents
from fstream_provider.bus.client import REDIS_UNREACHABLE, describe
from fstream_provider.bus.follow_async import afollow_job, raise_if_cancelled
from fstream_provider.bus.follow_mux import stream_id
from fstream_provider.bus.job_state import JobLostError, JobNotFoundError
from fstream_provider.bus.outage import DEFAULT_OUTAGE_S, BusOutageError, Outage
from fstream_provider.hooks.fstream import DEFAULT_CONN_ID
from fstream_provider.model.tasklog import live_event_line


FOLLOWED_TTL_S = 7 * 86400  # ``job_followed`` outlives the follow as long as a job's record does
FOLLOWED_EVERY_S = 2.0  # how often a trigger records how far it logged (a write per deferred task at most this often)


class FStreamTransferTrigger(BaseTrigger):
    """Wait for an FStream job to finish; yield one event ``{"status", "message", "job_id", ...}``.

    It reads the job's Redis event stream from ``last_event_id`` on a native ``redis.asyncio`` client,
    through the triggerer loop's one blocking ``XREAD`` for every followed job (``bus.follow_mux``: a few
    Redis connections per triggerer, not one per deferred task), logs one line per interval, and fires
    when the ``done`` event arrives. If the triggerer restarts, the trigger is rebuilt from ``serialize()``
    and re-reads from ``last_event_id``: nothing is missed, and lines a triggerer before it already logged for this
    task try (``Keys.job_followed``) are not logged again. During a Redis outage (a restart, a Sentinel or Cluster
    failover) it waits with backoff for ``redis_outage_timeout`` and follows on from the last event it handled.

    :param job_id: the job to follow.
    :param fstream_conn_id: the ``fstream`` connection.
    :param last_event_id: stream id to read after (``0-0``: from the start).
    :param target_throughput_bps: the job's target, shown in the per-interval lines.
    :param block_ms: how long a read waits for this job's events before re-checking the job hash.
    :param agent_timeout: seconds the job may stay queued with no live agent before the trigger fires an
        error (and cancels the job); None waits for ever. Counted from when this trigger (re)started.
    :param agent_hint: how to start an agent, for that error.
    :param cancel_on_kill: cancel the job when the user kills the deferred task (mark failed/success, clear).
    :param redis_outage_timeout: seconds one Redis outage may last before the trigger fires an error
        (``bus.outage``); meanwhile it waits with backoff and then follows on from the last event it handled,
        so no event is lost or repeated and the task's state is the job's outcome (None: wait for ever).
    """

    def __init__(self, *, job_id: str, fstream_conn_id: str = DEFAULT_CONN_ID, last_event_id: str = "0-0",
                 target_throughput_bps: float | None = None, block_ms: int = 5000,
                 agent_timeout: float | None = None, agent_hint: str = "", cancel_on_kill: bool = True,
                 redis_outage_timeout: float | None = DEFAULT_OUTAGE_S) -> None:
        super().__init__()
        self.redis_outage_timeout = redis_outage_timeout
        self._prev: dict[str, Any] | None = None  # the last interval record logged (for the next line's change)
        self._looked_back = False  # read how far an earlier triggerer logged this task's lines (once)
        self._logged_upto: str | None = None  # ... up to this id: not logged again
        self._persisted: str | None = None  # the last id written to ``job_followed``
        self._persisted_at = float("-inf")
        self.agent_timeout = agent_timeout
        self.agent_hint = agent_hint
        self.cancel_on_kill = cancel_on_kill
        self.job_id = job_id
        self.fstream_conn_id = fstream_conn_id
        self.last_event_id = last_event_id
        self.target_throughput_bps = target_throughput_bps
        self.block_ms = block_ms

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_id": self.job_id,
                "fstream_conn_id": self.fstream_conn_id,
                "last_event_id": self.last_event_id,
                "target_throughput_bps": self.target_throughput_bps,
                "block_ms": self.block_ms,
                "agent_timeout": self.agent_timeout,
                "agent_hint": self.agent_hint,
                "cancel_on_kill": self.cancel_on_kill,
                "redis_outage_timeout": self.redis_outage_timeout,
            },
        )

    def _hook(self) -> Any:
        from fstream_provider.hooks.fstream_async import FStreamAsyncHook

        return FStreamAsyncHook(fstream_conn_id=self.fstream_conn_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self._hook()
        outage = Outage(self.redis_outage_timeout, f"following FStream job {self.job_id}", self.log)
        watch = NoAgentWatch(self.agent_timeout, self.agent_hint)  # one clock across outages, as the operator's
        try:
            outage.where = f"Redis {describe((await hook.get_settings()).redis_url)}"
            while True:
                try:
                    event = await self._follow(hook, outage, watch)
                    break
                except REDIS_UNREACHABLE as exc:  # wait, then follow on from the last event handled
                    await asyncio.sleep(outage.failed(exc))
        except BusOutageError as exc:
            event = {"status": "error", "job_id": self.job_id, "state": None, "last_event_id": self.last_event_id,
                     "outage": True, "message": str(exc)}
        except Exception as exc:
            event = {"status": "error", "job_id": self.job_id, "state": None, "last_event_id": self.last_event_id,
                     "message": f"following FStream job {self.job_id} failed: {type(exc).__name__}: {exc}"}
        finally:
            await hook.close()
        yield TriggerEvent(event)

    def _follower(self) -> str:
        """This deferred task try, as ``job_followed`` names it (``-`` outside a triggerer, as in tests)."""
        ti = getattr(self, "task_instance", None)
        if ti is None:
            return "-"
        map_index = getattr(ti, "map_index", -1)
        return (f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{-1 if map_index is None else map_index}"
                f"#{getattr(ti, 'try_number', 0)}")

    async def _look_back(self, hook: Any) -> None:
        """Airflow rebuilds a trigger from the kwargs it deferred with, so a triggerer that takes it over (the first
        one died) starts at the old ``last_event_id``: the lines the first one logged would all come again. Each
        trigger records how far it logged (``job_followed``); the next one logs on after that."""
        client, keys = await hook.get_client(), await hook.get_keys()
        logged = await client.hget(keys.job_followed(self.job_id), self._follower())
        raise_if_cancelled()  # redis.asyncio may swallow a cancellation: never go on after one
        self._looked_back = True
        if logged and stream_id(logged) > stream_id(self.last_event_id):
            self._logged_upto = self._persisted = logged
            self.log.info("A triggerer before this one logged FStream job %s's events up to %s: following on after "
                          "them without repeating their lines (the summary at the end counts every interval)",
                          self.job_id, logged)

    async def _record_logged(self, hook: Any) -> None:
        """Write how far this trigger logged, at most every ``FOLLOWED_EVERY_S`` (HSET and EXPIRE): a
        takeover may then repeat the lines of the last few seconds, never the whole story."""
        if self.last_event_id in (self._persisted, "0-0"):
            return
        now = time.monotonic()
        if now - self._persisted_at < FOLLOWED_EVERY_S:
            return
        self._persisted_at = now
        client, keys = await hook.get_client(), await hook.get_keys()
        key = keys.job_followed(self.job_id)
        # two commands on the loop's shared client (a pipeline takes a connection of its own per trigger)
        await client.hset(key, self._follower(), self.last_event_id)
        raise_if_cancelled()
        await client.expire(key, FOLLOWED_TTL_S)
        raise_if_cancelled()
        self._persisted = self.last_event_id

    async def _follow(self, hook: Any, outage: Outage, watch: NoAgentWatch) -> dict[str, Any]:
        def on_event(eid: str, ev: dict[str, Any]) -> None:
            self.last_event_id = eid
            line = live_event_line(ev, self.target_throughput_bps, self._prev)
            if line is not None and not (self._logged_upto and stream_id(eid) <= stream_id(self._logged_upto)):
                self.log.log(*line)
            if ev.get("kind") == "interval":
                self._prev = ev

        async def on_idle(state: Any) -> None:
            if state.state == "queued":  # only then is a missing agent a reason to give up
                alive = await alive_agents(await hook.get_client(), await hook.get_keys())
                watch.check(self.job_id, state.state, len(alive))

        if not self._looked_back:
            await self._look_back(hook)
        try:
            async with hook.event_reader(self.job_id, self.last_event_id) as read_events:
                async def read(*args: Any, **kwargs: Any) -> Any:
                    await self._record_logged(hook)  # the batch before was logged: say so (every few seconds)
                    batch = await read_events(*args, **kwargs)
                    outage.recovered()  # the follow reads again: an outage in progress is over
                    return batch

                eid, done = await afollow_job(hook.get_state, read, self.job_id, on_event=on_event,
                                              after=self.last_event_id, block_ms=self.block_ms, on_idle=on_idle)
        except NoAgentError as exc:
            await outage.acall(lambda: hook.request_cancel(self.job_id, str(exc)))
            return {"status": "error", "job_id": self.job_id, "state": "cancelled",
                    "last_event_id": self.last_event_id, "message": str(exc)}
        except JobNotFoundError:
            if outage.outages:  # it was there before the outage: Redis came back without it
                return self._lost()
            return {"status": "error", "job_id": self.job_id, "state": None, "last_event_id": self.last_event_id,
                    "message": f"FStream job {self.job_id} does not exist on the bus (expired or wrong connection)"}
        except JobLostError:
            return self._lost()
        state = done.get("state")
        ok = state == "succeeded"
        msg = (f"FStream job {self.job_id} {state}" if ok
               else f"FStream job {self.job_id} {state}: {done.get('error') or 'no error text'}")
        return {"status": "success" if ok else "error", "message": msg, "job_id": self.job_id,
                "state": state, "last_event_id": eid}

    def _lost(self) -> dict[str, Any]:
        return {"status": "error", "job_id": self.job_id, "state": None, "last_event_id": self.last_event_id,
                "message": f"FStream job {self.job_id} disappeared from the bus while running: its "
                           "state vanished from Redis (flushed, or restarted without its data); "
                           "`fstream reconcile` reports what is left, a task retry resubmits it"}

    async def on_kill(self) -> None:
        """The user killed the deferred task (mark failed/success, clear): cancel the job too (unless
        ``cancel_on_kill`` is False). Airflow calls this from 3.3.0 on (``BaseTrigger.on_kill``)."""
        if not self.cancel_on_kill:
            self.log.info("task killed; FStream job %s keeps running (cancel_on_kill=False)", self.job_id)
            return
        hook = self._hook()
        try:
            await hook.request_cancel(self.job_id, "Airflow task was killed by a user action while deferred")
        finally:
            await hook.close()
