"""The Airflow side rides out a Redis outage (issue 41): a restart does not fail a task whose transfer succeeds.

Before: the trigger fired ``status: error ... ConnectionError`` about 2 s into an outage (the client's own retries),
``execute_complete`` raised a raw ``ConnectionError``, and the polling operator and the sensor failed the same way,
while the agent rode the outage out and the job succeeded. Now each waits with backoff for ``redis_outage_timeout``
(``bus.outage``) and goes on from the last event it handled.

A real ``redis-server`` with its AOF is stopped and started again on the same port; the agent's side is played
through ``JobStore`` exactly as the agent's runner writes it (claim, publish, finish), so every event the task must
see is known. The fault tests on the whole of Airflow (scheduler, triggerer, a real agent) are in
tests/test_airflow_under_faults.py.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import threading
import time
from urllib.parse import urlencode

import pytest

pytest.importorskip("airflow")

from airflow.sdk.exceptions import AirflowException, TaskDeferred  # noqa: E402

from fstream_provider.bus.client import connect  # noqa: E402
from fstream_provider.bus.embedded import RedisServer  # noqa: E402
from fstream_provider.bus.jobs import JobStore  # noqa: E402
from fstream_provider.bus.keys import Keys  # noqa: E402
from fstream_provider.bus.outage import BusOutageError, Outage  # noqa: E402
from fstream_provider.operators.transfer import FStreamTransferOperator  # noqa: E402
from fstream_provider.sensors.new_files import FStreamNewFilesSensor  # noqa: E402
from fstream_provider.triggers.transfer import FStreamTransferTrigger  # noqa: E402

import authkit  # noqa: E402
from test_airflow_operator_correctness import DEST, _TI  # noqa: E402
from test_bus_role_change import blocked_reader  # noqa: E402

DOWN_S = 6.0  # longer than redis-py's own retries (5, jittered: 0.1 to ~3 s in all): only a ride-out survives it


# -- the outage clock ---------------------------------------------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_an_outage_waits_with_capped_backoff_logs_its_start_and_end_once_and_fails_past_its_budget(caplog):
    import redis

    clock, log = _Clock(), logging.getLogger("outage-test")
    outage = Outage(30.0, "following FStream job j1", log, where="Redis 127.0.0.1:1", clock=clock)
    caplog.set_level(logging.INFO, logger="outage-test")
    waits = []
    for _ in range(8):
        waits.append(outage.failed(redis.ConnectionError("Connection refused")))
        clock.t += 1.0
    assert waits[0] <= 0.5 and max(waits) <= 5.0 and waits[-1] >= 2.5  # grows, capped at 5 s (jitter 0.5-1)
    outage.recovered()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines  # one WARNING when it began, one INFO when it ended: not a line per retry
    assert lines[0].startswith("Redis 127.0.0.1:1 unreachable while following FStream job j1 (ConnectionError")
    assert "up to 30 s" in lines[0] and lines[1].startswith("Redis 127.0.0.1:1 is back after 8.0 s")
    # a new outage has the whole budget again, and ends the task in one line once it is spent
    outage.failed(redis.TimeoutError("Timeout reading from socket"))
    clock.t += 29.9
    assert outage.failed(redis.TimeoutError("x")) <= 0.1 + 1e-9  # never waits past the budget
    clock.t += 0.1
    with pytest.raises(BusOutageError, match=r"^Redis 127.0.0.1:1 unreachable for 30 s while following FStream "
                                             r"job j1 \(redis_outage_timeout 30 s\): TimeoutError: x$"):
        outage.failed(redis.TimeoutError("x"))


def test_a_refused_command_is_no_outage_and_fails_at_once():
    import redis

    calls = []

    def refused():
        calls.append(1)
        raise redis.ResponseError("NOPERM this user has no permissions to run the 'hset' command")

    with pytest.raises(redis.ResponseError, match="NOPERM"):
        Outage(60.0, "reading", logging.getLogger("outage-test")).call(refused)
    assert calls == [1]


# -- real Redis, stopped and started again ---------------------------------------------------------------------------
@pytest.fixture
def server(tmp_path):
    s = RedisServer(str(tmp_path / "redis"), appendonly=True).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def conn(monkeypatch, server):
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", server.url.replace("redis://", "fstream://", 1)
                       + "?" + authkit.conn_query())
    return server.url


class _Agent:
    """The agent's side of one job, as its runner writes it: claim, interval events, done."""

    def __init__(self, url: str, job_id: str) -> None:
        self.client = connect(url)
        from fstream_provider.authz.outcome import load_signer  # this process's agent key, which tasks trust

        self.store = JobStore(self.client, keys=Keys(), outcome_signer=load_signer(None, "agent-1"))
        k = self.store.keys
        resp = self.client.xreadgroup(k.jobs_group(), "agent-1", {k.jobs_stream(): ">"}, count=100)
        self.entry = next(eid for eid, f in resp[0][1] if f["job_id"] == job_id)
        self.job_id = job_id
        self.attempt = self.store.claim(job_id, self.entry, worker="agent-1", max_deliveries=5).attempt

    def interval(self, step: int) -> None:
        ok, _ = self.store.publish(self.job_id, self.attempt, [("interval", time.time(), {
            "t": float(step), "throughput_bps": 1e8 + step, "files_done": step, "files_pending": 9 - step,
            "cc": 2, "p": 1, "pp": 1})])
        assert ok

    def finish(self) -> None:
        assert self.store.finish(self.job_id, self.attempt, self.entry, state="succeeded",
                                 result={"files_committed": 3, "bytes_committed": 3000})

    def events(self) -> list[tuple[str, str]]:
        return [(eid, f["kind"]) for eid, f in self.client.xrange(self.store.keys.job_events(self.job_id))]

    def close(self) -> None:
        self.client.close()


