"""FStream on a real six-node Redis Cluster (issue 28): the keys spread over the masters, every store works across
slots, a master SIGKILLed during a running transfer loses no job and no landed-file record, and a new-files batch
is re-delivered with its batch id after its scope's master failed over. One cluster for the module
(``clusterkit``); each test has its own namespace."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fstream_provider.bus.client import connect, connect_async
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.migrate_keys import migrate
from fstream_provider.bus.pools import StreamPools
from fstream_provider.bus.profiling_store import ProfilingStore
from fstream_provider.bus.sched_board import SchedBoard
from fstream_provider.bus.transfer_history import TransferHistory
from fstream_provider.model.spec import TransferSpec
from fstream_provider.tuning.harp_history import HistoryRow
from fstream_provider.tuning.policy import GreedyPolicy
from fstream_provider.tuning.profile_history import ProfileHistory, ProfileRecord
from fstream_provider.watch.pending import PendingBatches
from fstream_provider.watch.seen import RedisSeenStore
from fstream_provider.watch.stability import FileStat
import authkit
from agentkit import PacedReceiver, make_files, start_receiver, trees_identical, wait_until, write_secret
from clusterkit import RedisCluster6, find_redis_cli

MB = 1 << 20


@pytest.fixture(scope="module")
def rc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster6]:
    if find_redis_cli() is None:
        if os.environ.get("FSTREAM_REQUIRE_WAN", "") not in ("", "0"):
            pytest.fail("redis-cli is missing although bench/install-deps.sh installs it (package redis-tools)")
        pytest.skip("redis-cli is not installed (Debian: redis-tools; bench/install-deps.sh installs it)")
    c = RedisCluster6(tmp_path_factory.mktemp("cluster"))
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def client(rc: RedisCluster6) -> Iterator:
    c = connect(rc.url)
    try:
        yield c
    finally:
        c.close()


def _control_keys(k: Keys, job_id: str) -> list[str]:
    return [k.jobs_stream(), k.dead_letter(), k.job(job_id), k.job_events(job_id), k.job_index(), k.idempotency("i"),
            k.audit(), k.nonce("s", "n"), k.agent("a"), k.agents(), k.sched_tasks(), k.sched_progress(),
            k.sched_config()]


def test_keys_spread_over_the_masters_and_every_store_works(rc, client):
    k = Keys("c-spread")
    waiting = connect(rc.url + "?wait_replicas=1&wait_timeout_ms=2000")  # job writes wait for the replica
    store = JobStore(waiting, keys=k, signer=authkit.signer())
    job_id, created = store.submit(TransferSpec(sources=["/x"], destination="fstream://dtn:9/y"),
                                   idempotency_key="dag/run/t/-1")
    assert created

    # where the keys are: the control plane in one slot, the scope's three keys in another, each tuning key its own
    assert len({rc.slot_of(key) for key in _control_keys(k, job_id)}) == 1
    assert len({rc.slot_of(key) for key in (k.seen("s1"), k.pending("s1"), k.looks("s1"))}) == 1
    spread = {"job": k.job(job_id), "seen": k.seen("s1"), "history": k.history(), "pool": k.pool("dtn-a", "dtn-b"),
              "profiling": k.profiling("small", "h5")}
    masters = {name: rc.master_of(key).address for name, key in spread.items()}
    assert len(set(masters.values())) >= 2, masters
    assert len({rc.slot_of(key) for key in spread.values()}) == len(spread)

    # jobs: claim, publish, finish (the Lua scripts over the namespace slot), events
    (entry_id, fields), = client.xreadgroup(k.jobs_group(), "w1", {k.jobs_stream(): ">"}, count=1)[0][1]
    claim = store.claim(fields["job_id"], entry_id, worker="w1", max_deliveries=3)
    assert claim.outcome == "claimed"
    assert store.publish(job_id, claim.attempt, [("file", time.time(), {"path": "a", "status": "committed"})]) \
        == (True, False)
    assert store.finish(job_id, claim.attempt, entry_id, state="succeeded", result={"files": 1})
    assert [e["kind"] for _, e in store.events(job_id)] == ["queued", "claimed", "file", "done"]
    assert store.get(job_id).state == "succeeded"
    assert client.ttl(k.idempotency(store.scoped_idempotency("dag/run/t/-1"))) > 0  # <submitter>:<key> (issue 40)
    assert store.replication == {"acknowledged": 4}  # submit, claim, publish, finish: each on the replica too


    # seen sets: sync claim; the trigger's claim + pending batch (one Lua call on the scope's slot), ack
    seen = RedisSeenStore.scoped(client, k, "s1")
    files = [FileStat("/data/a.h5", 10, 1.0), FileStat("/data/b.h5", 20, 2.0)]
    assert seen.claim(files[:1]) == files[:1] and seen.unseen(files) == files[1:]

    async def trigger_side() -> None:
        ac = connect_async(rc.url)
        try:
            batches = PendingBatches(ac, k.seen("s2"), k.pending("s2"))
            assert await batches.aclaim(files) == files and await batches.aunseen(files) == []
            [(batch_id, _at, got)] = await batches.pending()
            assert batch_id == batches.last_batch_id and got == files
            assert (await batches.take_redeliverable(0.0)) == (batch_id, files)
            await batches.ack(batch_id)
            assert await batches.pending() == []
        finally:
            await ac.aclose()

    asyncio.run(trigger_side())

    # HARP's history, the profiling lists (scanned on every master), the stream pools
    history = TransferHistory(client, keys=k)
    rows = [HistoryRow("a", "b:1", 1e9, 0.04, MB, "small", 1e6, 10, cc, 1, 0, 1e8 * cc, 1_795_000_000 + cc, 1.0, "g")
            for cc in (1, 2, 4)]
    assert history.append(rows) == 3 and [r.cc for r in history.iter_rows()] == [1, 2, 4]
    prof = ProfileHistory([])
    for avg_size, ftype in ((1e4, "h5"), (1e9, "xtc"), (1e7, "")):
        prof.add(ProfileRecord(avg_size, "", ftype, 2, 4, 1, 1e9, 1.0))
    assert ProfilingStore(client, keys=k).save(prof) == 3
    assert len({rc.slot_of(k.profiling(r.size_class, r.ftype or "-")) for r in prof.records()}) == 3
    assert sorted(r.ftype for r in ProfilingStore(client, keys=k).load().records()) == ["", "h5", "xtc"]
    pools = StreamPools(client, k, ttl_s=30)
    pairs = [("dtn-a", "dtn-b"), ("dtn-a", "dtn-c"), ("dtn-c", "dtn-b")]
    assert len({rc.master_of(k.pool(*pair)).address for pair in pairs}) >= 2  # pairs() scans every master
    for src, dst in pairs:
        assert pools.provision(src, dst, "agent-1", GreedyPolicy(s_pmax=8, s_cmax=4, s_i=2, s_u=2)).streams == 2
    assert pools.renew("dtn-a", "dtn-b", "agent-1") == 2 and pools.pairs() == sorted(pairs)
    assert pools.give_back("dtn-a", "dtn-b", "agent-1") == 2 and pools.status("dtn-a", "dtn-b")["allocated"] == 0
    waiting.close()


def test_the_scheduler_board_admits_and_plans_on_the_cluster(rc, client):
    """Admission acknowledges the stream entry in the board's MULTI (jobs stream + board: the namespace slot)."""
    k = Keys("c-board")
    store = JobStore(client, keys=k, signer=authkit.signer())
    job_id, _ = store.submit(TransferSpec(sources=["/z"], destination="fstream://dtn:9/y"))
    (entry_id, _f), = client.xreadgroup(k.jobs_group(), "w1", {k.jobs_stream(): ">"}, count=1)[0][1]
    board = SchedBoard(client, k)
    client.hset(k.agent("w1"), mapping={"name": "w1"})
    assert board.admit(job_id, entry_id, src="a", dst="b", size=1e9, klass="interactive", arrival=time.time())
    assert client.xpending(k.jobs_stream(), k.jobs_group())["pending"] == 0
    assert board.plan("w1").job_id == job_id and board.task(job_id)["state"] == "running"


