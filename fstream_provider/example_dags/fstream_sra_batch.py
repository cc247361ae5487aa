"""SRA-style batch: wait for new runs, move them with FStream tuning, report the totals (trigger it by hand;
give it ``schedule="0 2 * * *"`` to run nightly).

``FStreamNewFilesSensor`` (deferrable) waits in the triggerer until at least ``min_files`` new, complete
``*.sra`` files sit in the outgoing directory (local, or ``sftp://USER@HOST/DIR``), claims them in a Redis
seen-set so no later run ships them again, and hands the list to ``FStreamTransferOperator``. The default
tuner is ``fstream`` (heuristic + online profiling + profiling history); the ``tuner`` param offers every
built tuner (``fstream_provider.tuning.registry``), checked before the job is submitted. Each run lands in a
day directory named from ``dag_run.run_after``: a run triggered by hand or through the API has no logical
date in Airflow 3 (``{{ ds_nodash }}`` is undefined there), while ``run_after`` is set for every run and
equals the logical date of a scheduled one.

Connection: ``fstream_default`` (Redis of the agents, also holding the seen-set), e.g.
``export AIRFLOW_CONN_FSTREAM_DEFAULT='fstream://redis.ncbi.example:6379/1?submitter=lcls-daq&submitter_key_file=%2Fetc%2Ffstream%2Fsubmitters%2Flcls-daq.key'``.
Jobs are signed as submitter ``lcls-daq`` (the agents' policy lists it with the same key) and name no key files.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, task

from fstream_provider.operators.transfer import FStreamTransferOperator
from fstream_provider.sensors.new_files import FStreamNewFilesSensor
from fstream_provider.tuning.registry import DEFAULT_TUNER, TUNER_NAMES

with DAG(
    dag_id="fstream_sra_batch",
    description="SRA batch (nightly once scheduled): new-file sensor, tuned FStream transfer, totals",
    # None: an example starts no work a newcomer did not ask for (with a cron schedule, unpausing it starts the
    # latest interval's run at once, which then waits deferred for files). Nightly: schedule="0 2 * * *".
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["fstream", "example", "sra"],
    params={
        "outgoing": Param("/srv/sra/outgoing", type="string", description="directory or sftp://USER@HOST/DIR"),
        "destination": Param("fstream://compute-dtn.example:9000/sra", type="string"),
        "min_files": Param(1, type="integer", minimum=1),
        "tuner": Param(DEFAULT_TUNER, enum=list(TUNER_NAMES)),
    },
):
    new_runs = FStreamNewFilesSensor(
        task_id="new_runs",
        path="{{ params.outgoing }}",
        pattern="*.sra",
        min_files="{{ params.min_files }}",
        min_age=5.0,
        poke_interval=2.0,
        timeout=timedelta(hours=6).total_seconds(),
        deferrable=True,  # wait in the triggerer, not in a worker slot
    )

    transfer = FStreamTransferOperator(
        task_id="transfer",
        sources=new_runs.output,
        destination="{{ params.destination }}/{{ dag_run.run_after | ds_nodash }}",
        tuner="{{ params.tuner }}",
        max_cc=16,
        deferrable=True,
    )

    @task
    def totals(report: dict) -> dict:
        print(f"SRA batch: {report['files']} files, {report['bytes']} bytes, "
              f"{report['throughput_bps'] / 1e6:.0f} Mbit/s, {report['failed_files']} failed")
        return {"files": report["files"], "bytes": report["bytes"]}

    totals(transfer.output)
