"""LCLS-style stream: ship each new detector file as it lands, hold 800 Mbit/s, stop after 10 min of quiet.

The operator runs one long-lived FStream job in watch mode (the thesis' streaming data finder): the source
agent rescans the run directory every 2 s, sends complete new files at once, and the QoS controller keeps
the throughput at the target. The task defers while the stream runs; its log gets one line per interval
(throughput vs target, cc/p/pp per cluster, files done/pending, the tuner's reasons), then a summary table
and the path of a throughput/channels plot.

Connection: ``fstream_default`` (the Redis bus of the agents), e.g.
``export AIRFLOW_CONN_FSTREAM_DEFAULT='fstream://redis.slac.example:6379/0?submitter=lcls-daq&submitter_key_file=%2Fetc%2Ffstream%2Fsubmitters%2Flcls-daq.key'``.
Jobs are signed as submitter ``lcls-daq`` (the agents' policy lists it with the same key) and name no key files.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, task

from fstream_provider.operators.transfer import FStreamTransferOperator

with DAG(
    dag_id="fstream_lcls_stream",
    description="Stream an LCLS run directory to the analysis cluster at a throughput target",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["fstream", "example", "lcls"],
    params={
        "run_dir": Param("/sdf/data/lcls/xpp/run0042/xtc", type="string"),
        "destination": Param("fstream://analysis-dtn.example:9000/lcls/xpp/run0042", type="string"),
        "target_throughput": Param("800Mbps", type="string"),
        "idle_exit": Param("10m", type="string", description="stop after this long with no new file"),
    },
):
    stream = FStreamTransferOperator(
        task_id="stream_run",
        sources=["{{ params.run_dir }}"],
        destination="{{ params.destination }}",
        target_throughput="{{ params.target_throughput }}",
        watch=True,
        interval="2s",
        idle_exit="{{ params.idle_exit }}",
        until="{{ (dag_run.run_after + macros.timedelta(hours=12)).isoformat() }}",
        execution_timeout=timedelta(hours=13),
        deferrable=True,  # a 12-hour stream waits in the triggerer, not in a worker slot
    )

    @task
    def report(rep: dict) -> str:
        """Downstream consumers get the report: what moved, how fast, how the tuner behaved."""
        msg = (f"run streamed: {rep['files']} files, {rep['bytes']} bytes in {rep['seconds']:.0f} s "
               f"({rep['throughput_bps'] / 1e6:.0f} Mbit/s, target {rep['target_throughput_bps'] or 0:.0f} bit/s)")
        print(msg)
        return msg

    report(stream.output)
