"""Clients trust only agent-signed outcomes (issue 40 item 1): a job hash or event stream written by anyone but an
agent (the submitter's own Redis user, anything with a writable path to it) never makes a job look done.

Real redis-server; the agent side through ``JobStore`` with an ``OutcomeSigner`` (the code the real agent runs),
``fstream submit`` as a subprocess, the transfer trigger on a real event loop, the operator through ``dag.test()``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from urllib.parse import quote, urlparse

import pytest

import authkit
from test_airflow_integration import airflow_env  # noqa: F401 - a fixture, used by name
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.authz.ed25519 import PrivateKey
from fstream_provider.authz.outcome import OutcomeSigner, TrustedAgents
from fstream_provider.model.spec import TransferSpec

INVENTED = {"path": "out/invented.bin", "source": "/nowhere/invented.bin", "size": 5, "status": "committed"}


def _result(landed: list[dict]) -> dict:
    return {"files": len(landed), "bytes": sum(r["size"] for r in landed), "seconds": 0.5, "throughput_bps": 80.0,
            "verified_files": len(landed), "skipped_files": 0, "failed_files": 0, "failures": [], "landed": landed}


def forge_success(client, keys: Keys, job_id: str) -> None:
    """What a Redis user with write access to the job can do without an agent's key: a succeeded state with an
    invented result, a ``file`` event and a ``done`` event."""
    result = _result([INVENTED])
    client.hset(keys.job(job_id), mapping={"state": "succeeded", "error": "", "result": json.dumps(result),
                                           "updated_at": repr(time.time())})
    now = repr(time.time())
    client.xadd(keys.job_events(job_id), {"kind": "file", "ts": now, "data": json.dumps(INVENTED)})
    client.xadd(keys.job_events(job_id), {"kind": "done", "ts": now, "data": json.dumps(
        {"state": "succeeded", "error": None, "result": result})})


def _run_as_agent(client, keys: Keys, signer: OutcomeSigner, job_id: str, *, state: str = "succeeded",
                  landed: list[dict] | None = None) -> None:
    """The agent's side of one job: claim its stream entry and finish it, signed (``JobStore.finish``)."""
    store = JobStore(client, keys=keys, outcome_signer=signer)
    entry = client.hget(keys.job(job_id), "stream_id")  # the entry it was submitted under
    claim = store.claim(job_id, entry, worker="agent-a", max_deliveries=5)
    assert claim.outcome == "claimed"
    assert store.finish(job_id, claim.attempt, entry, state=state, result=_result(landed or []),
                        error=None if state == "succeeded" else "receiver full")


@pytest.fixture
def agent_key() -> OutcomeSigner:
    return OutcomeSigner(PrivateKey.generate("agent-a"), "agent-a")


def _submit(client, keys: Keys) -> str:
    store = JobStore(client, keys=keys, signer=authkit.signer())
    store.ensure_group()
    job_id, _ = store.submit(TransferSpec(sources=["/data/a"], destination="fstream://127.0.0.1:9/out"))
    return job_id


def test_a_trusted_agents_signature_counts_and_nothing_else_does(redis_client, agent_key):
    keys = Keys("outc")
    trusting = JobStore(redis_client, keys=keys, trust=TrustedAgents.of([agent_key.key.public]))
    genuine, copied_to, altered = (_submit(redis_client, keys) for _ in range(3))
    landed = [{"path": "out/a.bin", "source": "/data/a/a.bin", "size": 7, "status": "committed"}]
    for job_id in (genuine, altered):
        _run_as_agent(redis_client, keys, agent_key, job_id, landed=landed)

    # a genuine outcome: believed, with the signed landed records
    job = trusting.get(genuine)
    assert (job.state, job.outcome_agent, job.unverified) == ("succeeded", "agent-a", None)
    assert job.result["landed"] == landed and trusting.wait(genuine, timeout=5).state == "succeeded"

    # the same outcome under a key the client does not trust
    other = JobStore(redis_client, keys=keys, trust=TrustedAgents.of([PrivateKey.generate("x").public], "test"))
    job = other.get(genuine)
    assert job.state == "unverified" and job.result is None and not job.terminal
    assert "not among the trusted agents" in job.unverified

    # a genuine signature (with attempt, state and result) copied onto another job
    h = redis_client.hgetall(keys.job(genuine))
    redis_client.hset(keys.job(copied_to), mapping={f: h[f] for f in ("state", "attempt", "error", "result",
                                                                      "outcome_sig")})
    job = trusting.get(copied_to)
    assert job.state == "unverified" and "copied from another job" in job.unverified

    # a signed outcome whose result was changed afterwards (an invented landed file added)
    stored = json.loads(redis_client.hget(keys.job(altered), "result"))
    stored["landed"].append(INVENTED)
    redis_client.hset(keys.job(altered), "result", json.dumps(stored))
    job = trusting.get(altered)
    assert job.state == "unverified" and job.result is None and "does not match" in job.unverified


