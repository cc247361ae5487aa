"""What an idle agent's scheduling cycle costs Redis (issue 28), on a real redis-server with every command counted:
an unchanged board reads no task, another agent's admission, progress or finish is read (and acted on) by the
next cycle, a write that did not bump the board's version can neither starve a waiting job (the resync) nor
make two agents start one task (the commit compares), the cycle's commands at 1,000 live jobs stay the same
with 10,000 finished jobs next to them, and an idle plain agent looks for dead agents' jobs every
``reclaim_interval``, not every loop."""

from __future__ import annotations

import collections
import json
import threading
import time

import pytest
import redis

from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.sched_board import RESYNC_S, SchedBoard
from fstream_provider.bus.sched_view import SWEEP_PER_CYCLE
from fstream_provider.model.spec import TransferSpec
from fstream_provider.tuning.scheduler import SealConfig
from transfer_agent.daemon.worker import Agent

GB = 1e9
CAP, UNIT = 1e9, 1.25e8  # the knee at 16 streams: a task on 16 streams saturates both ends (test b)
AGENTS_CFG = SealConfig(steal=True, small_s=1.0, resize_running=False)  # as worker.Agent.run builds it
HANDSHAKE = {"HELLO", "CLIENT", "AUTH", "SELECT", "PING"}


class Recorder:
    """Every command a client sends: ``calls`` as ``(NAME, first argument)``, ``args`` with all arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.args: list[tuple[str, ...]] = []

    def note(self, args: tuple) -> None:
        text = (str(args[0]).upper(),) + tuple(str(a) for a in args[1:])
        if text[0] not in HANDSHAKE:
            self.calls.append((text[0], text[1] if len(text) > 1 else ""))
            self.args.append(text)

    def clear(self) -> None:
        self.calls.clear()
        self.args.clear()

    def names(self) -> collections.Counter:
        return collections.Counter(n for n, _ in self.calls)

    def on(self, key: str) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[1] == key]

    def fields(self, name: str, key: str) -> set[str]:
        """The fields every ``name`` (HMGET, ...) on ``key`` asked for."""
        return {f for a in self.args if a[:2] == (name, key) for f in a[2:]}


def counting_client(url: str, rec: Recorder) -> redis.Redis:
    class Counting(redis.Connection):
        def send_command(self, *args, **kwargs):  # one command (immediate, or under WATCH)
            rec.note(args)
            return super().send_command(*args, **kwargs)

        def pack_command(self, *args):
            rec.note(args)
            return super().pack_command(*args)

        def pack_commands(self, commands):  # a pipeline
            for c in commands:
                rec.note(c)
            return super().pack_commands(commands)

    return redis.Redis(connection_pool=redis.ConnectionPool.from_url(url, connection_class=Counting,
                                                                     decode_responses=True))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def keys() -> Keys:
    return Keys("t-cycle")


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def idle(redis_url: str, redis_client, keys: Keys, rec: Recorder, clock: Clock):
    """The idle agent's board, on a counting client, with its own clock (for the resync)."""
    _beat(redis_client, keys, "idle")
    client = counting_client(redis_url, rec)
    yield SchedBoard(client, keys, AGENTS_CFG, clock=clock)
    client.close()


def _beat(client, keys: Keys, *agents: str) -> None:
    for a in agents:
        client.hset(keys.agent(a), mapping={"name": a})
        client.pexpire(keys.agent(a), 600_000)


def _queue(client, keys: Keys, n: int) -> list[tuple[str, str]]:
    """``n`` jobs submitted and read from the stream: ``(job id, entry id)``."""
    store = JobStore(client, keys=keys)
    for i in range(n):
        store.submit(TransferSpec.from_options([f"/data/{i}"], "fstream://dtn:9/x"))
    out: list[tuple[str, str]] = []
    while len(out) < n:
        resp = client.xreadgroup(keys.jobs_group(), "reader", {keys.jobs_stream(): ">"}, count=1000)
        out += [(f["job_id"], e) for e, f in resp[0][1]]
    return out


def _busy_board(client, keys: Keys, waiting: int) -> tuple[SchedBoard, str, list[str]]:
    """Another agent ("busy") runs an interactive task on 16 streams (the path saturated, test b; no rate, so
    the model learns nothing) and ``waiting`` batch tasks wait behind it (STEAL: they never preempt)."""
    client.hset(keys.sched_config(), mapping={f"{k}:{e}": v for e in ("a", "b") for k, v in (("cap", CAP),
                                                                                              ("unit", UNIT))})
    other = SchedBoard(client, keys, AGENTS_CFG)
    (run, e0), *rest = _queue(client, keys, 1 + waiting)
    _beat(client, keys, "busy")
    other.admit(run, e0, src="a", dst="b", size=100 * GB, klass="interactive", arrival=time.time())
    assert other.plan("busy").job_id == run
    other.report(run, 0.0, 0.0, streams=16)
    for job, entry in rest:
        other.admit(job, entry, src="a", dst="b", size=100 * GB, klass="batch", arrival=time.time())
    return other, run, [j for j, _ in rest]