def test_the_wait_option_leaves_the_rest_of_the_url_alone():
    from fstream_provider.bus.client import _wait_option

    assert _wait_option("redis+cluster://h1:1,h2:2") == ("redis+cluster://h1:1,h2:2", (0, 0))
    assert _wait_option("redis+cluster://h1:1?wait_replicas=1") == ("redis+cluster://h1:1", (1, 500))
    assert _wait_option("rediss://u:p@h:6380/0?ssl_ca_certs=/etc/ca.pem&wait_replicas=2&wait_timeout_ms=50") \
        == ("rediss://u:p@h:6380/0?ssl_ca_certs=/etc/ca.pem", (2, 50))
    with pytest.raises(ValueError, match="wait_replicas"):
        _wait_option("redis://h:1/0?wait_replicas=one")


def test_a_standalone_server_without_replicas_lets_the_write_stand_and_counts_it_short(redis_url):
    waiting = connect(redis_url + "?wait_replicas=1&wait_timeout_ms=20")
    try:
        store = JobStore(waiting, keys=Keys("s-wait"), signer=authkit.signer())
        job_id, created = store.submit(TransferSpec(sources=["/x"], destination="fstream://dtn:9/y"))
        assert created and store.get(job_id).state == "queued"
        assert store.replication == {"short": 1}  # WAIT 1 20 ran on the submit's connection and found no replica
    finally:
        waiting.close()