def _outage(server: RedisServer, seconds: float) -> None:
    server._reap(signal.SIGTERM)  # a clean stop: the AOF holds everything written before it
    time.sleep(seconds)  # Redis is down for exactly this long: the fault under test
    server.start()


def _deferred(**kw) -> tuple[FStreamTransferOperator, object]:
    op = FStreamTransferOperator(task_id="transfer", sources=["/data/a"], destination=DEST, deferrable=True, **kw)
    with pytest.raises(TaskDeferred) as exc:
        op.execute({"ti": _TI(1)})
    return op, exc.value.trigger


def _lines(trigger) -> list[logging.LogRecord]:
    """Keep the trigger's log records (its logger is set as Airflow's ``LoggingMixin`` caches it)."""
    handler, log = _Keep(), logging.getLogger(f"trigger-{trigger.job_id}-{id(trigger)}")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    trigger._log = log
    return handler.records


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def _run_trigger(trigger, within: float) -> dict:
    gen = trigger.run()
    try:
        return (await asyncio.wait_for(gen.__anext__(), within)).payload
    finally:
        await gen.aclose()


def test_the_transfer_trigger_rides_out_a_redis_restart_and_fires_the_jobs_outcome(conn, server):
    op, trigger = _deferred()
    trigger.block_ms = 200
    records = _lines(trigger)
    agent = _Agent(conn, trigger.job_id)

    async def scenario() -> dict:
        task = asyncio.ensure_future(_run_trigger(trigger, within=120))
        await asyncio.to_thread(agent.interval, 1)
        await asyncio.to_thread(agent.interval, 2)
        deadline = time.monotonic() + 30
        while sum("interval" in r.getMessage() or "Mbit" in r.getMessage() for r in records) < 2:
            assert time.monotonic() < deadline and not task.done(), [r.getMessage() for r in records]
            await asyncio.sleep(0.02)
        await asyncio.to_thread(_outage, server, DOWN_S)
        await asyncio.to_thread(agent.interval, 3)
        await asyncio.to_thread(agent.finish)
        return await task

    try:
        event = asyncio.run(scenario())
        assert event["status"] == "success" and event["state"] == "succeeded", str(event)  # in full (a dict is cut)
        stream = agent.events()
        assert event["last_event_id"] == stream[-1][0] and stream[-1][1] == "done"
    finally:
        agent.close()
    text = [r.getMessage() for r in records]
    warned = [t for t in text if "unreachable while following FStream job" in t]
    back = [t for t in text if " is back after " in t]
    assert len(warned) == 1 and len(back) == 1, text  # the outage was seen, waited out, and ended once
    # the interval lines: each of the three once, in order, none lost across the restart, none repeated
    intervals = [r for r in records if r.getMessage().startswith("t=") or "files" in r.getMessage()]
    assert len([t for t in text if "Mbit" in t or "Gbit" in t]) == 3, text
    assert intervals  # (the lines are formatted by model.tasklog; the count above is what matters)
    # ... and the task resumes on the job's outcome, reading the job through the same Redis
    report = op.execute_complete({"ti": _TI(1)}, event)
    assert report["state"] == "succeeded" and report["job_id"] == trigger.job_id