def _unchanged_cycle(rec: Recorder, board: SchedBoard, keys: Keys, live: int) -> collections.Counter:
    """One cycle on a board that did not change: asserts what it sent and returns its commands."""
    rec.clear()
    assert board.plan("idle").job_id is None
    assert not rec.on(keys.sched_tasks()) and not rec.on(keys.sched_progress()), rec.calls  # no task read
    assert rec.on(keys.sched_version()) == [("ZRANGEBYSCORE", keys.sched_version())]  # the one question asked
    assert rec.on(keys.sched_config()) == [("HGETALL", keys.sched_config())]
    assert rec.on(keys.agent("busy")) == [("EXISTS", keys.agent("busy"))]
    assert rec.names()["HGET"] == min(SWEEP_PER_CYCLE, live)  # the finished-job sweep: live jobs' states
    return rec.names()


def test_an_idle_cycle_on_an_unchanged_board_reads_no_task(redis_client, keys, rec, idle) -> None:
    _busy_board(redis_client, keys, waiting=5)
    assert idle.plan("idle").job_id is None  # the first cycle reads the whole board
    assert [n for n, k in rec.calls if k == keys.sched_tasks()] == ["HGETALL"]
    for _ in range(3):
        names = _unchanged_cycle(rec, idle, keys, live=6)
        assert sum(names.values()) == 3 + SWEEP_PER_CYCLE, names  # version log, config, heartbeats, job states


def test_another_agents_admission_progress_and_finish_are_read_by_the_next_cycle(redis_client, keys, rec,
                                                                                  idle) -> None:
    other, run, waiting = _busy_board(redis_client, keys, waiting=2)
    idle.plan("idle")
    # progress: the running task now uses 2 streams (the path has room): the next cycle reads that field only,
    # and the one task it starts (compared when it commits)
    other.report(run, 1 * GB, 2.5e8, streams=2)
    rec.clear()
    d = idle.plan("idle")
    assert d.job_id in waiting, "the room the progress report showed is used"
    assert rec.fields("HMGET", keys.sched_progress()) == {run}
    assert rec.fields("HMGET", keys.sched_tasks()) == {d.job_id}
    # finish: the other agent's task leaves the board; the next cycle reads it and starts the last waiting one
    other.report(run, 1 * GB, 0.0, streams=16)
    other.remove(d.job_id)
    redis_client.hset(keys.job(d.job_id), "state", "succeeded")
    rec.clear()
    (last,) = set(waiting) - {d.job_id}
    assert idle.plan("idle").job_id is None  # the path is full again (16 streams)
    assert rec.fields("HMGET", keys.sched_tasks()) == {d.job_id}
    other.remove(run)
    assert idle.plan("idle").job_id == last
    # admission: a job another agent admits is started by the next cycle
    (new, entry), = _queue(redis_client, keys, 1)
    idle.report(last, 0.0, 0.0, streams=1)
    other.admit(new, entry, src="a", dst="b", size=10e6, klass="interactive", arrival=time.time())
    rec.clear()
    d = idle.plan("idle")
    assert d.job_id == new and new in rec.fields("HMGET", keys.sched_tasks())


def test_a_missed_version_bump_cannot_starve_a_waiting_job(redis_client, keys, rec, idle, clock) -> None:
    """The running task is removed behind the board's back (a raw HDEL, no bump): cycles see nothing new until
    the resync reads the whole board, and the waiting job starts then."""
    _other, run, waiting = _busy_board(redis_client, keys, waiting=1)
    assert idle.plan("idle").job_id is None
    redis_client.hdel(keys.sched_tasks(), run)
    redis_client.hdel(keys.sched_progress(), run)
    assert idle.plan("idle").job_id is None  # it still believes the path full
    clock.t += 1.2 * RESYNC_S + 0.1
    rec.clear()
    assert idle.plan("idle").job_id == waiting[0]
    assert ("HGETALL", keys.sched_tasks()) in rec.calls


