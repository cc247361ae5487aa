"""Tenants that cannot touch each other (issue 40, attacks 1, 2, 3, 8 and 9's second half), as an attacker would:
real Redis ACL users made from the project's own rules (``bus.acl.acl_rules``: one submitter user per submitter id,
an agent user), on a real redis-server, and the agent's own code paths.

Each attack below worked with issue 32's rules (one ``submitter`` user for every tenant, ``%RW~{N}:job:*``): B
wrote A's job hash and events, pointed A's idempotency key at B's job, cancelled A's job, emptied the job index,
silenced A's sensors, and read A's specs; a forged jobs-stream entry fenced out A's running job; a finished job
flipped back to ``queued`` was run again by ``fstream reconcile --repair``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from fstream_provider.bus.acl import acl_rules
from fstream_provider.bus.audit import AuditLog, first_use, job_nonce, mark_ended
from fstream_provider.bus.client import connect
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.reconcile import reconcile
from fstream_provider.authz.signing import Signer
from fstream_provider.model.spec import TransferSpec

NS = "tenants"
K = Keys(NS)
NOPERM = redis.exceptions.NoPermissionError
A, B = Signer.generate("tenant-a"), Signer.generate("tenant-b")


def _spec(name: str = "x") -> TransferSpec:
    return TransferSpec(sources=[f"/data/{name}"], destination="fstream://127.0.0.1:9/out")


def _denied(call, *args, **kwargs) -> None:
    with pytest.raises(NOPERM):
        call(*args, **kwargs)


@pytest.fixture
def users(redis_server, redis_client) -> Iterator[dict[str, redis.Redis]]:
    """ACL users on the test's real redis-server: ``a`` and ``b`` (submitters tenant-a and tenant-b), ``agent``;
    each a client of its own. Removed (and the namespace's keys deleted) afterwards."""
    version = redis_client.info("server")["redis_version"]
    made = {"a": ("submitter", "tenant-a"), "b": ("submitter", "tenant-b"), "agent": ("agent", None)}
    clients = {}
    for name, (role, submitter) in made.items():
        user = f"iso-{name}"
        redis_client.execute_command("ACL", "SETUSER", user, *acl_rules(role, NS, version, submitter=submitter),
                                     f">pw-{user}-0123456789")
        host, port = redis_server.url.split("//")[1].split("/")[0].split(":")
        clients[name] = connect(f"redis://{user}:pw-{user}-0123456789@{host}:{port}/0", retries=0)
    try:
        yield clients
    finally:
        for c in clients.values():
            c.close()
        for name in made:
            redis_client.execute_command("ACL", "DELUSER", f"iso-{name}")
        for key in list(redis_client.scan_iter(match="*tenants*", count=1000)):
            redis_client.delete(key)


def _take(agent: redis.Redis, consumer: str) -> tuple[str, dict]:
    """What an agent's intake does: the next entry for this consumer of the agents' group."""
    resp = agent.xreadgroup(K.jobs_group(), consumer, {K.jobs_stream(): ">"}, count=1, block=2000)
    (_stream, [(entry_id, fields)]), = resp
    return entry_id, fields


# ------------------------------------------------------------------------------------------------- attack 1, 9
def test_b_can_neither_fake_nor_read_a_job_of_a(users):
    a_store, b = JobStore(users["a"], keys=K, signer=A), users["b"]
    job_id, _ = a_store.submit(_spec())
    assert job_id.startswith("tenant-a:")
    _denied(b.hset, K.job(job_id), mapping={"state": "succeeded", "result": '{"landed_files": ["/x"]}'})
    _denied(b.xadd, K.job_events(job_id), {"kind": "done", "ts": "0", "data": '{"state": "succeeded"}'})
    _denied(b.eval, "return redis.call('HSET', KEYS[1], 'state', 'succeeded')", 1, K.job(job_id))
    _denied(b.hgetall, K.job(job_id))  # its spec and its signature (attack 9)
    _denied(b.xrange, K.job_events(job_id))
    _denied(JobStore(b, keys=K, signer=B).get, job_id)
    state = a_store.get(job_id)
    assert state.state == "queued" and state.result is None and a_store.events(job_id)[-1][1]["kind"] == "queued"


# --------------------------------------------------------------------------------------------------- attack 2
def test_b_cannot_point_a_idempotency_key_at_its_own_job(users):
    a_store, b_store = JobStore(users["a"], keys=K, signer=A), JobStore(users["b"], keys=K, signer=B)
    airflow_key = "daily/scheduled__2026-11-29T00:00:00+00:00/transfer/-1"  # predictable for a scheduled run
    b_job, _ = b_store.submit(_spec("fake"), idempotency_key=airflow_key)
    assert b_job.startswith("tenant-b:")
    _denied(users["b"].set, K.idempotency(Keys.owned("tenant-a", airflow_key)), b_job)
    _denied(users["b"].set, K.idempotency(airflow_key), b_job)  # a key of no submitter's: agents' only
    a_job, created = a_store.submit(_spec(), idempotency_key=airflow_key)
    assert created and a_job.startswith("tenant-a:") and a_job != b_job
    assert a_store.submit(_spec(), idempotency_key=airflow_key) == (a_job, False)


# --------------------------------------------------------------------------------------------------- attack 3
def test_b_cannot_cancel_hide_or_silence_what_a_owns(users):
    a_store, b = JobStore(users["a"], keys=K, signer=A), users["b"]
    job_id, _ = a_store.submit(_spec())
    _denied(JobStore(b, keys=K, signer=B).cancel, job_id)
    _denied(b.publish, K.cancel_channel(job_id), "cancel")
    _denied(b.zremrangebyscore, K.job_index(), "-inf", "+inf")
    _denied(b.zremrangebyscore, K.job_index_of("tenant-a"), "-inf", "+inf")
    scope = Keys.owned("tenant-a", "lcls.sensor")
    _denied(b.sadd, K.seen(scope), "/data/run1.xtc")
    _denied(b.hset, K.pending(scope), "batch", "{}")
    _denied(b.set, K.looks(scope), "{}")
    assert a_store.get(job_id).state == "queued" and not a_store.get(job_id).cancel_requested
    assert [j.job_id for j in a_store.list()] == [job_id]
    assert users["a"].sadd(K.seen(scope), "/data/run0.xtc") == 1  # A's own scope stays A's to keep


def test_a_forged_jobs_stream_entry_neither_fences_out_nor_refuses_the_job(users, redis_url, tmp_path):
    """B adds an entry naming A's running job (B may XADD to the stream and read A's job id there): the agent
    that reads it acknowledges it and nothing else, audits it without blaming A; A's job keeps its attempt."""
    from transfer_agent.daemon.authorize import AgentPolicy
    from transfer_agent.daemon.worker import Agent

    a_store, agent = JobStore(users["a"], keys=K, signer=A), users["agent"]
    job_id, _ = a_store.submit(_spec())
    store = JobStore(agent, keys=K)
    store.ensure_group()
    entry_id, fields = _take(agent, "agent-1")
    claim = store.claim(fields["job_id"], entry_id, worker="agent-1", max_deliveries=5)
    assert claim.outcome == "claimed" and claim.attempt == 1

    seen = [e for e, f in users["b"].xrange(K.jobs_stream()) if f.get("job_id") == job_id]  # B reads the stream
    assert seen == [entry_id]
    forged = users["b"].xadd(K.jobs_stream(), {"job_id": job_id})
    forged_id, forged_fields = _take(agent, "agent-2")
    assert forged_id == forged
    again = store.claim(job_id, forged_id, worker="agent-2", max_deliveries=5)
    assert (again.outcome, again.message) == ("foreign", entry_id)
    job = store.get(job_id)
    assert (job.state, job.attempt, job.worker, job.deliveries) == ("running", 1, "agent-1", 1)
    assert agent.xpending(K.jobs_stream(), K.jobs_group())["pending"] == 1  # the forged one acknowledged

    # a real agent (its own ACL user) reading a second forged entry
    url = redis_url.replace("redis://", "redis://iso-agent:pw-iso-agent-0123456789@")
    a2 = Agent(url, name="agent-2", policy=AgentPolicy.local([str(tmp_path)], None), keys=K, block_ms=100)
    forged2 = users["b"].xadd(K.jobs_stream(), {"job_id": job_id})
    a2.run(once=True)
    assert store.get(job_id).attempt == 1 and a2.counters["entries_foreign"] == 1
    [entry] = AuditLog(agent, K).entries(job_id=job_id, count=5)
    assert entry["decision"] == "ignored" and entry["submitter"] == "" and forged2 in entry["reason"]


# --------------------------------------------------------------------------------------------------- attack 8
def test_repair_never_reruns_a_job_whose_state_changed_after_an_agent_ended_it(users):
    a_store, agent = JobStore(users["a"], keys=K, signer=A), users["agent"]
    job_id, _ = a_store.submit(_spec())
    store = JobStore(agent, keys=K)
    store.ensure_group()
    entry_id, _fields = _take(agent, "agent-1")
    claim = store.claim(job_id, entry_id, worker="agent-1", max_deliveries=5)
    binding = f"{job_id} {entry_id}"
    submitter, nonce = job_nonce(claim.auth)
    assert first_use(agent, K, submitter, nonce, binding, 3600) == ("first", "")  # the agent's decision
    assert store.finish(job_id, claim.attempt, entry_id, state="succeeded", result={"files": 1})
    assert mark_ended(agent, K, claim.auth, binding, "succeeded")  # as the runner does after finish
    store.trim_acked()

    # the job's hash is its submitter's to write: flip it back, as issue 40 did with another tenant's
    users["a"].hset(K.job(job_id), mapping={"state": "queued", "worker": "", "stream_id": "0-1"})
    report = reconcile(store, repair=True)
    [finding] = [f for f in report.findings if f.job_id == job_id]
    assert finding.kind == "changed-after-end" and finding.repaired is None and "succeeded" in finding.detail
    assert not [f for _e, f in agent.xrange(K.jobs_stream()) if f.get("job_id") == job_id]  # not re-enqueued
    # and whoever adds an entry for it by hand: the agent's replay guard refuses the second run
    assert first_use(agent, K, submitter, nonce, f"{job_id} 99-0", 3600)[0] == "replay"
    assert agent.get(K.nonce(submitter, nonce)) == f"{binding} ended:succeeded"
    assert agent.ttl(K.nonce(submitter, nonce)) > 0


def test_fstream_seen_finds_a_scope_under_its_submitter(users, redis_url, capsys):
    """A connection with a submitter keeps its scopes under the submitter's id: ``fstream seen --submitter``."""
    from transfer_agent.cli.main import main

    users["a"].sadd(K.seen(Keys.owned("tenant-a", "beamline")), "/data/run7.xtc")
    assert main(["seen", "list", "--scope", "beamline", "--submitter", "tenant-a", "--redis", redis_url,
                 "--namespace", NS]) == 0
    assert "seen     /data/run7.xtc" in capsys.readouterr().out
    assert main(["seen", "list", "--scope", "beamline", "--redis", redis_url, "--namespace", NS]) == 0
    assert "/data/run7.xtc" not in capsys.readouterr().out  # the scope of no submitter is another one