def test_migrate_keys_moves_the_old_layout_key_by_key_on_the_cluster(rc, client):
    """Keys named as before issue 28 (all in the namespace slot) move to their own slots; no cross-slot command."""
    k = Keys("c-migrate")
    old = k.prefix
    client.sadd(old + "seen:scope1", "/d/a", "/d/b")
    client.hset(old + "pending:scope1", "batch1", '{"claimed_at": 1, "delivered_at": 1, "files": []}')
    client.set(old + "looks:scope1", "{}", ex=3600)
    client.hset(old + "calibration:path1", "run", "r1")
    client.rpush(old + "profiling:small:h5", "r1", "r2")
    client.hset(old + "pool:dtn-a:dtn-b", "s_pmax", 8)
    for i in range(3):
        client.xadd(old + "history", {"row": f"old{i}"}, id=f"{1000 + i}-0")
    client.xadd(k.history(), {"row": "new"}, id="5000-0")  # an upgraded agent wrote the new stream already
    client.sadd(k.seen("scope1"), "/d/c")

    report = migrate(client, k)
    assert dict(report.moved) == {"seen": 1, "pending": 1, "looks": 1, "calibration": 1, "profiling": 1, "pool": 1,
                                  "history": 1}
    assert report.merged["seen"] == 1 and report.merged["history"] == 1
    assert client.smembers(k.seen("scope1")) == {"/d/a", "/d/b", "/d/c"}
    assert list(client.hgetall(k.pending("scope1"))) == ["batch1"] and 0 < client.ttl(k.looks("scope1")) <= 3600
    assert client.lrange(k.profiling("small", "h5"), 0, -1) == ["r1", "r2"]
    assert client.hget(k.pool("dtn-a", "dtn-b"), "s_pmax") == "8" and client.hget(k.calibration("path1"), "run") == "r1"
    assert [f["row"] for _, f in client.xrange(k.history())] == ["old0", "old1", "old2", "new"]
    assert [e for e, _ in client.xrange(k.history())][0] == "1000-0"  # the rows keep their time
    assert [key for pattern in k.legacy_patterns().values() for key in client.scan_iter(match=pattern)] == []
    assert sum(migrate(client, k).moved.values()) == 0  # a second run finds nothing


def test_migrate_keys_cli_on_a_standalone_server(redis_url, redis_client, capsys):
    from transfer_agent.cli.main import main

    k = Keys("s-migrate")
    redis_client.sadd(k.prefix + "seen:scope", "/d/a")
    redis_client.xadd(k.prefix + "history", {"row": "r"})
    assert main(["redis", "migrate-keys", "--redis", redis_url, "--namespace", k.namespace, "--dry-run"]) == 0
    assert "2 old key(s) to migrate" in capsys.readouterr().out and redis_client.exists(k.prefix + "history")
    assert main(["redis", "migrate-keys", "--redis", redis_url, "--namespace", k.namespace]) == 0
    out = capsys.readouterr().out
    assert "seen: moved 1 key(s), 1 entry" in out and "history: moved 1 key(s), 1 entry" in out
    assert redis_client.smembers(k.seen("scope")) == {"/d/a"} and redis_client.xlen(k.history()) == 1
    assert not redis_client.exists(k.prefix + "seen:scope", k.prefix + "history")