def test_a_task_started_behind_the_boards_back_is_not_started_again(redis_client, keys, idle) -> None:
    """A writer that does not bump starts the waiting task; the idle agent, told by the log only that the running
    one left, decides to start the waiting one and finds it changed when it commits: it decides again."""
    other, run, (job,) = _busy_board(redis_client, keys, waiting=1)
    assert idle.plan("idle").job_id is None
    t = other.task(job)
    t.update(state="running", agent="busy", cc=4, started=time.time())
    redis_client.hset(keys.sched_tasks(), job, json.dumps(t))  # no bump
    other.remove(run)
    assert idle.plan("idle").job_id is None
    assert other.task(job)["agent"] == "busy"


def test_a_cycle_at_1000_live_jobs_sends_the_same_commands_with_10000_finished_jobs(redis_client, keys, rec,
                                                                                     idle) -> None:
    _busy_board(redis_client, keys, waiting=999)
    idle.plan("idle")
    before = [_unchanged_cycle(rec, idle, keys, live=1000) for _ in range(3)]
    store = JobStore(redis_client, keys=keys)
    done = set()
    for job, entry in _queue(redis_client, keys, 10_000):
        claim = store.claim(job, entry, worker="reader", max_deliveries=5)
        assert store.finish(job, claim.attempt, entry, state="succeeded")
        done.add(keys.job(job))
    after = [_unchanged_cycle(rec, idle, keys, live=1000) for _ in range(3)]
    assert before == after
    assert not {k for _, k in rec.calls} & done, "no finished job is read"


def test_an_idle_plain_agent_looks_for_dead_agents_jobs_every_reclaim_interval(redis_url, redis_client,
                                                                               keys) -> None:
    rec = Recorder()
    agent = Agent(redis_url, name="plain", keys=keys, claim_idle_ms=100, reclaim_interval=3.0, block_ms=20)
    agent._client = counting_client(redis_url, rec)
    agent._store = JobStore(agent._client, keys=keys)
    try:
        t0 = time.monotonic()
        for _ in range(10):
            assert agent._iteration() is False
        assert time.monotonic() - t0 < 3.0
        names = rec.names()
        scans = [a for a in rec.args if a[0] == "XPENDING" and "IDLE" in a]  # not housekeeping's summary
        # one look at its own pending list and one for dead agents' jobs, then only the blocking reads
        assert (names["XREADGROUP"], len(scans), names["XAUTOCLAIM"]) == (1 + 10, 1, 1), names
        # a dead agent's job is still found, within the interval
        (job, entry), = _queue(redis_client, keys, 1)  # read by "reader", which has no heartbeat
        deadline = time.monotonic() + 10
        got: list = []
        while not got and time.monotonic() < deadline:
            got = agent._intake(20, count=1)
        assert [e for e, _ in got] == [entry]
    finally:
        agent._client.close()


def test_one_idle_agent_cycles_per_turn_and_a_start_hands_the_turn_on(redis_client, keys) -> None:
    a, b = SchedBoard(redis_client, keys, AGENTS_CFG), SchedBoard(redis_client, keys, AGENTS_CFG)
    assert a.take_turn("a", 0.5) and not b.take_turn("b", 0.5)
    assert 0 < redis_client.pttl(keys.sched_turn()) <= 250  # half the interval
    b.end_turn("b")  # not b's turn: nothing happens
    assert redis_client.get(keys.sched_turn()) == "a"
    a.end_turn("a")  # a's cycle started a job: the next agent may cycle at once
    assert b.take_turn("b", 0.5) and redis_client.get(keys.sched_turn()) == "b"


@pytest.mark.serial  # eight agents' turns within a 3 s window: starved threads (4 xdist workers on 2 cores) took 1 turn
def test_idle_scheduled_agents_share_the_cycles_instead_of_each_running_them(redis_url, redis_client, keys,
                                                                              monkeypatch) -> None:
    """Eight idle agents over a saturated board for 3 s: about one cycle per quarter second in all (issue 28),
    where each agent used to run two a second (48)."""
    _busy_board(redis_client, keys, 40)
    plans: collections.Counter = collections.Counter()
    real_plan = SchedBoard.plan

    def counted(self, agent, now=None):  # noqa: ANN001, ANN202
        plans[agent] += 1
        return real_plan(self, agent, now)

    monkeypatch.setattr(SchedBoard, "plan", counted)
    agents = [Agent(redis_url, name=f"idle-{i}", keys=keys, scheduler="steal") for i in range(8)]
    threads = [threading.Thread(target=ag.run) for ag in agents]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(3.0)
    for ag in agents:
        ag.stop()
    for t in threads:
        t.join(timeout=15)
    assert not any(t.is_alive() for t in threads)
    elapsed = time.monotonic() - t0
    total = sum(plans.values())
    assert 3 <= total <= elapsed / 0.25 + 4, (total, elapsed, plans)
    assert len(plans) >= 2, f"the turn passes between agents: {dict(plans)}"
