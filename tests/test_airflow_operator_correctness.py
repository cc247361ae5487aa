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
