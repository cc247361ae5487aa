"""The transfer operator under real use (issue 9): which job a retry or Clear gets, the no-agent grace period in
the trigger, templated arguments checked once rendered; real Redis, real triggers under asyncio, real dag.test()."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
pytest.importorskip("airflow")

from airflow.sdk.exceptions import TaskDeferred  # noqa: E402

from fstream_provider.bus.jobs import JobStore  # noqa: E402
from fstream_provider.bus.keys import Keys  # noqa: E402
from fstream_provider.model.spec import TransferSpec  # noqa: E402
from fstream_provider.operators.transfer import FStreamTransferOperator  # noqa: E402
from fstream_provider.triggers.transfer import FStreamTransferTrigger  # noqa: E402

import authkit  # noqa: E402

DEST = "fstream://127.0.0.1:9/x"


class _TI:
    """The task-instance fields the operator reads: ids, map index, try number, XCom push/pull."""

    def __init__(self, try_number: int) -> None:
        self.dag_id, self.run_id, self.task_id, self.map_index = "d", "manual__1", "transfer", -1
        self.try_number, self.xcom = try_number, {}

    def xcom_push(self, key, value):
        self.xcom[key] = value

    def xcom_pull(self, task_ids, key, map_indexes=None):
        return self.xcom.get(key)


@pytest.fixture
def conn(monkeypatch, redis_url):
    """``fstream_default`` on the test Redis, signing as the test submitter."""
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", redis_url.replace("redis://", "fstream://", 1)
                       + "?" + authkit.conn_query())
    return redis_url


def _submitted(try_number: int, **kw) -> str:
    """Run the operator's execute as try ``try_number`` up to its deferral; the job id it deferred on."""
    op = FStreamTransferOperator(task_id="transfer", sources=["/data/a"], destination=DEST, deferrable=True, **kw)
    with pytest.raises(TaskDeferred) as exc:
        op.execute({"ti": _TI(try_number)})
    return exc.value.trigger.job_id


def test_a_retry_after_a_clear_reattaches_the_redone_job_instead_of_starting_another(conn, redis_client):
    """Try 1's job ended; a Clear (try 2) redid it as a new job; a retry of try 2 (try 3, e.g. after a worker
    crash) must re-attach to that still-queued redo. It used to look only at try 1's key, see it finished,
    and submit a third job next to the running second one."""
    store = JobStore(redis_client, keys=Keys())
    first = _submitted(1)
    store.cancel(first, "ended")  # try 1's job is over (terminal)
    second = _submitted(2)  # the Clear redoes it
    assert second != first and store.get(second).state == "queued"
    third = _submitted(3)  # a retry while the redo is still queued
    assert third == second, "the retry started a second copy of a job still queued"
    assert [j.job_id for j in store.list() if j.state == "queued"] == [second]


def test_known_bad_values_fail_at_parse_naming_the_argument_and_templates_wait_for_rendering():
    """Only templates may wait for execute: a literal of the wrong kind used to pass the parse and fail the run."""
    kw = dict(task_id="t", sources=["/a"], destination=DEST)
    for bad, named in ((dict(p="x"), "p='x' must be an integer"), (dict(max_cc="abc"), "max_cc='abc'"),
                       (dict(agent_timeout="5 minutes"), "agent_timeout='5 minutes'"),
                       (dict(interval="fast"), "interval='fast'"), (dict(watch="maybe"), "watch='maybe'"),
                       (dict(until="tomorrow"), "until='tomorrow'"), (dict(verify="sure"), "verify='sure'")):
        with pytest.raises(ValueError, match="^t: .*" + named.replace("(", r"\(")):
            FStreamTransferOperator(**kw, **bad)
    # the same arguments as templates (also inside tuner_options) are accepted now and checked once rendered
    FStreamTransferOperator(**kw, p="{{ params.p }}", max_cc="{{ params.m }}", agent_timeout="{{ params.t }}",
                            interval="{{ params.i }}", watch="{{ params.w }}", verify="{{ params.v }}",
                            tuner_options={"sample_interval": "{{ params.si }}", "encrypt": "{{ params.e }}"})
    with pytest.raises(ValueError, match="unknown key.*bogus"):  # a templated value does not hide an unknown key
        FStreamTransferOperator(**kw, tuner_options={"bogus": "{{ params.b }}"})


