"""A beamline run that must reach the compute site before reconstruction starts: a deadline that steers the
transfer, and Airflow's ``DeadlineAlert`` watching the whole run (issue 27). Trigger it by hand.

Two deadlines, doing different jobs:

- ``FStreamTransferOperator(deadline=...)`` acts *inside* the transfer: "20m" (a duration, counted from the
  DAG run's start; also a datetime or an ISO-8601 time) becomes a QoS target recomputed as bytes land, so the
  copy uses no more of the shared path than the deadline needs. When even the path's best rate cannot make
  it, the task log says so early with the shortfall (a WARNING and a ``deadline`` job event, the live view
  turns red) and ``on_deadline_risk`` decides: ``warn`` keeps going at full rate, ``fail`` stops the task so
  the DAG can take its other branch (or its retries).
- ``DeadlineAlert`` on the DAG acts *outside* it: Airflow's scheduler calls the callback when the run has not
  finished 30 minutes after it was queued. It cannot move a running task; it tells someone.

Connection: ``fstream_default`` (Redis of the agents), e.g.
``export AIRFLOW_CONN_FSTREAM_DEFAULT='fstream://redis.lcls.example:6379/0?submitter=lcls-daq&submitter_key_file=%2Fetc%2Ffstream%2Fsubmitters%2Flcls-daq.key'``.
Jobs are signed as submitter ``lcls-daq`` (the agents' policy lists it with the same key).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from airflow.sdk import DAG, AsyncCallback, DeadlineAlert, DeadlineReference, Param, task

from fstream_provider.operators.transfer import FStreamTransferOperator

log = logging.getLogger(__name__)


async def run_is_late(context: dict | None = None, **kwargs) -> None:
    """The DAG-level alert's callback (runs in the triggerer): a real deployment pages someone here."""
    log.warning("fstream_deadline: run not finished %s after it was queued (%s)", kwargs.get("within"), context)


with DAG(
    dag_id="fstream_deadline",
    description="a run's data to compute before reconstruction: a steering deadline and a DeadlineAlert",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["fstream", "example", "deadline"],
    deadline=DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=timedelta(minutes=30),
                           callback=AsyncCallback(run_is_late, kwargs={"within": "30 minutes"})),
    params={
        "run_dir": Param("/data/lcls/xpp/run0042", type="string"),
        "destination": Param("fstream://compute-dtn.example:9000/xpp", type="string"),
        "deadline": Param("20m", type="string", description="a duration from the run's start, or an ISO time"),
        "on_deadline_risk": Param("warn", enum=["warn", "fail"]),
    },
):
    copy = FStreamTransferOperator(
        task_id="copy_run",
        sources="{{ params.run_dir }}",
        destination="{{ params.destination }}",
        deadline="{{ params.deadline }}",
        on_deadline_risk="{{ params.on_deadline_risk }}",
        deferrable=True,
    )

    @task
    def reconstruct(report: dict) -> str:
        state = (report.get("deadline") or {}).get("state", "no deadline")
        print(f"reconstructing {report['files']} files (deadline {state})")
        return state

    reconstruct(copy.output)