# ------------------------------------------------------------------------------------------------ failover
@pytest.mark.serial  # a race against the clock: the failover (~2 s) must end inside a ~5 s paced transfer
def test_master_killed_during_a_running_transfer_loses_no_job_and_no_file_record(rc, client, tmp_path):
    from transfer_agent.daemon.worker import Agent

    k = Keys("c-failover")
    secret = write_secret(tmp_path / "secret")
    src = make_files(tmp_path / "src", {f"run/f{i:02d}.dat": 600_000 + i for i in range(12)}, seed=28)
    rx = start_receiver(tmp_path / "dst", secret, cls=PacedReceiver, rate=1.5 * MB)  # ~5 s of data
    agent = Agent(rc.url + "?wait_replicas=1&wait_timeout_ms=1000", policy=authkit.policy(secret), name="survivor",
                  keys=k, block_ms=200, poll_interval=0.1, flush_interval=0.05, heartbeat_ttl=5)
    th = threading.Thread(target=agent.run, daemon=True)
    th.start()
    store = JobStore(client, keys=k, signer=authkit.signer())
    try:
        spec = TransferSpec(sources=[str(src)], destination=f"fstream://127.0.0.1:{rx.port}/out", tuner="fixed",
                            cc=2, p=1, pp=1)
        job_id, _ = store.submit(spec)
        wait_until(lambda: any(e["kind"] == "file" for _, e in store.events(job_id, count=1000)), 20,
                   "the first file committed")
        t0 = time.monotonic()
        old, _new = rc.failover(k.jobs_stream())  # SIGKILL the master of the namespace slot, wait for its replica
        took = time.monotonic() - t0
        landed = sum(1 for p in (tmp_path / "dst" / "out").rglob("*.dat"))
        assert store.get(job_id).state == "running" and landed < 12, "the failover must happen mid-transfer"
        rc.restart(old)  # replaced, as operations would: the new master has a replica to wait for again
        job = store.wait(job_id, 60)
        assert job.state == "succeeded", job.error
        assert trees_identical(src, tmp_path / "dst" / "out")
        files = {e["path"] for _, e in store.all_events(job_id) if e["kind"] == "file" and e["status"] == "committed"}
        assert len(files) == 12, sorted(files)  # every landed file has its record
        assert job.result["verified_files"] == 12 and job.result["failed_files"] == 0
        assert client.xpending(k.jobs_stream(), k.jobs_group())["pending"] == 0  # acknowledged, nothing left behind
        assert [j.job_id for j in store.list()] == [job_id]
        assert agent._store.replication["acknowledged"] >= 3  # claim, events, finish waited for a replica
        print(f"failover took {took:.1f} s with {landed} of 12 files landed; agent counters {dict(agent.counters)}; "
              f"job writes {dict(agent._store.replication)}")
    finally:
        agent.stop()
        th.join(30)
        rx.stop()
        for node in rc.nodes:
            if not node.alive():
                rc.restart(node)


class _Quick:
    """A transfer that lands one file at once (the idle agent's test is about its Redis loops, not data)."""

    ok = True

    def __init__(self, spec: TransferSpec, **kw: object) -> None:
        self.on_event = kw["on_event"]

    def run(self) -> _Quick:
        self.on_event("file", {"path": "a", "size": 1, "status": "committed", "reason": ""})
        return self

    def to_dict(self) -> dict:
        return {"files": 1, "bytes": 1, "verified_files": 1, "skipped_files": 0, "failed_files": 0, "failures": []}