def test_templated_arguments_are_rendered_by_airflow_and_reach_the_spec(conn, redis_client):
    """Airflow's own Jinja rendering of the operator's template_fields, then execute: strings become the spec's types."""
    op = FStreamTransferOperator(task_id="transfer", sources=["{{ params.src }}"], destination=DEST, deferrable=True,
                                 tuner="fixed", cc="{{ params.cc }}", p="{{ params.p }}", pp="{{ params.pp }}",
                                 max_cc="{{ params.max_cc }}", verify="{{ params.verify }}", agent_timeout="{{ params.t }}",
                                 tuner_options={"sample_interval": "{{ params.si }}", "encrypt": "{{ params.enc }}"})
    params = {"src": "/data/run7", "cc": 2, "p": 3, "pp": 1, "max_cc": 4, "verify": False, "t": "30s", "si": "0.5s",
              "enc": "true"}
    ti = _TI(1)
    op.render_template_fields({"params": params, "ti": ti})
    assert (op.p, op.verify, op.tuner_options["encrypt"]) == ("3", "False", "true")  # Jinja renders text
    with pytest.raises(TaskDeferred) as exc:
        op.execute({"ti": ti, "params": params})
    trigger = exc.value.trigger
    spec = JobStore(redis_client, keys=Keys()).get(trigger.job_id).spec
    assert (spec.sources, spec.cc, spec.p, spec.pp, spec.max_cc, spec.verify) == (["/data/run7"], 2, 3, 1, 4, False)
    assert (spec.sample_interval_s, spec.encrypt) == (0.5, True) and trigger.agent_timeout == 30.0
    bad = FStreamTransferOperator(task_id="transfer", sources=["/a"], destination=DEST, verify="{{ params.v }}")
    bad.render_template_fields({"params": {"v": "perhaps"}, "ti": ti})
    with pytest.raises(Exception, match="transfer: verify='perhaps' must be true or false"):
        bad.execute({"ti": ti})


def _heartbeat(client, name: str = "busy-agent", ttl_ms: int = 60_000) -> str:
    """An agent's presence as the agent writes it (``transfer_agent.daemon.heartbeat``): its key with a TTL, in the set."""
    keys = Keys()
    client.hset(keys.agent(name), mapping={"name": name, "job_id": "another-job"})
    client.pexpire(keys.agent(name), ttl_ms)
    client.sadd(keys.agents(), name)
    return keys.agent(name)


def _queued_job(client) -> str:
    job_id, _ = JobStore(client, keys=Keys(), signer=authkit.signer()).submit(
        TransferSpec(sources=["/a"], destination=DEST), idempotency_key="d/r/wait/-1")
    return job_id


async def _first_event(trigger, within: float):
    gen = trigger.run()
    try:
        return (await asyncio.wait_for(gen.__anext__(), within)).payload
    finally:
        await gen.aclose()


def test_trigger_fails_a_job_queued_with_no_live_agent_after_agent_timeout(conn, redis_client):
    job_id = _queued_job(redis_client)
    trigger = FStreamTransferTrigger(job_id=job_id, block_ms=100, agent_timeout=0.5,
                                     agent_hint="start one: `fstream agent --redis URL`")
    event = asyncio.run(_first_event(trigger, within=15))
    assert event["status"] == "error" and "no live agent on the bus (agent_timeout 0.5 s)" in event["message"]
    assert "fstream agent --redis" in event["message"]
    assert JobStore(redis_client, keys=Keys()).get(job_id).state == "cancelled"


def _record_agent_checks(monkeypatch) -> list[tuple[float, int]]:
    """Every look the trigger or the operator takes for live agents while the job is queued: (when, agents
    alive). The real ``NoAgentWatch.check`` still decides; this only records that it was asked."""
    from fstream_provider.bus.agents import NoAgentWatch

    seen: list[tuple[float, int]] = []
    real = NoAgentWatch.check

    def check(self, job_id: str, state: str | None, alive: int) -> None:
        seen.append((time.monotonic(), alive))
        real(self, job_id, state, alive)

    monkeypatch.setattr(NoAgentWatch, "check", check)
    return seen


def _watched_alive_for(seen: list[tuple[float, int]]) -> float:
    """Seconds between the first and the last look that found the agent alive (0 before two such looks)."""
    alive = [t for t, n in seen if n > 0]
    return alive[-1] - alive[0] if len(alive) >= 2 else 0.0


