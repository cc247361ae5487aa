"""Job-level fault rows (issue 8): Redis SIGKILL + AOF restart, duplicate delivery, stream trimmed / Redis flushed.

Real ``redis-server``, real agents (in-process ``Agent`` threads and ``python -m transfer_agent.cli agent``),
real receivers on loopback. After each case: every visible destination file matches the source, no temps,
every job done (verified) / failed with a reason / resumable (``jobkit.check_*``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from fstream_provider.bus.client import connect
from fstream_provider.bus.embedded import RedisServer
from fstream_provider.bus.job_state import JobLostError
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.reconcile import reconcile
from jobkit import (DEADLINE, agent_thread, check_destination, check_jobs, cli_agent, dataset, files_of, kinds,
                    poll, spec_for, start_counting_receiver, stop_process)
from transfer_agent.daemon.worker import Agent
import authkit



@pytest.fixture
def keys() -> Keys:
    return Keys("faults")


def _agent(url: str, name: str, keys: Keys, secret, **kw) -> Agent:
    opts = dict(keys=keys, secret_file=str(secret), block_ms=100, poll_interval=0.1, flush_interval=0.05,
                heartbeat_ttl=2, claim_idle_ms=300, retry_base_s=0.2, retry_cap_s=1.0)
    opts.update(kw)
    return Agent(url, policy=authkit.policy(), name=name, **opts)


# -- row: Redis SIGKILL + restart from AOF ------------------------------------------------------------
def test_redis_sigkill_mid_job_agent_rides_out_the_outage_and_records_the_job_once(tmp_path, secret, keys):
    """Redis dies (SIGKILL) while a transfer runs; the transfer finishes during the outage; Redis restarts
    from its AOF (``appendfsync always``): the agent reconnects, records the outcome with the attempt it
    claimed (no second run, no file committed twice, nothing lost) and keeps serving jobs."""
    server = RedisServer(str(tmp_path / "redis"), appendonly=True).start()
    src = dataset(tmp_path / "src")
    rcv = start_counting_receiver(tmp_path / "dst", secret, hold_attempt=1, hold_after=1 << 20)
    client = connect(server.url, retries=1)
    store = JobStore(client, keys=keys, signer=authkit.signer())
    agent = _agent(server.url, "steady", keys, secret)
    th = None
    try:
        job_id, _ = store.submit(spec_for(src, rcv.port))
        th = agent_thread(agent)
        assert rcv.reached.wait(DEADLINE), "the transfer never reached the gate"
        assert store.get(job_id).state == "running"
        server.kill()  # SIGKILL: no shutdown, no final AOF rewrite
        rcv.gate.set()  # the transfer goes on and finishes while Redis is down
        poll(lambda: len(rcv.commits) == len(files_of(src)), "every file to commit while Redis is down",
             diag=lambda: str(agent.counters))
        poll(lambda: agent._current is None or agent.counters["redis_outage_retries"] >= 1,
             "the transfer to return to the agent")
        assert th.is_alive(), "the agent died with Redis"
        server.start()  # same port, same AOF directory
        job = store.wait(job_id, DEADLINE)
        assert job.state == "succeeded", job.error
        assert job.attempt == 1 and job.deliveries == 1, "the finished transfer was run again"
        assert kinds(store, job_id).count("done") == 1
        assert set(rcv.commits) == {f"out/{n}" for n in files_of(src)}
        assert all(n == 1 for n in rcv.commits.values()), f"a file was committed twice: {rcv.commits}"
        check_destination(src, tmp_path / "dst" / "out", complete=True)
        check_jobs(store, [job_id])
        assert client.xpending(keys.jobs_stream(), keys.jobs_group())["pending"] == 0
        # the agent survived: it runs the next job on the restarted Redis
        job2, _ = store.submit(spec_for(src, rcv.port, dest="again"))
        assert store.wait(job2, DEADLINE).state == "succeeded"
        check_destination(src, tmp_path / "dst" / "again", complete=True)
    finally:
        rcv.gate.set()
        agent.stop()
        if th is not None:
            th.join(DEADLINE)
        client.close()
        rcv.stop()
        server.stop()
    assert th is not None and not th.is_alive()


def test_redis_restart_from_aof_keeps_every_acknowledged_job(tmp_path, keys):
    """Everything Redis acknowledged before a SIGKILL is there after the restart (AOF ``always``):
    queued jobs, their entries, the consumer group and the pending list."""
    server = RedisServer(str(tmp_path / "redis"), appendonly=True).start()
    client = connect(server.url, retries=1)
    try:
        store = JobStore(client, keys=keys, signer=authkit.signer())
        spec = spec_for(tmp_path, 1)
        ids = [store.submit(spec, idempotency_key=f"k{i}")[0] for i in range(20)]
        (entry, fields), = client.xreadgroup(keys.jobs_group(), "a", {keys.jobs_stream(): ">"}, count=1)[0][1]
        assert store.claim(fields["job_id"], entry, worker="a", max_deliveries=5).outcome == "claimed"
        assert client.config_get("appendfsync")["appendfsync"] == "always"
        server.kill()
        server.start()
        assert [store.get(i).state for i in ids].count("queued") == 19
        assert store.get(fields["job_id"]).state == "running" and store.get(fields["job_id"]).attempt == 1
        assert client.xlen(keys.jobs_stream()) == 20
        assert client.xpending(keys.jobs_stream(), keys.jobs_group())["pending"] == 1
        assert store.submit(spec, idempotency_key="k3")[0] == ids[3]
        # the claimer "a" never had a heartbeat: reconcile says so; nothing else is amiss
        assert [(f.kind, f.job_id) for f in reconcile(store).findings] == [("owner-gone", fields["job_id"])]
    finally:
        client.close()
        server.stop()


# -- row: duplicate delivery (owner SIGSTOP, job reclaimed, owner SIGCONT) -------------------------------
def test_duplicate_delivery_exactly_one_commit_and_the_stale_attempt_is_fenced(tmp_path, redis_url, redis_client,
                                                                              secret, keys):
    src = dataset(tmp_path / "src", small=16, big=4 << 20)
    rcv = start_counting_receiver(tmp_path / "dst", secret, hold_attempt=1, hold_after=256 << 10)
    store = JobStore(redis_client, keys=keys, signer=authkit.signer())
    job_id, _ = store.submit(spec_for(src, rcv.port, p=2, pp=4))
    log = tmp_path / "owner.log"
    owner = cli_agent(redis_url, "owner", keys, secret, log, "--heartbeat-ttl", "1s", "--claim-idle", "30s", port=rcv.port)
    rescuer = _agent(redis_url, "rescuer", keys, secret, max_retries=8)
    th = None
    try:
        assert rcv.reached.wait(DEADLINE), log.read_text()[-3000:]
        assert store.get(job_id).worker == "owner"
        os.kill(owner.pid, signal.SIGSTOP)  # frozen mid-transfer: heartbeat expires, the entry goes idle
        poll(lambda: not redis_client.exists(keys.agent("owner")), "the owner's heartbeat to expire")
        th = agent_thread(rescuer)
        poll(lambda: (store.get(job_id).attempt == 2), "the rescuer to reclaim the job")
        assert rescuer.counters["reclaimed"] == 1
        os.kill(owner.pid, signal.SIGCONT)  # the stale owner wakes up and carries on with attempt 1
        rcv.gate.set()
        job = store.wait(job_id, DEADLINE)
        assert job.state == "succeeded", job.error
        assert job.worker == "rescuer" and job.attempt == 2
        poll(lambda: "another agent took it over" in log.read_text() or "superseded" in log.read_text(),
             "the owner to notice it was fenced", diag=lambda: log.read_text()[-3000:])
    finally:
        rcv.gate.set()
        stop_process(owner)
        rescuer.stop()
        if th is not None:
            th.join(DEADLINE)
        rcv.stop()
    evs = store.events(job_id, count=100_000)
    assert [(e["worker"], e["attempt"]) for _, e in evs if e["kind"] == "claimed"] == [("owner", 1), ("rescuer", 2)]
    assert [e["kind"] for _, e in evs].count("done") == 1
    assert set(rcv.commits) == {f"out/{n}" for n in files_of(src)} and all(n == 1 for n in rcv.commits.values()), rcv.commits
    # the stale attempt's writes are refused by the fence in Redis, whatever it tries now
    assert store.finish(job_id, 1, "0-0", state="failed", error="stale") is False
    assert store.get(job_id).state == "succeeded"
    check_destination(src, tmp_path / "dst" / "out", complete=True)
    check_jobs(store, [job_id])
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


# -- row: job stream trimmed ------------------------------------------------------------------------------
def _reconcile_cli(redis_url: str, keys: Keys, *extra: str) -> tuple[int, dict]:
    p = subprocess.run([sys.executable, "-m", "transfer_agent.cli", "reconcile", "--redis", redis_url,
                        "--namespace", keys.namespace, "--json", *extra], capture_output=True, text=True,
                       timeout=60)
    assert p.stdout.strip(), p.stderr[-3000:]
    return p.returncode, json.loads(p.stdout.strip().splitlines()[-1])


def test_trimmed_stream_jobs_are_reported_and_repaired_not_lost(tmp_path, redis_url, redis_client, secret, keys):
    src = dataset(tmp_path / "src", small=4, big=0)
    rcv = start_counting_receiver(tmp_path / "dst", secret)
    store = JobStore(redis_client, keys=keys, signer=authkit.signer())
    ids = [store.submit(spec_for(src, rcv.port, dest=f"d{i}"))[0] for i in range(3)]
    redis_client.xtrim(keys.jobs_stream(), maxlen=0, approximate=False)  # an operator "cleans up" the stream
    agent = _agent(redis_url, "a", keys, secret)
    try:
        agent.run(once=True)
        assert [store.get(i).state for i in ids] == ["queued"] * 3  # nobody can see them any more
        rc, rep = _reconcile_cli(redis_url, keys)
        assert rc == 1
        assert sorted(f["job_id"] for f in rep["findings"] if f["kind"] == "no-stream-entry") == sorted(ids)
        assert all(f["resumable"] and f["repaired"] is None for f in rep["findings"])
        rc, rep = _reconcile_cli(redis_url, keys, "--repair")
        assert rc == 0 and all(f["repaired"].startswith("re-enqueued") for f in rep["findings"]), rep
        assert all("requeued" in kinds(store, i) for i in ids)
        for _ in ids:
            agent.run(once=True)
        states = check_jobs(store, ids)
        assert set(states.values()) == {"succeeded"}
        for i in range(3):
            check_destination(src, tmp_path / "dst" / f"d{i}", complete=True)
        assert reconcile(store).findings == []
        rc, rep = _reconcile_cli(redis_url, keys)
        assert rc == 0 and rep["findings"] == []
    finally:
        agent.stop()
        rcv.stop()


def test_reconcile_reports_each_kind_of_orphan(tmp_path, redis_client, keys):
    store = JobStore(redis_client, keys=keys, signer=authkit.signer())
    spec = spec_for(tmp_path, 1)
    queued, _ = store.submit(spec, idempotency_key="q")
    dead_owner, _ = store.submit(spec)
    lost, _ = store.submit(spec, idempotency_key="lost")
    stream, group = keys.jobs_stream(), keys.jobs_group()
    for eid, fields in redis_client.xreadgroup(group, "ghost", {stream: ">"}, count=10)[0][1]:
        if fields["job_id"] == dead_owner:
            assert store.claim(dead_owner, eid, worker="ghost", max_deliveries=5).outcome == "claimed"
    redis_client.delete(keys.job(lost))  # its state is lost; entry, index entry and idempotency key remain
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / ".x.dat.0123456789abcdef.1.part").write_bytes(b"abc")
    (tmp_path / "dst" / ".x.dat.0123456789abcdef.1.part.meta").write_text(json.dumps({"ranges": [[0, 3]]}))
    rep = reconcile(store, dest_root=str(tmp_path / "dst"))
    by = {(f.kind, f.job_id) for f in rep.findings}
    assert ("owner-gone", dead_owner) in by and ("no-state", lost) in by
    assert ("dangling-idempotency", lost) in by and ("parts-without-state", "0123456789abcdef") in by
    assert not any(f.job_id == queued for f in rep.findings)  # queued with its entry: healthy
    text = "\n".join(rep.lines())
    assert "ghost" in text and "3 bytes" in text
    rep = reconcile(store, repair=True)
    assert redis_client.get(keys.idempotency("lost")) is None
    assert store.submit(spec, idempotency_key="lost")[1] is True  # a resubmit makes a new job
    assert any(d[1]["job_id"] == lost for d in store.dead_letters())
    left = reconcile(store)
    assert {f.kind for f in left.findings} == {"owner-gone"}  # only what the agents' reclaim resolves


# -- row: Redis flushed -----------------------------------------------------------------------------------
def test_flushall_mid_job_waiters_fail_clearly_agent_survives_and_a_resubmit_finishes(tmp_path, redis_url,
                                                                                    redis_client, secret, keys):
    src = dataset(tmp_path / "src", small=6, big=4 << 20)
    rcv = start_counting_receiver(tmp_path / "dst", secret, hold_attempt=1, hold_after=1 << 20)
    store = JobStore(redis_client, keys=keys, signer=authkit.signer())
    agent = _agent(redis_url, "a", keys, secret)
    job_id, _ = store.submit(spec_for(src, rcv.port))
    th = agent_thread(agent)
    waited: list[BaseException | object] = []

    def waiter() -> None:
        try:
            waited.append(JobStore(connect(redis_url), keys=keys, signer=authkit.signer()).wait(job_id, 120))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            waited.append(exc)

    w = threading.Thread(target=waiter, daemon=True)
    try:
        w.start()
        assert rcv.reached.wait(DEADLINE)
        redis_client.flushall()
        w.join(DEADLINE)  # before the fix: waits the full 120 s, then returns a stale "running" state
        assert not w.is_alive(), "JobStore.wait kept waiting on a job whose state vanished"
        assert isinstance(waited[0], JobLostError) and job_id in str(waited[0]) and "vanished" in str(waited[0])
        poll(lambda: agent.counters["vanished"] >= 1, "the agent to notice the job vanished",
             diag=lambda: str(agent.counters))
        rcv.gate.set()
        poll(lambda: agent._current is None, "the agent to drop the vanished job")
        assert th.is_alive()
        # what is left is visible: the parts at the destination, of a job Redis no longer knows
        rep = reconcile(store, dest_root=str(tmp_path / "dst"))
        assert [f.kind for f in rep.findings] == ["parts-without-state"] and rep.findings[0].job_id == job_id
        check_destination(src, tmp_path / "dst" / "out", complete=False, parts_ok=True)  # nothing torn visible
        # the same transfer submitted again (as an Airflow retry would) resumes the parts and finishes
        again, _ = store.submit(spec_for(src, rcv.port))
        job = store.wait(again, DEADLINE)
        assert job.state == "succeeded", job.error
    finally:
        rcv.gate.set()
        agent.stop()
        th.join(DEADLINE)
        rcv.stop()
    assert not th.is_alive()
    assert all(n == 1 for n in rcv.commits.values()), rcv.commits
    check_destination(src, tmp_path / "dst" / "out", complete=True)
    check_jobs(store, [again])
    assert reconcile(store, dest_root=str(tmp_path / "dst")).findings == []