def test_an_idle_agent_keeps_consuming_across_a_failover(rc, client):
    """The agent's blocking read and heartbeat lose their master and follow the promoted replica."""
    from transfer_agent.daemon.worker import Agent

    k = Keys("c-idle")
    agent = Agent(rc.url, policy=authkit.policy(authkit.key_file()), name="idler", keys=k, block_ms=200,
                  poll_interval=0.1, flush_interval=0.05, heartbeat_ttl=5, transfer_factory=_Quick)
    th = threading.Thread(target=agent.run, daemon=True)
    th.start()
    store = JobStore(client, keys=k, signer=authkit.signer())
    old = None
    try:
        first, _ = store.submit(TransferSpec(sources=["/data/1"], destination="fstream://dtn:9/x"))
        assert store.wait(first, 20).state == "succeeded"  # consuming, then idle in XREADGROUP BLOCK
        old, _new = rc.failover(k.jobs_stream())
        second, _ = store.submit(TransferSpec(sources=["/data/2"], destination="fstream://dtn:9/x"))
        job = store.wait(second, 30)
        assert job.state == "succeeded" and job.worker == "idler" and th.is_alive()
        print(f"idle agent across the failover: {dict(agent.counters)}")
    finally:
        agent.stop()
        th.join(30)
        if old is not None:
            rc.restart(old)


def test_a_file_event_emitted_while_redis_is_down_is_published_once_it_is_back(tmp_path):
    """The fix the failover test found: a publish that failed dropped the events it had taken (6 of 12 landed
    files had no ``file`` event after a failover); now they stay buffered. A standalone Redis, killed mid-job."""
    from fstream_provider.bus.embedded import RedisServer
    from transfer_agent.daemon.worker import Agent

    down, back = threading.Event(), threading.Event()

    class Gated(_Quick):
        def run(self) -> Gated:
            self.on_event("file", {"path": "before", "size": 1, "status": "committed", "reason": ""})
            down.wait(30)
            self.on_event("file", {"path": "during", "size": 1, "status": "committed", "reason": ""})
            back.wait(30)
            return self

    k = Keys("outage")
    server = RedisServer(str(tmp_path / "redis"), appendonly=True).start()
    agent = Agent(server.url, policy=authkit.policy(authkit.key_file()), name="steady", keys=k, block_ms=100,
                  poll_interval=0.1, flush_interval=0.05, transfer_factory=Gated)
    th = threading.Thread(target=agent.run, daemon=True)
    th.start()
    client = connect(server.url)
    store = JobStore(client, keys=k, signer=authkit.signer())
    try:
        job_id, _ = store.submit(TransferSpec(sources=["/data/x"], destination="fstream://dtn:9/x"))
        wait_until(lambda: any(e["kind"] == "file" for _, e in store.events(job_id)), 20, "the first file event")
        server.kill()  # AOF appendfsync always: what Redis acknowledged survives
        down.set()
        wait_until(lambda: agent.counters["publish_errors"] >= 1, 30, "a publish failing while Redis is down")
        server.start()
        back.set()
        job = store.wait(job_id, 30)
        assert job.state == "succeeded"
        files = [e["path"] for _, e in store.all_events(job_id) if e["kind"] == "file"]
        assert "before" in files and "during" in files, files
    finally:
        down.set()
        back.set()
        agent.stop()
        th.join(30)
        client.close()
        server.stop()


def test_a_pending_batch_is_redelivered_with_its_batch_id_after_its_masters_failover(rc):
    k = Keys("c-redeliver")
    files = [FileStat(f"/data/run9/img_{i:04d}.h5", 1000 + i, 1.0) for i in range(5)]

    async def claim() -> str:
        ac = connect_async(rc.url)
        try:
            batches = PendingBatches(ac, k.seen("beamline"), k.pending("beamline"))
            assert await batches.aclaim(files) == files
            return batches.last_batch_id
        finally:
            await ac.aclose()

    async def redeliver() -> tuple[str, list[FileStat]] | None:
        ac = connect_async(rc.url)  # a new triggerer after the failover
        try:
            batches = PendingBatches(ac, k.seen("beamline"), k.pending("beamline"))
            assert await batches.aunseen(files) == []  # the claim survived: nobody reports these files again
            return await batches.take_redeliverable(0.0)
        finally:
            await ac.aclose()

    batch_id = asyncio.run(claim())
    old, _new = rc.failover(k.pending("beamline"))  # killed before any ack
    try:
        assert asyncio.run(redeliver()) == (batch_id, files)
    finally:
        rc.restart(old)
