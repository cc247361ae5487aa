"""The transfer operator under real use (issue 9): which job a retry or Clear gets, the no-agent grace period in
the trigger, templated arguments checked once rendered; real Redis, real triggers under asyncio, real dag.test()."""

from __future__ import annotations

import asyncio
import os
import tempfile

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
pytest.importorskip("airflow")

from airflow.sdk.exceptions import TaskDeferred  # noqa: E402

from fstream_provider.bus.jobs import JobStore  # noqa: E402
from fstream_provider.bus.keys import Keys  # noqa: E402
from fstream_provider.model.spec import TransferSpec  # noqa: E402
from fstream_provider.operators.transfer import FStreamTransferOperator  # noqa: E402
from fstream_provider.triggers.transfer import FStreamTransferTrigger  # noqa: E402

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
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", redis_url.replace("redis://", "fstream://", 1))
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
    job_id, _ = JobStore(client, keys=Keys()).submit(TransferSpec(sources=["/a"], destination=DEST),
                                                    idempotency_key="d/r/wait/-1")
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


def test_trigger_waits_while_an_agent_is_alive_even_if_the_job_stays_queued(conn, redis_client):
    """A busy agent (alive, on another job) is no reason to give up; once its heartbeat expires the job fails."""
    job_id = _queued_job(redis_client)
    hb = _heartbeat(redis_client)
    trigger = FStreamTransferTrigger(job_id=job_id, block_ms=100, agent_timeout=0.3)

    async def scenario():
        task = asyncio.ensure_future(_first_event(trigger, within=20))
        done, _ = await asyncio.wait({task}, timeout=2.0)  # > 6 x agent_timeout with the agent alive
        assert not done, f"the trigger gave up while an agent was alive: {task.result()}"
        await asyncio.to_thread(redis_client.delete, hb)  # the agent died: its heartbeat key is gone
        return await task

    event = asyncio.run(scenario())
    assert event["status"] == "error" and "no live agent" in event["message"]


def test_polling_waits_while_an_agent_is_alive_and_fails_once_none_is(conn, redis_client):
    import threading

    hb = _heartbeat(redis_client)
    op = FStreamTransferOperator(task_id="transfer", sources=["/data/a"], destination=DEST, deferrable=False,
                                 poll_interval=0.1, agent_timeout="0.3s")
    errors: list[BaseException] = []

    def run():
        try:
            op.execute({"ti": _TI(1)})
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(2.0)
    assert t.is_alive() and not errors, f"polling gave up while an agent was alive: {errors}"
    redis_client.delete(hb)
    t.join(15)
    assert not t.is_alive() and errors and "no live agent on the bus (agent_timeout 0.3 s)" in str(errors[0])
