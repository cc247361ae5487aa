"""SRA-style nightly batch: many genomics files of mixed sizes to the compute site, tuned by FStream/HARP.

The ``harp`` tuner predicts the best cc/p/pp from the transfer history kept in Redis (sample transfers
first when history is thin), then hands over to online tuning; the job is ``batch`` priority, so
interactive streams are served first by the multi-transfer scheduler. Two transfers (small and large
runs) are mapped over the file groups; each task's XCom is the report.

Connection: ``fstream_default``, e.g.
``export AIRFLOW_CONN_FSTREAM_DEFAULT='fstream://redis.ncbi.example:6379/1?secret_file=%2Fetc%2Ffstream%2Fsecret'``.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, task

from fstream_provider.operators.transfer import FStreamTransferOperator

with DAG(
    dag_id="fstream_sra_batch",
    description="Nightly SRA batch transfer with history-based tuning",
    schedule="0 2 * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["fstream", "example", "sra"],
):

    @task
    def file_groups() -> list[list[str]]:
        """One group per size class, by glob (the agent expands globs on the source host)."""
        return [["/srv/sra/outgoing/small/*.sra"], ["/srv/sra/outgoing/large/*.sra"]]

    transfers = FStreamTransferOperator.partial(
        task_id="transfer",
        destination="fstream://compute-dtn.example:9000/sra/{{ ds_nodash }}",
        tuner="harp",
        max_cc=16,
        bandwidth="10Gbit",
        rtt="40ms",
        priority_class="batch",
    ).expand(sources=file_groups())

    @task
    def total(reports: list[dict]) -> dict:
        files = sum(r["files"] for r in reports)
        nbytes = sum(r["bytes"] for r in reports)
        print(f"SRA batch: {files} files, {nbytes} bytes in {len(reports)} transfers")
        return {"files": files, "bytes": nbytes}

    total(transfers.output)