def test_past_its_budget_the_trigger_fires_one_line_and_execute_complete_fails_with_it(conn, server):
    op, trigger = _deferred(redis_outage_timeout="2s")
    assert trigger.redis_outage_timeout == 2.0
    trigger.block_ms = 200
    server._reap(signal.SIGTERM)  # down for good (within this test's time)
    event = asyncio.run(_run_trigger(trigger, within=60))
    assert event["status"] == "error" and event["outage"] is True
    # the clock starts at the first failure the client gives up on (its own retries take ~2 s), so a try may end
    # a little past the budget; the line names the Redis, the job, how long, the budget and the error
    m = re.match(rf"Redis redis://127\.0\.0\.1:{server.port}/0 unreachable for (\d+) s while following FStream job "
                 rf"{trigger.job_id} \(redis_outage_timeout 2 s\): ConnectionError: [^\n]+$", event["message"])
    assert m and 2 <= int(m.group(1)) < 20, event["message"]
    with pytest.raises(AirflowException) as exc:
        op.execute_complete({"ti": _TI(1)}, event)
    assert str(exc.value) == event["message"] and exc.value.__cause__ is None and exc.value.__context__ is None  # no traceback chain


def test_execute_complete_waits_for_redis_to_come_back_to_read_the_job(conn, server):
    op, trigger = _deferred()
    agent = _Agent(conn, trigger.job_id)
    try:
        agent.interval(1)
        agent.finish()
        event = {"status": "success", "job_id": trigger.job_id, "state": "succeeded",
                 "message": f"FStream job {trigger.job_id} succeeded"}
        server._reap(signal.SIGTERM)  # the trigger fired; Redis restarts before the task resumes on a worker
        t = threading.Timer(DOWN_S, server.start)
        t.start()
        started = time.monotonic()
        report = op.execute_complete({"ti": _TI(1)}, event)
        t.join()
        assert time.monotonic() - started >= DOWN_S * 0.9  # it did wait for Redis, then read the job
        assert report["state"] == "succeeded" and report["timeline"]["intervals"] == 1  # its events were read
    finally:
        agent.close()


def _polling(op: FStreamTransferOperator) -> tuple:
    """Run the polling operator's execute in a thread until it submitted: ``(ti, results, errors, thread)``."""
    ti, out, errors = _TI(1), [], []

    def run() -> None:
        try:
            out.append(op.execute({"ti": ti}))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    deadline = time.monotonic() + 30
    while "job_id" not in ti.xcom:
        assert time.monotonic() < deadline and not errors, errors
        time.sleep(0.02)
    return ti, out, errors, worker


def test_the_polling_operator_rides_out_a_redis_restart_mid_follow(conn, server):
    op = FStreamTransferOperator(task_id="transfer", sources=["/data/a"], destination=DEST, deferrable=False,
                                 poll_interval=0.2)
    ti, out, errors, worker = _polling(op)
    agent = _Agent(conn, ti.xcom["job_id"])
    try:
        agent.interval(1)
        _outage(server, DOWN_S)
        agent.interval(2)
        agent.finish()
        worker.join(60)
        assert not worker.is_alive() and not errors, errors
        assert out[0]["state"] == "succeeded" and out[0]["timeline"]["intervals"] == 2  # none lost, none twice
    finally:
        agent.close()