def test_trigger_waits_while_an_agent_is_alive_even_if_the_job_stays_queued(conn, redis_client, monkeypatch):
    """A busy agent (alive, on another job) is no reason to give up; once its heartbeat expires the job fails."""
    job_id = _queued_job(redis_client)
    hb = _heartbeat(redis_client)
    trigger = FStreamTransferTrigger(job_id=job_id, block_ms=100, agent_timeout=0.3)
    checks = _record_agent_checks(monkeypatch)

    async def scenario():
        task = asyncio.ensure_future(_first_event(trigger, within=20))
        # the trigger looked for agents again and again and found the busy one alive, for 3 x agent_timeout:
        # one that gave up on a queued job regardless would have ended by now
        deadline = time.monotonic() + 15
        while _watched_alive_for(checks) < 3 * 0.3 and not task.done():
            assert time.monotonic() < deadline, f"the trigger did not keep looking for agents: {checks}"
            await asyncio.sleep(0.02)
        assert not task.done(), f"the trigger gave up while an agent was alive: {task.result()}"
        await asyncio.to_thread(redis_client.delete, hb)  # the agent died: its heartbeat key is gone
        return await task

    event = asyncio.run(scenario())
    assert event["status"] == "error" and "no live agent" in event["message"]


def test_polling_waits_while_an_agent_is_alive_and_fails_once_none_is(conn, redis_client, monkeypatch):
    import threading

    hb = _heartbeat(redis_client)
    op = FStreamTransferOperator(task_id="transfer", sources=["/data/a"], destination=DEST, deferrable=False,
                                 poll_interval=0.1, agent_timeout="0.3s")
    checks = _record_agent_checks(monkeypatch)
    errors: list[BaseException] = []

    def run():
        try:
            op.execute({"ti": _TI(1)})
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    # the poll loop found the busy agent alive over 3 x agent_timeout (see the trigger test above)
    deadline = time.monotonic() + 15
    while _watched_alive_for(checks) < 3 * 0.3 and t.is_alive():
        assert time.monotonic() < deadline, f"polling did not keep looking for agents: {checks}"
        t.join(0.02)
    assert t.is_alive() and not errors, f"polling gave up while an agent was alive: {errors}"
    redis_client.delete(hb)
    t.join(15)
    assert not t.is_alive() and errors and "no live agent on the bus (agent_timeout 0.3 s)" in str(errors[0])


# -- Clear on real Airflow: dag.test, the UI's Clear (clear_task_instances), dag.test again on the same run ----------
_CLEAR_DAG = '''
from datetime import datetime
from airflow.sdk import DAG
from fstream_provider.operators.transfer import FStreamTransferOperator

with DAG("fstream_clear", schedule=None, start_date=datetime(2026, 1, 1), params={"source": "", "destination": ""}):
    FStreamTransferOperator(task_id="transfer", sources=["{{ params.source }}"], destination="{{ params.destination }}",
                            deferrable=True, agent_timeout="30s", retries=0)
'''

