"""The agents' shared SEAL/STEAL board on a real Redis (issue #11): admission acknowledges the entry, racing
agents never start one task twice, a dead agent's task waits again, cancelled jobs leave, STEAL preempts
batch for interactive, the learned maximum and correction persist."""

from __future__ import annotations

import threading
import time

import pytest

from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.sched_board import SchedBoard
from fstream_provider.model.spec import TransferSpec
from fstream_provider.tuning.scheduler import SealConfig
import authkit

GB = 1e9


@pytest.fixture
def keys() -> Keys:
    return Keys("t-sched")


def _queue(redis_client, keys: Keys, n: int, klass: str = "interactive") -> list[tuple[str, str]]:
    """``n`` jobs submitted and read from the stream by one consumer: ``(job_id, entry_id)``."""
    store = JobStore(redis_client, keys=keys, signer=authkit.signer())
    for i in range(n):
        store.submit(TransferSpec.from_options([f"/data/{i}"], "fstream://dtn:9/x", priority_class=klass))
    resp = redis_client.xreadgroup(keys.jobs_group(), "reader", {keys.jobs_stream(): ">"}, count=n)
    return [(f["job_id"], e) for e, f in resp[0][1]]


def _beat(redis_client, keys: Keys, *agents: str) -> None:
    for a in agents:
        redis_client.hset(keys.agent(a), mapping={"name": a})
        redis_client.pexpire(keys.agent(a), 60_000)


def _path(redis_client, keys: Keys, cap: float, unit: float, ends: tuple[str, ...] = ("a", "b")) -> None:
    """The model's endpoints: each end's known maximum and one stream's rate (``fstream schedule set``)."""
    redis_client.hset(keys.sched_config(), mapping={f"{k}:{e}": v for e in ends for k, v in (("cap", cap),
                                                                                              ("unit", unit))})


def _running_batch(board: SchedBoard, redis_client, keys: Keys, size: float, done: float, rate: float,
                   streams: int = 0) -> str:
    """A batch job started by agent x and reporting its progress; agents x and y alive."""
    (batch, entry), = _queue(redis_client, keys, 1, "batch")
    _beat(redis_client, keys, "x", "y")
    board.admit(batch, entry, src="a", dst="b", size=size, klass="batch", arrival=time.time())
    assert board.plan("x").job_id == batch
    board.report(batch, done, rate, streams)
    return batch


def test_admission_acknowledges_the_entry_once_and_keeps_the_task(redis_client, keys) -> None:
    board = SchedBoard(redis_client, keys)
    (job, entry), = _queue(redis_client, keys, 1)
    assert redis_client.xpending(keys.jobs_stream(), keys.jobs_group())["pending"] == 1
    assert board.admit(job, entry, src="a", dst="b", size=GB, klass="interactive", arrival=time.time())
    assert redis_client.xpending(keys.jobs_stream(), keys.jobs_group())["pending"] == 0
    assert not board.admit(job, entry, src="a", dst="b", size=2 * GB, klass="batch", arrival=0.0)
    t = board.task(job)
    assert (t["state"], t["size"], t["klass"], t["entry"]) == ("waiting", GB, "interactive", entry)


