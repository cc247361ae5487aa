"""Asset-triggered pipeline: each batch of new complete files starts one run: transfer, then process.

``FStreamNewFilesTrigger`` watches the instrument's output directory (local, or ``sftp://USER@HOST/DIR``)
from the triggerer. A file counts once it stopped growing; its batch is claimed in Redis (seen-set and
pending batch) and acknowledged only after Airflow stored the asset event, so every batch starts a DAG
run and a file never starts two: not after triggerer restarts or with a second triggerer (apache/airflow
issue 49900). The run's first task collects the files of the asset events that triggered it, the
transfer moves them, and ``process`` runs downstream.

The transfer retries: Airflow 3.3 can fail a deferred task whose trigger fires before the scheduler saw
the deferring worker exit (apache/airflow issues 71580 and 72716; a small batch transfers in well under a
second). The retry attaches to the job if it still runs, else submits a new one, which skips every file
already verified at the destination.

Connection: ``fstream_default`` (Redis of the agents, also holding the seen-set), e.g.
``export AIRFLOW_CONN_FSTREAM_DEFAULT='fstream://REDIS_HOST:6379/0?submitter=lcls-daq&submitter_key_file=%2Fetc%2Ffstream%2Fsubmitters%2Flcls-daq.key'``.
Jobs are signed as submitter ``lcls-daq`` (the agents' policy lists it with the same key) and name no key files.
The watch directory and destination come from ``FSTREAM_EXAMPLE_WATCH_DIR`` and ``FSTREAM_EXAMPLE_DESTINATION``.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, Asset, AssetWatcher, task

from fstream_provider.operators.transfer import FStreamTransferOperator
from fstream_provider.triggers.new_files import FStreamNewFilesTrigger

WATCH_DIR = os.environ.get("FSTREAM_EXAMPLE_WATCH_DIR", "/data/instrument/outgoing")
DESTINATION = os.environ.get("FSTREAM_EXAMPLE_DESTINATION", "fstream://127.0.0.1:9000/incoming")

new_files = Asset(
    "fstream_new_instrument_files",
    watchers=[
        AssetWatcher(
            name="fstream_new_files_watcher",
            trigger=FStreamNewFilesTrigger(path=WATCH_DIR, pattern="*.h5", poll_interval=0.25, max_files=500),
        )
    ],
)

with DAG(
    dag_id="fstream_asset_pipeline",
    description="New files -> FStream transfer -> processing, once per batch",
    schedule=[new_files],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=4,
    tags=["fstream", "example", "assets"],
):

    @task
    def batch_files(**context) -> list[str]:
        """All files of the asset events that triggered this run (several batches may be folded into one run)."""
        files: list[str] = []
        for ev in context["triggering_asset_events"][new_files]:
            files.extend((ev.extra or {}).get("payload", {}).get("files", []))
        print(f"{len(files)} new file(s): {files[:10]}")
        return files

    files = batch_files()
    transfer = FStreamTransferOperator(task_id="transfer", sources=files, destination=DESTINATION, deferrable=True,
                                       retries=2, retry_delay=timedelta(seconds=5))

    @task
    def process(report: dict) -> int:
        """Stand-in for the analysis step: it sees exactly what landed and verified."""
        print(f"processing {report['verified_files']} verified file(s) of job {report['job_id']}")
        return report["verified_files"]

    process(transfer.output)
