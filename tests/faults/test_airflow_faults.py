"""Airflow fault rows (issue 8): two copies of a transfer trigger, a trigger killed and rebuilt, a job flushed
from under a waiting trigger, a task retry after the job vanished. Real Redis, a real agent, a real receiver.

The triggerer itself is not run here (``tests/test_airflow_scheduler.py`` runs a full Airflow, minutes of
start-up): a triggerer restart *is* the trigger's ``run()`` being cancelled and a new trigger built from
``serialize()`` — exactly what these tests do, with several copies at once as in a triggerer HA pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import types
import os
import tempfile
import threading
import time
from urllib.parse import urlparse

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
pytest.importorskip("airflow")

from airflow.sdk._shared.module_loading import import_string  # noqa: E402
from airflow.sdk.exceptions import TaskDeferred  # noqa: E402

from fstream_provider.bus.jobs import JobStore  # noqa: E402
from fstream_provider.bus.keys import Keys  # noqa: E402
from fstream_provider.operators.transfer import FStreamTransferOperator  # noqa: E402
from fstream_provider.triggers.transfer import FStreamTransferTrigger  # noqa: E402
from jobkit import (DEADLINE, agent_thread, check_destination, check_jobs, dataset, files_of, kinds,  # noqa: E402
                    poll, start_counting_receiver)
from transfer_agent.daemon.worker import Agent  # noqa: E402

import authkit  # noqa: E402

NS = "faults-airflow"


@pytest.fixture
def conn(monkeypatch, redis_url):
    """``fstream_default`` on the test Redis in namespace ``NS``, signing as the test submitter (the agents hold
    the secret: jobs name no key files)."""
    u = urlparse(redis_url)
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT",
                       f"fstream://{u.hostname}:{u.port}/0?namespace={NS}&{authkit.conn_query()}")
    return redis_url


@pytest.fixture
def store(redis_client) -> JobStore:
    return JobStore(redis_client, keys=Keys(NS))


class _TI:
    """The task-instance fields the operator reads (ids, map index, try number, XCom)."""

    def __init__(self, try_number: int = 1) -> None:
        self.dag_id, self.run_id, self.task_id, self.map_index = "faults", "manual__1", "transfer", -1
        self.try_number = try_number
        self.xcom: dict = {}

    def xcom_push(self, key, value):
        self.xcom[key] = value

    def xcom_pull(self, task_ids, key, map_indexes=None):
        return self.xcom.get(key)


def _defer(op: FStreamTransferOperator, ti: _TI) -> FStreamTransferTrigger:
    op.deferrable = True  # the default follows [operators] default_deferrable (False)
    with pytest.raises(TaskDeferred) as exc:
        op.execute({"ti": ti})
    return exc.value.trigger


def _rebuild(trigger: FStreamTransferTrigger) -> FStreamTransferTrigger:
    path, kwargs = trigger.serialize()
    return import_string(path)(**kwargs)


async def _fire(trigger: FStreamTransferTrigger) -> dict:
    async for ev in trigger.run():
        return ev.payload
    raise AssertionError("trigger ended without an event")


def test_two_trigger_copies_and_a_killed_one_one_job_one_completion(conn, store, secret, tmp_path):
    src = dataset(tmp_path / "src", small=8, big=2 << 20)
    rcv = start_counting_receiver(tmp_path / "dst", secret, hold_attempt=1, hold_after=256 << 10)
    agent = Agent(conn, policy=authkit.policy(secret), name="af-agent", keys=Keys(NS), block_ms=100, poll_interval=0.1,
                  flush_interval=0.05)
    th = agent_thread(agent)
    kw = dict(task_id="transfer", sources=[str(src)], destination=f"fstream://127.0.0.1:{rcv.port}/landed",
              tuner="fixed", cc=1, p=2, plot_dir=str(tmp_path / "plots"))
    try:
        first = _defer(FStreamTransferOperator(**kw), _TI(1))
        # the task is retried / re-run while the first deferral is still alive: same job, no second copy
        second = _defer(FStreamTransferOperator(**kw), _TI(2))
        assert second.job_id == first.job_id
        job_id = first.job_id
        assert rcv.reached.wait(DEADLINE) and store.get(job_id).state == "running"

        async def scenario() -> list[dict]:
            t_orig, t_copy, t_doomed = first, _rebuild(first), _rebuild(second)
            runs = [asyncio.ensure_future(_fire(t)) for t in (t_orig, t_copy)]
            doomed = asyncio.ensure_future(_fire(t_doomed))
            while t_doomed.last_event_id == "0-0":  # let it read the claimed/queued events first
                await asyncio.sleep(0.01)
            assert not doomed.done(), doomed.result()
            doomed.cancel()  # the triggerer is killed
            try:
                got = await doomed
            except asyncio.CancelledError:
                got = None
            assert got is None, f"the cancelled trigger swallowed its cancellation and fired {got}"
            assert not any(r.done() for r in runs)
            # the restarted triggerer rebuilds it: from the stored kwargs, and from where it had got to
            runs.append(asyncio.ensure_future(_fire(_rebuild(first))))
            runs.append(asyncio.ensure_future(_fire(_rebuild(t_doomed))))
            await asyncio.sleep(0.05)
            rcv.gate.set()
            return await asyncio.wait_for(asyncio.gather(*runs), DEADLINE)

        events = asyncio.run(scenario())
        assert [e["status"] for e in events] == ["success"] * 4, events
        assert {e["job_id"] for e in events} == {job_id} and {e["state"] for e in events} == {"succeeded"}
        assert len({e["last_event_id"] for e in events}) == 1  # every copy fired on the same done event
        # the task resumes (once per fired copy at worst): the same report, nothing re-run
        op = FStreamTransferOperator(**kw)
        reports = [op.execute_complete({"ti": _TI(2)}, e) for e in events[:2]]
        assert reports[0]["verified_files"] == len(files_of(src)) and reports[0]["failed_files"] == 0
        assert reports[0]["job_id"] == reports[1]["job_id"] == job_id
    finally:
        rcv.gate.set()
        agent.stop()
        th.join(DEADLINE)
        rcv.stop()
    assert not th.is_alive()
    assert len(store.list()) == 1 and store.client.xinfo_stream(store.keys.jobs_stream())["entries-added"] == 1
    assert kinds(store, job_id).count("claimed") == 1 and kinds(store, job_id).count("done") == 1
    assert set(rcv.commits) == {f"landed/{n}" for n in files_of(src)} and set(rcv.commits.values()) == {1}
    check_destination(src, tmp_path / "dst" / "landed", complete=True)
    check_jobs(store, [job_id])


def test_trigger_fails_clearly_when_the_job_is_flushed_from_under_it(conn, store, redis_client):
    op = FStreamTransferOperator(task_id="transfer", sources=["/data/a"], destination="fstream://127.0.0.1:9/x")
    trigger = _defer(op, _TI(1))
    trigger.block_ms = 200

    async def scenario() -> dict:
        task = asyncio.ensure_future(_fire(trigger))
        deadline = time.monotonic() + DEADLINE
        while trigger.last_event_id == "0-0" and not task.done():  # until it has read the job's first events
            assert time.monotonic() < deadline, "the trigger never read the job's events"
            await asyncio.sleep(0.01)
        assert not task.done(), task.result()  # and is waiting for more
        redis_client.flushall()
        return await asyncio.wait_for(task, 10)  # not for ever

    ev = asyncio.run(scenario())
    assert ev["status"] == "error" and trigger.job_id in ev["message"] and "vanished" in ev["message"]
    assert "reconcile" in ev["message"]


def test_task_retry_after_the_job_state_vanished_submits_a_new_job(conn, store, redis_client):
    kw = dict(task_id="transfer", sources=["/data/a"], destination="fstream://127.0.0.1:9/x")
    first = _defer(FStreamTransferOperator(**kw), _TI(1)).job_id
    redis_client.delete(store.keys.job(first))  # the state is lost; the idempotency key outlived it
    second = _defer(FStreamTransferOperator(**kw), _TI(2)).job_id
    assert second != first, "the retry re-attached to a job that no longer exists"
    assert store.get(second).idempotency_key == "faults/manual__1/transfer/-1#try2"
    assert _defer(FStreamTransferOperator(**kw), _TI(2)).job_id == second  # and re-attaches to that one


def test_poll_mode_fails_clearly_when_the_job_is_flushed(conn, store, redis_client, tmp_path):
    from airflow.sdk.exceptions import AirflowException

    op = FStreamTransferOperator(task_id="transfer", sources=["/data/a"], destination="fstream://127.0.0.1:9/x",
                                 deferrable=False, poll_interval=0.1)
    ti = _TI(1)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            op.execute({"ti": ti})
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    poll(lambda: "job_id" in ti.xcom, "the job to be submitted")
    redis_client.flushall()
    t.join(10)
    assert not t.is_alive() and errors and isinstance(errors[0], AirflowException)
    assert ti.xcom["job_id"] in str(errors[0]) and "vanished" in str(errors[0])


def test_a_cancelled_trigger_stops_even_when_the_redis_client_swallows_the_cancellation(monkeypatch):
    """redis.asyncio can swallow a CancelledError that lands while a blocking XREAD's timeout fires
    (redis/redis-py#2551); the trigger must still stop, not run on and fire after the triggerer let go of it."""

    class SwallowingHook:
        reads = 0
        stop = False

        async def get_state(self, job_id):
            return object()

        async def read_events(self, job_id, **kw):
            if SwallowingHook.stop:
                raise RuntimeError("test over: let the runaway trigger end")
            SwallowingHook.reads += 1
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:  # what the Redis client sometimes does
                return []
            return []

        async def close(self):
            pass

        async def get_settings(self):  # the trigger names the Redis in its outage lines (issue 41)
            return types.SimpleNamespace(redis_url="redis://127.0.0.1:6379/0")

        async def get_keys(self):
            from fstream_provider.bus.keys import Keys

            return Keys()

        async def get_client(self):  # how far a trigger logged (issue 41's job_followed): nothing yet
            class Client:
                async def hget(self, *args):
                    return None

                async def hset(self, *args):
                    return 1

                async def expire(self, *args):
                    return True

            return Client()

        @contextlib.asynccontextmanager
        async def event_reader(self, job_id, after="0-0"):  # the trigger reads through this (issue 28's mux)
            yield self.read_events

    trigger = FStreamTransferTrigger(job_id="j", block_ms=100)
    monkeypatch.setattr(trigger, "_hook", lambda: SwallowingHook())

    async def scenario():
        task = asyncio.ensure_future(_fire(trigger))
        while SwallowingHook.reads == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5)
        if not done:
            SwallowingHook.stop = True
            await asyncio.wait([task], timeout=5)
        assert done, "the cancelled trigger kept running"
        assert task.cancelled() or isinstance(task.exception(), asyncio.CancelledError)

    asyncio.run(scenario())
    assert SwallowingHook.reads == 1
