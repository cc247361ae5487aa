"""JobStore on a real redis-server: idempotent submit, events, cancel, wait, list, safe trimming of the jobs stream."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from fstream_provider.bus.job_state import TERMINAL_STATES, JobState, decode_event
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.model.spec import TransferSpec
import authkit


@pytest.fixture
def store(redis_client: Any) -> JobStore:
    return JobStore(redis_client, keys=Keys("tj"), signer=authkit.signer())


@pytest.fixture
def spec() -> TransferSpec:
    return TransferSpec(sources=["/data/run1"], destination="fstream://127.0.0.1:9000/dst", tuner="fixed", cc=2,
                        label="run1")


def test_a_job_stored_by_an_older_version_still_reads(store, spec):
    """Specs on Redis written before priority_class came back (issue #11), and with it, load: the class
    they name is the one the scheduler reads; a spec without one is interactive."""
    import json

    job_id, _ = store.submit(spec)
    data = json.loads(spec.to_json())
    without = {k: v for k, v in data.items() if k != "priority_class"}
    store.client.hset(store.keys.job(job_id), mapping={"spec": json.dumps(without)})
    assert store.get(job_id).spec == spec and spec.priority_class == "interactive"
    store.client.hset(store.keys.job(job_id), mapping={"spec": json.dumps({**data, "priority_class": "batch"})})
    assert store.get(job_id).spec.priority_class == "batch"
    with pytest.raises(ValueError, match="priority_class 'urgent': must be one of interactive, batch"):
        TransferSpec(**{**data, "priority_class": "urgent"})


def _take(store: JobStore, consumer: str = "w") -> tuple[str, str]:
    k = store.keys
    (entry_id, fields), = store.client.xreadgroup(k.jobs_group(), consumer, {k.jobs_stream(): ">"}, count=1)[0][1]
    return entry_id, fields["job_id"]


def test_submit_creates_queued_job_with_spec_roundtrip(store, spec):
    job_id, created = store.submit(spec)
    assert created and job_id.startswith("tests:") and len(job_id.partition(":")[2]) == 16  # <submitter>:<hex>
    job = store.get(job_id)
    assert isinstance(job, JobState)
    assert job.state == "queued" and job.attempt == 0 and job.deliveries == 0 and job.worker is None
    assert job.spec == spec and job.spec.priority_class == "interactive"
    assert job.error is None and job.result is None and not job.terminal
    assert store.client.ttl(store.keys.job(job_id)) == -1  # no expiry while live
    evs = store.events(job_id)
    assert [e["kind"] for _, e in evs] == ["queued"] and evs[0][1]["label"] == "run1"


def test_same_idempotency_key_returns_same_job(store, spec):
    a, created_a = store.submit(spec, idempotency_key="dag1/task1/2026-01-01")
    b, created_b = store.submit(spec, idempotency_key="dag1/task1/2026-01-01")
    c, created_c = store.submit(spec, idempotency_key="dag1/task1/2026-01-02")
    assert a == b and c != a
    assert (created_a, created_b, created_c) == (True, False, True)
    assert store.client.xlen(store.keys.jobs_stream()) == 2  # the duplicate queued nothing
    assert store.get(a).idempotency_key == "dag1/task1/2026-01-01"


def test_concurrent_submits_with_one_key_create_one_job(store, spec, redis_url):
    from fstream_provider.bus.client import connect

    results: list[tuple[str, bool]] = []
    barrier = threading.Barrier(8)

    def submit() -> None:
        client = connect(redis_url)
        try:
            s = JobStore(client, keys=store.keys, signer=authkit.signer())
            barrier.wait()
            results.append(s.submit(spec, idempotency_key="once"))
        finally:
            client.close()

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len({r[0] for r in results}) == 1 and sum(r[1] for r in results) == 1
    assert store.client.xlen(store.keys.jobs_stream()) == 1


def test_get_unknown_job_is_none_and_wait_raises(store):
    assert store.get("0123456789abcdef") is None
    with pytest.raises(KeyError, match="0123456789abcdef"):
        store.wait("0123456789abcdef", 0.1)


def test_events_after_and_blocking_read(store, spec):
    job_id, _ = store.submit(spec)
    first = store.events(job_id)
    last = first[-1][0]
    assert store.events(job_id, after=last) == []
    id1 = store.append_event(job_id, "log", {"message": "hello"})
    got = store.events(job_id, after=last, block_ms=1000)
    assert got == [(id1, {"message": "hello", "kind": "log", "ts": got[0][1]["ts"]})]

    def later() -> None:
        store.append_event(job_id, "tuning", {"reason": "more channels", "layouts": [{"cc": 4}]})

    t = threading.Timer(0.05, later)
    t.start()
    got = store.events(job_id, after=id1, block_ms=5000)  # returns as soon as the event arrives
    t.join()
    assert got[0][1]["kind"] == "tuning" and got[0][1]["layouts"] == [{"cc": 4}]


def test_decode_event_survives_non_json_data():
    assert decode_event("1-0", {"kind": "log", "ts": "1.5", "data": "not json"}) == (
        "1-0", {"raw": "not json", "kind": "log", "ts": 1.5})


def test_cancel_queued_running_and_finished(store, spec):
    queued, _ = store.submit(spec)
    assert store.cancel(queued) is True
    job = store.get(queued)
    assert job.state == "cancelled" and job.cancel_requested and job.error == "cancelled by user"
    assert store.events(queued)[-1][1] == {"state": "cancelled", "error": "cancelled by user", "result": None,
                                           "kind": "done", "ts": store.events(queued)[-1][1]["ts"]}
    assert store.client.ttl(store.keys.job(queued)) > 0

    running, _ = store.submit(spec)
    entry_id, jid = _take(store)
    while jid != running:  # the first entry belongs to the cancelled job: its claim acks it
        assert store.claim(jid, entry_id, worker="w", max_deliveries=5).outcome == "terminal"
        entry_id, jid = _take(store)
    claim = store.claim(running, entry_id, worker="w", max_deliveries=5)
    assert claim.outcome == "claimed"
    assert store.cancel(running, "stop it") is True
    job = store.get(running)
    assert job.state == "running" and job.cancel_requested  # the worker decides when it has stopped
    assert store.publish(running, claim.attempt, []) == (True, True)  # the worker sees the flag
    assert store.finish(running, claim.attempt, entry_id, state="cancelled", error="stop it")
    assert store.get(running).state == "cancelled"
    assert store.cancel(running) is False and store.cancel("ffffffffffffffff") is False


def test_wait_returns_terminal_state_and_times_out_without_raising(store, spec):
    job_id, _ = store.submit(spec)
    t0 = time.monotonic()
    state = store.wait(job_id, 0.2)
    assert state.state == "queued" and time.monotonic() - t0 >= 0.2

    entry_id, _ = _take(store)
    claim = store.claim(job_id, entry_id, worker="w", max_deliveries=5)

    def finish() -> None:
        store.publish(job_id, claim.attempt, [("file", time.time(), {"path": "a", "status": "committed"})])
        store.finish(job_id, claim.attempt, entry_id, state="succeeded", result={"files": 1})

    t = threading.Timer(0.05, finish)
    t.start()
    state = store.wait(job_id, 20)
    t.join()
    assert state.state == "succeeded" and state.result == {"files": 1} and state.state in TERMINAL_STATES
    kinds = [e["kind"] for _, e in store.events(job_id)]
    assert kinds == ["queued", "claimed", "file", "done"]


def test_finish_rejects_non_terminal_state(store, spec):
    job_id, _ = store.submit(spec)
    with pytest.raises(ValueError, match="not terminal"):
        store.finish(job_id, 1, "0-1", state="running")


def test_list_newest_first(store, spec):
    ids = [store.submit(spec)[0] for _ in range(3)]
    listed = [j.job_id for j in store.list(limit=10)]
    assert listed == list(reversed(ids))
    assert len(store.list(limit=2)) == 2


def test_events_stream_is_capped_approximately(redis_client, spec):
    store = JobStore(redis_client, keys=Keys("cap"), events_maxlen=100, signer=authkit.signer())
    job_id, _ = store.submit(spec)
    entry_id, _ = _take(store)
    attempt = store.claim(job_id, entry_id, worker="w", max_deliveries=5).attempt
    for _ in range(10):
        store.publish(job_id, attempt, [("interval", time.time(), {"i": i}) for i in range(100)])
    assert store.client.xlen(store.keys.job_events(job_id)) < 400  # ~100 (node granularity), not 1000


def test_trim_never_removes_unacknowledged_or_undelivered_entries(store, spec):
    k = store.keys
    ids = [store.submit(spec)[0] for _ in range(4)]
    assert store.trim_acked() == 0  # nothing delivered yet
    taken = [_take(store) for _ in range(3)]  # 3 delivered, 1 never delivered
    store.client.xack(k.jobs_stream(), k.jobs_group(), taken[1][0])
    assert store.trim_acked() == 0  # the oldest entry is still pending
    assert store.client.xlen(k.jobs_stream()) == 4
    store.client.xack(k.jobs_stream(), k.jobs_group(), taken[0][0])
    assert store.trim_acked() == 2  # entries 0 and 1: acked; entry 2 pending stays
    remaining = [e[1]["job_id"] for e in store.client.xrange(k.jobs_stream())]
    assert remaining == ids[2:]
    store.client.xack(k.jobs_stream(), k.jobs_group(), taken[2][0])
    assert store.trim_acked() == 1  # entry 3 was never delivered: kept
    assert [e[1]["job_id"] for e in store.client.xrange(k.jobs_stream())] == ids[3:]


# ---------------------------------------------------------------------------------------------------
# The CLI subcommands (transfer_agent.cli.jobs through transfer_agent.cli.main)

def _cli(capsys: Any, *argv: str) -> tuple[int, str, str]:
    from transfer_agent.cli.main import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_submit_detach_status_cancel(capsys, redis_url, tmp_path):
    import json

    ns = ("--redis", redis_url, "--namespace", "cli")
    code, out, err = _cli(capsys, "submit", str(tmp_path), "--to", "fstream://127.0.0.1:9/x", "--tuner", "fixed",
                          "--detach", "--json", "--idempotency-key", "k1", *ns)
    assert code == 0 and "no agent is running" in err
    first = json.loads(out)
    assert first["created"] is True and first["state"] == "queued"
    code, out, _ = _cli(capsys, "submit", str(tmp_path), "--to", "fstream://127.0.0.1:9/x", "--detach",
                        "--idempotency-key", "k1", *ns)
    assert code == 0 and out.strip() == first["job_id"]  # same key, same job

    code, out, _ = _cli(capsys, "status", first["job_id"], "--json", *ns)
    job = json.loads(out)
    assert code == 0 and job["state"] == "queued" and job["spec"]["sources"] == [str(tmp_path)]
    assert job["submitter"] == "local"  # `fstream submit` signs as the local submitter by default
    code, out, _ = _cli(capsys, "status", first["job_id"], *ns)
    assert code == 0 and "local (signed; agents verify)" in out, out
    code, out, _ = _cli(capsys, "status", "--json", *ns)
    assert [j["job_id"] for j in json.loads(out)["jobs"]] == [first["job_id"]]
    code, out, _ = _cli(capsys, "status", *ns)
    assert code == 0 and first["job_id"] in out

    code, out, _ = _cli(capsys, "cancel", first["job_id"], *ns)
    assert code == 0 and "cancelled" in out
    code, _, err = _cli(capsys, "cancel", first["job_id"], *ns)
    assert code == 1 and "already cancelled" in err
    code, _, err = _cli(capsys, "status", "0000000000000000", *ns)
    assert code == 2 and "0000000000000000: not found" in err


def test_cli_submit_follows_until_done_and_exit_status(capsys, redis_url, tmp_path):
    import json
    import os

    from transfer_agent.wire.auth import load_secret
    from transfer_agent.receiving.receiver import Receiver
    from transfer_agent.daemon.worker import Agent

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    for i in range(5):
        (src / f"f{i}").write_bytes(os.urandom(50_000))
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    rcv = Receiver(listen=("127.0.0.1", 0), root=str(dst), secret=load_secret(str(secret))).start()
    import dataclasses

    from fstream_provider.authz.policy import KeyEntry

    bad = tmp_path / "bad"
    bad.write_bytes(os.urandom(32))
    bad.chmod(0o600)
    pol = authkit.policy(secret)
    grant = dataclasses.replace(pol.submitters[authkit.SUBMITTER], keys=frozenset({"default", "bad"}))
    pol = dataclasses.replace(pol, keyring={**pol.keyring, "bad": KeyEntry(secret_file=str(bad))},
                              submitters={authkit.SUBMITTER: grant})
    agent = Agent(redis_url, policy=pol, name="cli-test", keys=Keys("cli2"), block_ms=100)
    th = threading.Thread(target=agent.run, daemon=True)
    th.start()
    try:
        code, out, err = _cli(capsys, "submit", str(src), "--to", f"fstream://127.0.0.1:{rcv.port}/out",
                              "--tuner", "fixed", "--json", "--redis", redis_url, "--namespace", "cli2",
                              "--submitter", authkit.SUBMITTER, "--submitter-key", authkit.key_file())
        assert code == 0, err
        job = json.loads(out)
        assert job["state"] == "succeeded" and job["result"]["verified_files"] == 5
        assert sorted(os.listdir(dst / "out")) == [f"f{i}" for i in range(5)]
        for i in range(5):
            assert (dst / "out" / f"f{i}").read_bytes() == (src / f"f{i}").read_bytes()
        # a key of the agent's keyring the receiver does not share: the job fails and the exit status says so
        code, out, err = _cli(capsys, "submit", str(src), "--to", f"fstream://127.0.0.1:{rcv.port}/out2",
                              "--tuner", "fixed", "--key", "bad", "--redis", redis_url, "--namespace", "cli2",
                              "--submitter", authkit.SUBMITTER, "--submitter-key", authkit.key_file())
        assert code == 1 and "failed" in err and "auth" in err.lower(), err
        assert not (dst / "out2").exists() or os.listdir(dst / "out2") == []
    finally:
        agent.stop()
        th.join(20)
        rcv.stop()


def test_submit_started_before_the_local_agent_trusts_its_key_once_written(redis_url, redis_client, tmp_path,
                                                                            monkeypatch):
    """Regression: `fstream submit` resolved its trusted agents once, when it started; in a fresh state dir that is
    before the local agent's first start writes <state dir>/agent.key.pub, so the submit trusted no one and waited
    for ever for an outcome a trusted agent signed. A real submit process now follows the job to its end once the
    agent that starts after it has written its key."""
    import json
    import os
    import subprocess
    import sys

    from fstream_provider.authz.outcome import default_agent_key
    from transfer_agent.daemon.worker import Agent
    from transfer_agent.receiving.receiver import Receiver
    from transfer_agent.wire.auth import load_secret

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv("FSTREAM_STATE_DIR", str(state))
    pub = default_agent_key().with_name(default_agent_key().name + ".pub")
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "f0").write_bytes(os.urandom(20_000))
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    rcv = Receiver(listen=("127.0.0.1", 0), root=str(dst), secret=load_secret(str(secret))).start()
    keys = Keys("early")
    submit = subprocess.Popen(
        [sys.executable, "-m", "transfer_agent.cli.main", "submit", str(src), "--to",
         f"fstream://127.0.0.1:{rcv.port}/out", "--tuner", "fixed", "--json", "--redis", redis_url, "--namespace",
         "early", "--submitter", authkit.SUBMITTER, "--submitter-key", authkit.key_file()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    agent = th = None
    try:
        deadline = time.monotonic() + 60
        while not redis_client.keys("{early}:job:*") and time.monotonic() < deadline and submit.poll() is None:
            time.sleep(0.05)
        assert redis_client.keys("{early}:job:*"), "the submit process did not store its job"
        assert not pub.exists(), "the local agent's key was there before the submit started: nothing is tested"
        agent = Agent(redis_url, policy=authkit.policy(secret), name="early", keys=keys, block_ms=100)
        th = threading.Thread(target=agent.run, daemon=True)
        th.start()
        out, err = submit.communicate(timeout=120)
        assert submit.returncode == 0, err
        assert json.loads(out)["state"] == "succeeded" and pub.exists()
        assert (dst / "out" / "f0").read_bytes() == (src / "f0").read_bytes()
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.communicate()
        if agent is not None:
            agent.stop()
            th.join(20)
        rcv.stop()


def test_a_released_job_gets_its_delivery_back(store, spec):
    """Regression (issue 30 review): every drain (agent stopping) used one of the job's deliveries, so a long stream
    whose agents were restarted max_deliveries times was dead-lettered although no try had failed."""
    job_id, _ = store.submit(spec)
    entry_id, _ = _take(store)
    for n in range(4):  # more releases than max_deliveries allows tries
        claim = store.claim(job_id, entry_id, worker=f"w{n}", max_deliveries=2)
        assert claim.outcome == "claimed" and claim.attempt == n + 1, claim
        assert store.release(job_id, claim.attempt, f"agent w{n} stopping")
    job = store.get(job_id)
    assert job.state == "queued" and job.deliveries == 0