def test_the_polling_operator_gives_each_outage_the_whole_budget_while_its_job_is_busy(conn, server):
    """Two outages 6 s apart, each shorter than the budget, the job writing events all along. The outage clock
    ended only on an empty read, which a busy job never gives: the second outage counted from the first and
    failed the task at once (found in review). Now any event ends an outage."""
    op = FStreamTransferOperator(task_id="transfer", sources=["/data/a"], destination=DEST, deferrable=False,
                                 poll_interval=1.0, redis_outage_timeout="9s")
    ti, out, errors, worker = _polling(op)
    agent = _Agent(conn, ti.xcom["job_id"])
    busy, steps = threading.Event(), [0]

    def publish() -> None:  # an interval every 0.3 s, as a busy agent's job writes (through the outages)
        while not busy.is_set():
            steps[0] += 1
            _through_failover(agent.interval, steps[0], timeout=60)
            busy.wait(0.3)

    writer = threading.Thread(target=publish, daemon=True)
    writer.start()
    try:
        time.sleep(2)
        _outage(server, 5.0)
        time.sleep(6)
        _outage(server, 5.0)
        time.sleep(2)
        busy.set()
        writer.join(60)
        _through_failover(agent.finish)
        worker.join(60)
        assert not worker.is_alive() and not errors, errors
        assert out[0]["state"] == "succeeded" and out[0]["timeline"]["intervals"] >= steps[0] - 1
    finally:
        busy.set()
        agent.close()


def test_a_poke_that_claimed_a_batch_returns_it_when_redis_goes_before_it_kept_its_looks(conn, server, tmp_path,
                                                                                          monkeypatch):
    """The claim (SADD) went through, then Redis went before the looks were kept: the poke used to end as
    'nothing found', and the claimed files were never reported (found in review). Now they are returned. The
    failure between the two commands is injected on the client (an outage cannot be timed between them)."""
    import redis

    (tmp_path / "a.dat").write_bytes(b"x" * 10)
    sensor = FStreamNewFilesSensor(task_id="files", path=str(tmp_path), pattern="*.dat", min_age=1e-9,
                                   deferrable=False)
    client = sensor.hook.client

    def gone(*args, **kwargs):
        raise redis.ConnectionError("Connection refused (injected after the claim)")

    monkeypatch.setattr(client, "set", gone)
    got = sensor.poke({})
    assert got.is_done is True and got.xcom_value == [str(tmp_path / "a.dat")]


def test_submitting_waits_for_redis_and_a_submission_is_never_doubled(conn, server):
    """Redis down when the task starts: the submission waits, then goes through once (its idempotency key)."""
    server._reap(signal.SIGTERM)
    t = threading.Timer(DOWN_S, server.start)
    t.start()
    try:
        _, trigger = _deferred()
    finally:
        t.join()
    client = connect(conn)
    try:
        assert client.xlen(Keys().jobs_stream()) == 1 and client.hget(Keys().job(trigger.job_id), "state") == "queued"
    finally:
        client.close()


def test_the_sensor_pokes_through_an_outage_and_finds_the_files_after_it(conn, server, tmp_path):
    (tmp_path / "a.dat").write_bytes(b"x" * 10)
    sensor = FStreamNewFilesSensor(task_id="files", path=str(tmp_path), pattern="*.dat", min_age=1e-9,
                                   deferrable=False)
    server._reap(signal.SIGTERM)
    try:
        down = sensor.poke({})
        assert down.is_done is False  # not a failed task: a poke that found nothing
    finally:
        server.start()
    up = sensor.poke({})
    assert up.is_done is True and up.xcom_value == [str(tmp_path / "a.dat")]