def test_an_unsigned_failure_is_a_failure_without_its_result_and_a_signed_refusal_counts(redis_client, agent_key):
    keys = Keys("outc2")
    trusting = JobStore(redis_client, keys=keys, trust=TrustedAgents.of([agent_key.key.public]))
    cancelled, refused = _submit(redis_client, keys), _submit(redis_client, keys)
    assert trusting.cancel(cancelled, "changed my mind")  # the submitter's own cancel: no agent signs it
    redis_client.hset(keys.job(cancelled), "result", json.dumps(_result([INVENTED])))
    job = trusting.get(cancelled)
    assert (job.state, job.result) == ("cancelled", None) and "no agent signed" in job.unverified

    store = JobStore(redis_client, keys=keys, outcome_signer=agent_key)
    entry = redis_client.hget(keys.job(refused), "stream_id")
    claim = store.claim(refused, entry, worker="agent-a", max_deliveries=5)
    assert store.reject(refused, claim.attempt, entry, "outside the agent's roots")
    job = trusting.get(refused)
    assert (job.state, job.outcome_agent, job.error) == ("failed", "agent-a", "outside the agent's roots")


def test_trusted_agents_from_a_file_a_directory_inline_and_the_default(tmp_path, monkeypatch):
    a, b = PrivateKey.generate("a").public, PrivateKey.generate("b").public
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "a.pub").write_text(a.line() + "\n")
    (tmp_path / "keys" / "b.pub").write_text(b.line() + "\n")
    (tmp_path / "list").write_text(f"# the agents of site X\n{a.line()}\n\n{b.line()}\n")
    for value in (str(tmp_path / "keys"), str(tmp_path / "list"), f"{a.line()}\n{b.line()}"):
        assert set(TrustedAgents.resolve(value).keys) == {a.key_id, b.key_id}
    monkeypatch.setenv("FSTREAM_TRUSTED_AGENTS", str(tmp_path / "keys" / "a.pub"))
    assert set(TrustedAgents.resolve().keys) == {a.key_id}
    monkeypatch.delenv("FSTREAM_TRUSTED_AGENTS")
    monkeypatch.setenv("FSTREAM_STATE_DIR", str(tmp_path / "state"))
    assert TrustedAgents.resolve().keys == {} and "does not exist" in TrustedAgents.resolve().source
    from fstream_provider.authz.outcome import load_signer

    made = load_signer(None, "local-agent")  # an agent without a configured key makes <state dir>/agent.key
    assert set(TrustedAgents.resolve().keys) == {made.key.key_id}
    assert oct((tmp_path / "state" / "agent.key").stat().st_mode & 0o777) == "0o600"