_RUN_CLEAR_RERUN = r"""
import datetime as dt, json, os, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.models.dagbag import DBDagBag
from airflow.models.dagrun import DagRun
from airflow.models.taskinstance import clear_task_instances
from airflow.sdk.definitions.dag import _run_task
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState, TaskInstanceState
conf, delete = json.loads(sys.argv[1]), sys.argv[2]
dag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"]).dags["fstream_clear"]
out = []

def record(dr):
    with create_session() as s:
        (ti,) = s.merge(dr).get_task_instances(session=s)
        out.append({"run_id": dr.run_id, "state": str(ti.state), "try_number": ti.try_number})

dr = dag.test(run_conf=conf)
record(dr)
os.remove(delete)  # someone deletes a landed file, then clears the task in the UI:
with create_session() as s:
    dr = s.merge(dr)
    clear_task_instances(dr.get_task_instances(session=s), s, dag_run_state=DagRunState.QUEUED)  # what Clear calls
    dr.state = DagRunState.RUNNING  # the scheduler starts the queued run again
# ... and schedules the cleared task: the loop of dag.test (which itself would delete and recreate the run),
# standing in for the scheduler on the same run
run_pk, serialized = dr.id, None
while True:
    with create_session() as s:
        dr = s.get(DagRun, run_pk)
        if dr.state != DagRunState.RUNNING:
            break
        serialized = serialized or DBDagBag().get_dag_for_run(dag_run=dr, session=s)  # as the scheduler loads it
        dr.dag = serialized
        schedulable, _ = dr.update_state(session=s)
        for ti in schedulable:
            ti.try_number += 1  # as the scheduler does when it schedules a task again
            ti.state = TaskInstanceState.SCHEDULED
        s.commit()
        scheduled = [t for t in dr.get_task_instances(session=s) if t.state == TaskInstanceState.SCHEDULED]
    for ti in scheduled:
        _run_task(ti=ti, task=dag.task_dict[ti.task_id], run_triggerer=True)
record(dr)
print("RESULT_JSON " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory):
    """A private AIRFLOW_HOME with a migrated sqlite database and a DAG folder holding the Clear DAG."""
    import subprocess
    import sys

    home = tmp_path_factory.mktemp("airflow-home")
    (home / "dags").mkdir()
    (home / "dags" / "fstream_clear.py").write_text(_CLEAR_DAG)
    env = dict(os.environ, AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
               FSTREAM_STATE_DIR=str(home / "fstream-state"))
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True,
                   timeout=300)
    return env


@pytest.mark.slow
def test_clear_of_a_succeeded_task_redoes_the_transfer_on_real_airflow(airflow_home, redis_url, redis_client, secret,
                                                                      rx, tmp_path):
    """It used to re-attach to the succeeded job of the first run: the deleted file stayed missing."""
    import hashlib
    import json
    import re
    import subprocess
    import sys
    import threading

    from agentkit import make_files
    from transfer_agent.daemon.worker import Agent

    src = make_files(tmp_path / "src", {f"shot{i}.xtc": 40_000 * (i + 1) for i in range(3)})
    agent = Agent(redis_url, policy=authkit.policy(secret), name="clear-test-agent", block_ms=200, poll_interval=0.1)
    t = threading.Thread(target=agent.run, name="agent", daemon=True)
    t.start()
    try:
        env = dict(airflow_home, AIRFLOW_CONN_FSTREAM_DEFAULT=redis_url.replace("redis://", "fstream://", 1)
                   + "?" + authkit.conn_query())
        conf = {"source": str(src), "destination": f"fstream://127.0.0.1:{rx.port}/landed"}
        landed = tmp_path / "dst" / "landed"
        p = subprocess.run([sys.executable, "-c", _RUN_CLEAR_RERUN, json.dumps(conf), str(landed / "shot1.xtc")],
                           env=env, capture_output=True, text=True, timeout=240)
    finally:
        agent.stop()
        t.join(timeout=30)
    log = p.stdout + p.stderr
    m = re.search(r"^RESULT_JSON (.*)$", p.stdout, re.M)
    assert m, f"rc {p.returncode}:\n{log[-4000:]}"
    first, second = json.loads(m.group(1))
    assert first["run_id"] == second["run_id"] and second["try_number"] > first["try_number"], (first, second)
    assert first["state"] == second["state"] == "success", log[-4000:]
    jobs = sorted(JobStore(redis_client, keys=Keys()).list(), key=lambda j: j.created_at)
    assert len(jobs) == 2 and {j.state for j in jobs} == {"succeeded"}, [(j.job_id, j.state) for j in jobs]
    assert jobs[1].idempotency_key.endswith(f"#try{second['try_number']}"), jobs[1].idempotency_key
    digest = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in src.iterdir()}
    assert {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in landed.iterdir()} == digest


def test_the_same_try_run_again_after_its_job_ended_redoes_it_every_time(conn, redis_client):
    """A run deleted and recreated under its run_id (as dag.test does for a logical date) starts at try 1 again:
    the third such run used to re-attach to the second run's finished job and move nothing."""
    store = JobStore(redis_client, keys=Keys())
    seen = []
    for _ in range(3):
        seen.append(_submitted(1))
        store.cancel(seen[-1], "ended")
    assert len(set(seen)) == 3, seen
    again = _submitted(1)
    assert again not in seen and _submitted(1) == again  # a new job, then re-attached while it is queued


def test_a_trigger_on_a_misspelled_connection_fires_an_error_naming_it_at_once(conn, redis_client):
    """The async hook has no fallback either: a trigger rebuilt with a conn id that does not exist fails its task
    with the id and how to define it, instead of following a job on a private Redis for ever."""
    trigger = FStreamTransferTrigger(job_id=_queued_job(redis_client), fstream_conn_id="fstream_typo", block_ms=100)
    event = asyncio.run(_first_event(trigger, within=10))
    assert event["status"] == "error" and "'fstream_typo' is not defined" in event["message"], event
    assert "AIRFLOW_CONN_FSTREAM_TYPO" in event["message"]