def test_the_event_triggers_acknowledgement_waits_for_redis_so_a_stored_batch_is_not_delivered_again(conn, server,
                                                                                                   tmp_path):
    """Airflow stored the batch's event, then Redis restarted before the ack: the ack waits and goes through (it
    raised before, leaving the batch pending, to be delivered a second time after ``redeliver_after``)."""
    from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

    from fstream_provider.triggers.new_files import FStreamNewFilesTrigger, NewFilesProducer

    (tmp_path / "a.dat").write_bytes(b"x" * 10)
    trigger = FStreamNewFilesTrigger(path=str(tmp_path), pattern="*.dat", scope="ack", min_age=1e-9,
                                     poll_interval=0.05, redeliver_after=60)
    producer = NewFilesProducer(trigger)

    async def scenario() -> str:
        stream = producer.open_stream()
        payload, batch_id = await asyncio.wait_for(stream.__anext__(), 30)
        assert payload["files"] == [str(tmp_path / "a.dat")]
        assert await asyncio.to_thread(_pending, conn, "ack") == 1  # claimed, not yet acknowledged
        await asyncio.to_thread(server._reap, signal.SIGTERM)
        restart = asyncio.get_running_loop().call_later(DOWN_S, server.start)
        try:
            await producer.advance([AdvanceItem(batch_id, AdvanceOutcome(acked=1, failed=0))])
        finally:
            restart.cancel()
            await stream.aclose()
            await producer.aclose()
        return batch_id

    asyncio.run(scenario())
    assert _pending(conn, "ack") == 0  # acknowledged: never delivered again


def _hget(url: str, key: str, field: str) -> str | None:
    client = connect(url)
    try:
        return client.hget(key, field)
    finally:
        client.close()


def _pending(url: str, scope: str) -> int:
    client = connect(url)
    try:
        return client.hlen(Keys().pending(Keys.owned(authkit.SUBMITTER, scope)))  # the connection's submitter's
    finally:
        client.close()


def test_the_transfer_trigger_follows_a_sentinel_failover_and_fires_the_jobs_outcome(tmp_path, monkeypatch):
    """The master is SIGKILLed mid-follow; the sentinel promotes the replica; the trigger finds the new master
    through the Sentinel URL and goes on from the last event it handled (the job's writes wait for the replica)."""
    def failover(group) -> None:
        old = group.master().port
        group.failover()
        assert group.promoted not in (None, old)  # the sentinel named the replica (it may fail back while settling)

    _follow_through_a_master_change(tmp_path, monkeypatch, failover)


def test_the_transfer_trigger_follows_through_a_master_made_a_replica_under_its_read(tmp_path, monkeypatch):
    """The master hands its role to the replica while the trigger is blocked reading on it (``REPLICAOF``: the
    server answers ``-UNBLOCKED … instance state changed`` and keeps the connection). The trigger failed its task
    with that ``ResponseError`` although the job went on and succeeded (the signature of the Sentinel failover
    test's CI flake: a fail-back while the group settles). Now its client reads again on the master the sentinel
    names."""
    def switch(group) -> None:
        old = group.master()
        blocked_reader(old.url)  # the trigger's reader, blocked on the master
        assert group.switch() != old.port

    _follow_through_a_master_change(tmp_path, monkeypatch, switch, down_after_ms=60000)  # no failover of its own


def _follow_through_a_master_change(tmp_path, monkeypatch, change, **group_kw) -> None:
    """A trigger follows a job through a Sentinel URL; after the first interval is logged, ``change(group)`` moves
    the master (in a thread); the agent's side writes the second interval and the outcome through it. The trigger
    must fire the job's success with both intervals logged once each."""
    from fstream_bench.ops.sentinel_group import SentinelGroup

    group = SentinelGroup(tmp_path / "sentinel", **group_kw).start()
    url = group.url + "&wait_replicas=1"
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", "fstream://?" + urlencode({"url": url}) + "&"
                       + authkit.conn_query())
    try:
        op, trigger = _deferred()
        trigger.block_ms = 200
        records = _lines(trigger)
        agent = _Agent(url, trigger.job_id)

        async def scenario() -> dict:
            task = asyncio.ensure_future(_run_trigger(trigger, within=120))
            await asyncio.to_thread(agent.interval, 1)
            deadline = time.monotonic() + 30
            while not any("Mbit" in r.getMessage() for r in records):
                assert time.monotonic() < deadline and not task.done(), [r.getMessage() for r in records]
                await asyncio.sleep(0.02)
            await asyncio.to_thread(change, group)
            await asyncio.to_thread(_through_failover, agent.interval, 2)
            await asyncio.to_thread(_through_failover, agent.finish)
            return await task

        try:
            event = asyncio.run(scenario())
        finally:
            agent.close()
        assert event["status"] == "success" and event["state"] == "succeeded", str(event)  # in full (a dict is cut)
        text = [r.getMessage() for r in records]
        assert len([t for t in text if "Mbit" in t]) == 2, text  # both intervals, once each
    finally:
        group.stop()