def test_fstream_submit_does_not_exit_0_on_a_forged_success(redis_url, redis_client, tmp_path):
    """``fstream submit`` (a subprocess) follows its job; another client writes succeeded, a result and done
    events while it is queued: the command says it is not signed and ends without success at its --timeout."""
    env = {**os.environ, "FSTREAM_TRUSTED_AGENTS": PrivateKey.generate("site").public.line()}
    p = subprocess.Popen([sys.executable, "-m", "transfer_agent.cli", "submit", str(tmp_path), "--to",
                          "fstream://127.0.0.1:9/out", "--redis", redis_url, "--submitter", authkit.SUBMITTER,
                          "--submitter-key", authkit.key_file(), "--timeout", "5s", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first = p.stderr.readline()
        assert first.startswith("job "), first
        job_id = first.split()[1].rstrip(":")
        forge_success(redis_client, Keys(), job_id)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode not in (0, None), (out, err)
    assert "shows 'succeeded', but no agent signed this outcome" in err and "not done" in err, err
    assert err.count("not done; waiting for an outcome a trusted agent signed") == 1, err  # said once
    job = json.loads(out)
    assert job["state"] == "unverified" and job["result"] is None


def test_the_trigger_does_not_fire_success_on_a_forged_outcome(monkeypatch, redis_url, redis_client, agent_key):
    pytest.importorskip("airflow")
    from fstream_provider.triggers.transfer import FStreamTransferTrigger

    keys = Keys("outc-trig")
    u = urlparse(redis_url)
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", f"fstream://{u.hostname}:{u.port}/0?namespace={keys.namespace}"
                       f"&trusted_agents={quote(agent_key.key.public.line(), safe='')}")
    forged, genuine = _submit(redis_client, keys), _submit(redis_client, keys)
    forge_success(redis_client, keys, forged)
    _run_as_agent(redis_client, keys, agent_key, genuine, landed=[INVENTED])
    warned: list[str] = []

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warned.append(record.getMessage())

    handler = Seen(logging.WARNING)
    logging.getLogger("fstream_provider.bus.follow").addHandler(handler)

    async def scenario():
        async def first(job_id):
            async for ev in FStreamTransferTrigger(job_id=job_id, block_ms=200).run():
                return ev.payload

        task = asyncio.ensure_future(first(forged))
        deadline = time.monotonic() + 30
        while not warned and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        fired = task.result() if task.done() else None
        task.cancel()
        return fired, await asyncio.wait_for(first(genuine), 30)

    try:
        fired, ok = asyncio.run(scenario())
    finally:
        logging.getLogger("fstream_provider.bus.follow").removeHandler(handler)
    assert fired is None, fired  # the forged job's trigger did not fire (success or otherwise) ...
    assert any(f"job {forged} shows 'succeeded', but no agent signed" in w for w in warned), warned  # ... it said why
    assert ok["status"] == "success" and ok["state"] == "succeeded"  # the signed job's did, on the same connection


_DAG = '''
"""Test DAG: one polling transfer with an outlet asset, whose job a forger marks succeeded."""
import datetime as dt
from airflow.sdk import DAG, Asset
from fstream_provider.operators.transfer import FStreamTransferOperator

with DAG("fstream_forged_outcome", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False):
    FStreamTransferOperator(task_id="transfer", sources=[{source!r}], destination="fstream://127.0.0.1:9/out",
                            outlets=[Asset("fstream-forged-landed")], retries=0, deferrable=False,
                            poll_interval=0.2, execution_timeout=dt.timedelta(seconds=12))
'''

_ASSETS = r"""
from airflow.models.asset import AssetEvent
with create_session() as s:
    print("ASSET_JSON " + json.dumps([e.extra for e in s.query(AssetEvent).all()], default=str))
"""


@pytest.mark.slow
def test_the_operator_reports_no_invented_landed_files(airflow_env, redis_url, redis_client, tmp_path, monkeypatch):
    """dag.test() of a polling transfer (the deferred path: the trigger test above) whose job another Redis client
    marks succeeded with an invented landed file (no agent runs): the task does not succeed, no landed file or asset
    event is reported, the log says why."""
    import threading

    from test_airflow_integration import _RUN_DAG, _run_dag  # noqa: F811

    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "forged.py").write_text(_DAG.format(source=str(tmp_path)))
    env = dict(airflow_env, AIRFLOW__CORE__DAGS_FOLDER=str(tmp_path / "dags"),
               AIRFLOW_CONN_FSTREAM_DEFAULT=redis_url.replace("redis://", "fstream://", 1) + "?"
               + authkit.conn_query())
    monkeypatch.setattr("test_airflow_integration._RUN_DAG", _RUN_DAG + _ASSETS)
    stop = threading.Event()

    def forger():  # marks the task's job succeeded as soon as it is queued
        keys = Keys()
        while not stop.wait(0.1):
            for _eid, fields in redis_client.xrange(keys.jobs_stream()):
                forge_success(redis_client, keys, fields["job_id"])
                return

    t = threading.Thread(target=forger, daemon=True)
    t.start()
    try:
        out, log = _run_dag(env, "fstream_forged_outcome", {})
    finally:
        stop.set()
        t.join(10)
    assert out["tis"]["transfer"] == "failed", log[-4000:]
    assert "no agent signed this outcome" in log, log[-4000:]
    assert "transfer:return_value" not in out["xcom"] and "invented.bin" not in json.dumps(out["xcom"])
    assert json.loads(log.split("ASSET_JSON ", 1)[1].splitlines()[0]) == []