def test_racing_agents_start_each_task_exactly_once(redis_client, keys) -> None:
    """Eight agents plan at once over 24 small tasks (each starts whatever the load, §4.4): every task is
    started by exactly one agent."""
    now = time.time()
    jobs = _queue(redis_client, keys, 24)
    agents = [f"agent-{i}" for i in range(8)]
    _beat(redis_client, keys, *agents)
    for job, entry in jobs:
        SchedBoard(redis_client, keys).admit(job, entry, src="a", dst="b", size=0.5 * GB, klass="interactive",
                                             arrival=now)
    started: list[tuple[str, str]] = []
    lock = threading.Lock()

    def work(name: str) -> None:
        board = SchedBoard(redis_client, keys)  # each agent its own connection pool and transactions
        for _ in range(40):
            d = board.plan(name)
            if d.job_id:
                with lock:
                    started.append((d.job_id, name))

    threads = [threading.Thread(target=work, args=(a,)) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ids = [j for j, _ in started]
    assert sorted(ids) == sorted(j for j, _ in jobs), "each task started exactly once"
    board = SchedBoard(redis_client, keys)
    assert all(board.task(j)["agent"] == a and board.task(j)["state"] == "running" for j, a in started)


def test_a_dead_agents_task_waits_again_with_its_run_time(redis_client, keys) -> None:
    board = SchedBoard(redis_client, keys)
    (job, entry), = _queue(redis_client, keys, 1)
    board.admit(job, entry, src="a", dst="b", size=GB, klass="interactive", arrival=100.0)
    _beat(redis_client, keys, "alive")
    assert board.plan("ghost", now=110.0).job_id == job  # started by an agent with no heartbeat
    d = board.plan("alive", now=125.0)  # the next cycle finds it orphaned and hands it to a live agent
    assert d.job_id == job
    t = board.task(job)
    assert t["agent"] == "alive" and t["ran_s"] == pytest.approx(15.0)


def test_a_job_cancelled_while_waiting_leaves_the_board(redis_client, keys) -> None:
    board = SchedBoard(redis_client, keys, SealConfig(small_bytes=0))
    _path(redis_client, keys, 1e9, 1e9, ends=("b",))
    (j1, e1), (j2, e2) = _queue(redis_client, keys, 2)
    _beat(redis_client, keys, "x", "y")
    for j, e in ((j1, e1), (j2, e2)):
        board.admit(j, e, src="a", dst="b", size=100 * GB, klass="interactive", arrival=time.time())
    first = board.plan("x").job_id
    board.report(first, 1e9, 1e9)  # the endpoint is full: the other waits
    other = j2 if first == j1 else j1
    assert board.plan("y").job_id is None and board.task(other)["state"] == "waiting"
    JobStore(redis_client, keys=keys, signer=authkit.signer()).cancel(other, "not needed")
    board.plan("y")
    assert board.task(other) is None and board.task(first)["state"] == "running"


def test_steal_marks_a_running_batch_task_for_an_interactive_one(redis_client, keys) -> None:
    board = SchedBoard(redis_client, keys, SealConfig(steal=True, small_bytes=0))
    _path(redis_client, keys, 1e9, 1e9)
    batch = _running_batch(board, redis_client, keys, 500 * GB, 5e9, 1e9)
    (inter, ei), = _queue(redis_client, keys, 1)
    board.admit(inter, ei, src="a", dst="b", size=50 * GB, klass="interactive", arrival=time.time())
    d = board.plan("y")
    assert d.job_id == inter and [v for v, _ in d.preempted] == [batch]
    t = board.task(batch)
    assert t["preempt_by"] == inter and "preempt" in t["preempt_reason"] and t["state"] == "running"
    assert board.requeue(batch, done_bytes=5e9, preempted=True)
    t = board.task(batch)
    assert (t["state"], t["done"], t["preemptions"], t["preempt_by"]) == ("waiting", 5e9, 1, "")


def test_the_endpoints_learned_maximum_and_correction_persist(redis_client, keys) -> None:
    board = SchedBoard(redis_client, keys)
    _path(redis_client, keys, 1e9, 1e8, ends=("b",))
    jobs = _queue(redis_client, keys, 2)
    _beat(redis_client, keys, "x", "y")
    for j, e in jobs:
        board.admit(j, e, src="a", dst="b", size=0.5 * GB, klass="interactive", arrival=time.time())
    first = board.plan("x", now=100.0).job_id
    board.report(first, 1e8, 2e9)  # moving twice the configured maximum
    board.plan("y", now=101.0)  # in its start-up: a burst into socket buffers, not the path's maximum
    assert float(redis_client.hget(keys.sched_config(), "cap:b")) == 1e9
    board.plan("y", now=110.0)
    cfg = redis_client.hgetall(keys.sched_config())
    assert float(cfg["cap:b"]) == pytest.approx(2e9)
    assert any(k.startswith("ratio:") for k in cfg)


def test_fstream_schedule_sets_an_endpoint_and_shows_the_board(redis_url, redis_client, keys, capsys) -> None:
    from transfer_agent.cli.main import main

    assert main(["schedule", "set", "--endpoint", "dtn:9", "--capacity", "1Gbit", "--unit", "150Mbit",
                 "--redis", redis_url, "--namespace", keys.namespace]) == 0
    assert float(redis_client.hget(keys.sched_config(), "cap:dtn:9")) == 1e9
    (job, entry), = _queue(redis_client, keys, 1, "batch")
    SchedBoard(redis_client, keys).admit(job, entry, src="a", dst="dtn:9", size=GB, klass="batch", arrival=time.time())
    capsys.readouterr()
    assert main(["schedule", "--redis", redis_url, "--namespace", keys.namespace]) == 0
    out = capsys.readouterr().out
    assert f"{job} batch       a -> dtn:9: waiting" in out
    assert "endpoint dtn:9: maximum 1000 Mbit/s, one stream 150 Mbit/s" in out
    assert main(["schedule", "set", "--endpoint", "dtn:9", "--capacity", "fast", "--redis", redis_url]) == 2


def test_reconcile_leaves_jobs_on_the_board_alone(redis_client, keys) -> None:
    """Admitted jobs have their entry acknowledged (and trimmed): not orphans, not re-enqueued."""
    from fstream_provider.bus.reconcile import reconcile

    store = JobStore(redis_client, keys=keys, signer=authkit.signer())
    (job, entry), = _queue(redis_client, keys, 1)
    SchedBoard(redis_client, keys).admit(job, entry, src="a", dst="b", size=GB, klass="interactive",
                                         arrival=time.time())
    assert store.trim_acked() == 1
    report = reconcile(store, repair=True)
    assert report.live_jobs == 1 and not report.findings
    assert redis_client.xlen(keys.jobs_stream()) == 0 and store.get(job).state == "queued"


def test_a_task_loads_its_ends_with_the_streams_it_reports_not_its_cap(redis_client, keys) -> None:
    """A batch task given a cap that would fill the path but using 2 of its streams leaves room (saturation
    test b) for a second batch task; once it reports the streams that fill the path, the second waits."""
    board = SchedBoard(redis_client, keys, SealConfig(steal=True, small_bytes=0))
    _path(redis_client, keys, 1e9, 1.25e8)
    (j1, e1), (j2, e2) = _queue(redis_client, keys, 2, "batch")
    _beat(redis_client, keys, "x", "y")
    board.admit(j1, e1, src="a", dst="b", size=100 * GB, klass="batch", arrival=time.time())
    d = board.plan("x")
    assert d.job_id == j1 and d.cc >= 8
    board.admit(j2, e2, src="a", dst="b", size=100 * GB, klass="batch", arrival=time.time())
    board.report(j1, 1e9, 8e8, streams=d.cc)
    assert board.plan("y").job_id is None  # it fills the path: the second batch task waits
    board.report(j1, 1e9, 2.5e8, streams=2)
    assert board.plan("y").job_id == j2


def test_a_running_task_whose_job_ended_leaves_the_board(redis_client, keys) -> None:
    """An agent's removal lost (Redis blip): the next cycle drops the finished job's task."""
    board = SchedBoard(redis_client, keys)
    (job, entry), = _queue(redis_client, keys, 1)
    _beat(redis_client, keys, "x")
    board.admit(job, entry, src="a", dst="b", size=GB, klass="interactive", arrival=time.time())
    assert board.plan("x").job_id == job
    redis_client.hset(keys.job(job), "state", "succeeded")
    board.plan("x")
    assert board.task(job) is None


def test_one_streams_rate_is_learned_from_the_agents_streams_past_their_start_up(redis_client, keys) -> None:
    """Configured 125 Mbit/s per stream; the agent's 4 streams move 200 Mbit/s in all (50 each) on a
    1 Gbit/s end: after start-up the learned unit moves toward 50 Mbit/s, never during start-up."""
    board = SchedBoard(redis_client, keys, SealConfig(small_bytes=0))
    _path(redis_client, keys, 1e9, 1.25e8)
    jobs = _queue(redis_client, keys, 2)
    _beat(redis_client, keys, "x", "y")
    for j, e in jobs:
        board.admit(j, e, src="a", dst="b", size=100 * GB, klass="interactive", arrival=100.0)
    first = board.plan("x", now=100.0).job_id
    board.report(first, 1e9, 2e8, streams=4)
    board.plan("y", now=102.0)  # 2 s after its start: start-up, nothing learned
    assert redis_client.hget(keys.sched_config(), "unit_seen:b") is None
    for k in range(40):
        board.plan("y", now=110.0 + k)
    seen = float(redis_client.hget(keys.sched_config(), "unit_seen:b"))
    assert 5e7 < seen < 0.25 * 1.25e8 + 0.75 * 5e7  # most of the way from 125 to 50 Mbit/s


def test_busy_streams_count_only_channels_with_a_file_to_send() -> None:
    from transfer_agent.daemon.jobrun import busy_streams

    iv = {"clusters": {"large": {"cc": 4, "p": 4}, "small": {"cc": 2, "p": 1}}, "active_files": 9}
    assert busy_streams(iv) == 18
    assert busy_streams({**iv, "active_files": 1}) == 4  # the last large file: one channel's streams
    assert busy_streams({**iv, "active_files": 0}) == 0
    assert busy_streams({"clusters": {"large": {"cc": 3, "p": 2}}}) == 6  # older records without the count


@pytest.mark.parametrize("resize_running, batch_starts", [(True, False), (False, True)])
def test_imagined_raises_of_running_tasks_keep_batch_out_only_when_on(redis_client, keys, resize_running,
                                                                      batch_starts) -> None:
    """An interactive task on its last file (2 streams, 250 Mbit/s of 1 Gbit/s): as printed, the cycle first
    raises its cc to fill the path and then finds no room for the waiting batch task; the agents' setting
    (its tuner retunes live, nothing is raised) lets the batch task use what it leaves."""
    board = SchedBoard(redis_client, keys, SealConfig(steal=True, small_bytes=0, resize_running=resize_running))
    _path(redis_client, keys, 1e9, 1.25e8)
    (inter, ei), = _queue(redis_client, keys, 1)
    (batch, eb), = _queue(redis_client, keys, 1, "batch")
    _beat(redis_client, keys, "x", "y")
    board.admit(inter, ei, src="a", dst="b", size=100 * GB, klass="interactive", arrival=time.time())
    assert board.plan("x").job_id == inter
    board.report(inter, 99 * GB, 2.5e8, streams=2)
    board.admit(batch, eb, src="a", dst="b", size=100 * GB, klass="batch", arrival=time.time())
    assert (board.plan("y").job_id == batch) is batch_starts


@pytest.mark.parametrize("size_mb, preempts", [(300, True), (50, False)])
def test_small_is_a_second_at_the_paths_maximum_for_the_agents(redis_client, keys, size_mb, preempts) -> None:
    """On a 1 Gbit/s path "small" is what moves in 1 s (125 MB), not the paper's 1 GB: a 300 MB interactive
    job frees the batch job in its way, a 50 MB one starts beside it."""
    board = SchedBoard(redis_client, keys, SealConfig(steal=True, small_s=1.0))
    _path(redis_client, keys, 1e9, 1.25e8)
    batch = _running_batch(board, redis_client, keys, 100 * GB, 1e9, 9.5e8, streams=8)
    (inter, ei), = _queue(redis_client, keys, 1)
    board.admit(inter, ei, src="a", dst="b", size=size_mb * 1e6, klass="interactive", arrival=time.time())
    d = board.plan("y")
    assert d.job_id == inter and bool(d.preempted) is preempts


def test_an_agent_admits_a_dead_fifo_agents_running_job_and_leaves_a_live_ones_alone(redis_url, redis_client,
                                                                                     keys) -> None:
    """Mixed namespaces: a job left 'running' by an agent whose heartbeat is gone goes on the board (the next
    claim fences that agent out); one a live agent runs outside the scheduler is left to it."""
    from transfer_agent.daemon.worker import Agent

    store = JobStore(redis_client, keys=keys, signer=authkit.signer())
    jobs = _queue(redis_client, keys, 2)
    for (job, entry), worker in zip(jobs, ("dead-fifo", "live-fifo")):
        redis_client.hset(keys.job(job), mapping={"state": "running", "worker": worker})
    _beat(redis_client, keys, "live-fifo")
    agent = Agent(redis_url, policy=authkit.policy(authkit.key_file()), name="sched", keys=keys, scheduler="seal")
    agent._client, agent._store = redis_client, store
    from fstream_provider.bus.audit import AuditLog
    from transfer_agent.daemon.authorize import Authorizer

    agent.authorizer, agent.audit = Authorizer(agent.policy, redis_client, keys), AuditLog(redis_client, keys)
    agent._board = SchedBoard(redis_client, keys)
    for job, entry in jobs:
        agent._admit(entry, {"job_id": job})
    (dead_job, _), (live_job, _) = jobs
    assert agent._board.task(dead_job)["state"] == "waiting"
    assert agent._board.task(live_job) is None


@pytest.mark.parametrize("share, streams, starts", [(False, 8, False), (True, 8, True), (False, 12, False),
                                                    (True, 12, False)])
def test_seal_share_on_the_board_starts_a_job_beside_a_saturating_one_only_below_the_knee(
        redis_client, keys, share, streams, starts) -> None:
    """Issue 44 on the agents' board (``--scheduler seal-share``): a second 100 GB job arrives while the first
    fills a 1 Gbit/s path with 8 streams (the knee: 16). SEAL as written makes it wait; the sharing rule starts it
    with an equal share (8: 16 streams, at the knee). Past the knee (12 + 12) it waits under both."""
    board = SchedBoard(redis_client, keys, SealConfig(small_s=1.0), share=share)
    _path(redis_client, keys, 1e9, 1.25e8)
    (first, e1), (second, e2) = _queue(redis_client, keys, 2)
    _beat(redis_client, keys, "x", "y")
    board.admit(first, e1, src="a", dst="b", size=100 * GB, klass="interactive", arrival=100.0)
    assert board.plan("x", now=100.0).job_id == first
    board.report(first, 1e9, 1e9, streams=streams)
    board.admit(second, e2, src="a", dst="b", size=100 * GB, klass="interactive", arrival=101.0)
    d = board.plan("y", now=101.5)
    assert (d.job_id == second) is starts
    t = board.task(second)
    if starts:
        assert (t["state"], t["agent"], t["cc"]) == ("running", "y", 8) and not d.preempted
        assert "below the knee at a 16 of 16 streams, b 16 of 16 streams: share" in d.reason, d.reason
        assert board.task(first)["state"] == "running" and not board.task(first)["preempt_by"]
    else:
        assert t["state"] == "waiting" and d.job_id is None