def _through_failover(write, *args, timeout: float = 30.0) -> None:
    """The agent's side writes as the agent does across a failover: an unreachable error is tried again."""
    from fstream_provider.bus.client import REDIS_UNREACHABLE

    deadline = time.monotonic() + timeout
    while True:
        try:
            return write(*args)
        except REDIS_UNREACHABLE:
            assert time.monotonic() < deadline
            time.sleep(0.2)  # the agent's backoff, shortened


class _TaskInstance:
    """What a triggerer sets as ``trigger.task_instance``: the ids of the deferred task try."""

    dag_id, run_id, task_id, map_index, try_number = "d", "manual__1", "transfer", -1, 1


def test_a_triggerer_taking_over_does_not_repeat_the_lines_the_first_one_logged(conn, server):
    """Airflow rebuilds a trigger from the kwargs it deferred with (``last_event_id`` 0-0), so the triggerer that
    takes it over after the first died re-read every event and logged every interval line a second time (seen in
    tests/test_airflow_under_faults.py). Now it logs on after the last line the first one recorded (``job_followed``)."""
    _, first = _deferred()
    first.block_ms = 200
    first.task_instance = _TaskInstance()
    kwargs = first.serialize()[1]  # what Airflow stored at deferral
    first_lines = _lines(first)
    agent = _Agent(conn, first.job_id)

    async def until_killed() -> None:
        task = asyncio.ensure_future(_run_trigger(first, within=60))
        for step in (1, 2):
            await asyncio.to_thread(agent.interval, step)
        deadline = time.monotonic() + 30
        while sum("Mbit" in r.getMessage() for r in first_lines) < 2:
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.02)
        # it records how far it logged (at most every FOLLOWED_EVERY_S): wait until the record names the newest event
        newest = agent.events()[-1][0]
        key, field = Keys().job_followed(first.job_id), first._follower()
        while await asyncio.to_thread(_hget, conn, key, field) != newest:
            assert time.monotonic() < deadline + 30, "the first trigger never recorded how far it logged"
            await asyncio.sleep(0.05)
        task.cancel()  # the first triggerer dies
        await asyncio.gather(task, return_exceptions=True)

    second = FStreamTransferTrigger(**kwargs)
    second.task_instance = _TaskInstance()
    second_lines = _lines(second)
    try:
        asyncio.run(until_killed())
        agent.interval(3)
        agent.finish()
        event = asyncio.run(_run_trigger(second, within=60))
    finally:
        agent.close()
    assert event["status"] == "success", event
    first_text = [r.getMessage() for r in first_lines if "Mbit" in r.getMessage()]
    second_text = [r.getMessage() for r in second_lines if "Mbit" in r.getMessage()]
    assert len(first_text) == 2 and len(second_text) == 1, (first_text, second_text)  # each interval once in all
    assert "files 3 done" in second_text[0]
    assert any(r.getMessage().startswith("A triggerer before this one logged FStream job") for r in second_lines)
    # another try of the task (a retry re-attaching to the job) logs the job's story in its own log, in full
    retry = FStreamTransferTrigger(**kwargs)
    retry.task_instance = type("Retry", (_TaskInstance,), {"try_number": 2})()
    retry_lines = _lines(retry)
    asyncio.run(_run_trigger(retry, within=60))
    assert len([r for r in retry_lines if "Mbit" in r.getMessage()]) == 3