def test_landed_files_come_from_the_signed_result_not_from_file_events(redis_client, agent_key):
    from fstream_provider.model.tasklog import build_report

    keys = Keys("outc3")
    job_id = _submit(redis_client, keys)
    signed = [{"path": "out/a.bin", "source": "/data/a/a.bin", "size": 7, "status": "committed"}]
    _run_as_agent(redis_client, keys, agent_key, job_id, landed=signed)
    redis_client.xadd(keys.job_events(job_id), {"kind": "file", "ts": repr(time.time()), "data": json.dumps(INVENTED)})
    store = JobStore(redis_client, keys=keys, trust=TrustedAgents.of([agent_key.key.public]))
    job = store.get(job_id)
    report = build_report(job_id, store.all_events(job_id), None, "fstream://127.0.0.1:9/out",
                          outcome={"state": job.state, "error": job.error, "result": job.result})
    assert report["state"] == "succeeded"
    assert [f["destination"] for f in report["landed_files"]] == ["fstream://127.0.0.1:9/out/a.bin"]


def test_an_agent_whose_signing_key_cannot_be_read_does_not_start(redis_url, tmp_path):
    loose = tmp_path / "agent.key"
    loose.write_bytes(PrivateKey.generate("a").pem())
    loose.chmod(0o644)  # a private key others may read is refused, as every private key file is
    for key, why in ((tmp_path / "missing.key", "does not exist"), (loose, "")):
        p = subprocess.run([sys.executable, "-m", "transfer_agent.cli", "agent", "--redis", redis_url, "--root",
                            str(tmp_path), "--signing-key", str(key), "--once"], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 2 and f"signing key: agent signing key {key}" in p.stderr, p.stderr
        assert why in p.stderr


def test_fstream_status_shows_an_unverified_success_as_such(redis_url, redis_client, agent_key, capsys, monkeypatch):
    from transfer_agent.cli.main import main

    keys = Keys("outc4")
    forged, genuine = _submit(redis_client, keys), _submit(redis_client, keys)
    forge_success(redis_client, keys, forged)
    _run_as_agent(redis_client, keys, agent_key, genuine)
    monkeypatch.setenv("COLUMNS", "400")  # one table row per line
    trust = ("--redis", redis_url, "--namespace", keys.namespace, "--trusted-agents", agent_key.key.public.line())
    assert main(["status", forged, *trust]) == 0
    out = capsys.readouterr().out
    assert "unverified: job" in out and "no agent signed this outcome" in out, out
    assert main(["status", genuine, *trust]) == 0
    assert "succeeded (agent agent-a, signed)" in capsys.readouterr().out
    assert main(["status", *trust, "--json"]) == 0
    states = {j["job_id"]: j["state"] for j in json.loads(capsys.readouterr().out)["jobs"]}
    assert (states[forged], states[genuine]) == ("unverified", "succeeded")


def test_threads_making_the_default_agent_key_at_once_all_get_it(tmp_path, monkeypatch):
    """An in-process agent and a client of one process may make ``<state dir>/agent.key`` at the same moment
    (``ed25519.ensure_pair``): each gets the one key, none fails on another's temporary file (10 rounds of 8)."""
    import threading

    from fstream_provider.authz.outcome import load_signer

    for round_ in range(10):
        monkeypatch.setenv("FSTREAM_STATE_DIR", str(tmp_path / f"state{round_}"))
        got, errors = [], []
        start = threading.Barrier(8)

        def make():
            start.wait()
            try:
                got.append(load_signer(None, "a").key.key_id)
            except Exception as exc:  # noqa: BLE001 - what the test looks for
                errors.append(exc)

        threads = [threading.Thread(target=make) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == [] and len(set(got)) == 1 and len(got) == 8, (round_, errors)
        assert set(TrustedAgents.resolve().keys) == set(got)
