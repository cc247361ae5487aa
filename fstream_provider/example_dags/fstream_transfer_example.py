"""Move one source (file, directory or glob) to a receiver with FStream; source, destination and target are params.

Connection: the operator uses ``fstream_default``, the Redis bus the FStream agents share. Create it with
``airflow connections add fstream_default --conn-uri 'fstream://REDIS_HOST:6379/0?submitter=lcls-daq&submitter_key_file=%2Fetc%2Ffstream%2Fsubmitters%2Flcls-daq.key'``
or ``export AIRFLOW_CONN_FSTREAM_DEFAULT='fstream://REDIS_HOST:6379/0?submitter=lcls-daq&submitter_key_file=%2Fetc%2Ffstream%2Fsubmitters%2Flcls-daq.key'``
(host/port/schema = the Redis server and database; ``submitter`` and its key file = who the jobs are signed as,
listed with the same key in the agents' policy; jobs name no key files). A connection that is not defined fails the
task naming it: there is no fallback to a Redis no agent watches. Run it with::

    airflow dags test fstream_transfer_example \\
        --conf '{"source": "/data/run42", "destination": "fstream://dtn2:9000/incoming/run42", "target_throughput": "800Mbps"}'
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, Param

from fstream_provider.operators.transfer import FStreamTransferOperator
from fstream_provider.tuning.registry import DEFAULT_TUNER, TUNER_NAMES

with DAG(
    dag_id="fstream_transfer_example",
    description="One FStream transfer with a throughput target; parameters from the run's conf",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["fstream", "example"],
    params={
        "source": Param(os.environ.get("FSTREAM_EXAMPLE_SOURCE", "/data/outgoing"), type="string",
                        description="file, directory or glob on the source agent's host"),
        "destination": Param(os.environ.get("FSTREAM_EXAMPLE_DESTINATION", "fstream://127.0.0.1:9000/incoming"),
                             type="string", description="fstream://HOST:PORT/DEST/PATH of the receiver"),
        "target_throughput": Param("800Mbps", type=["null", "string"],
                                   description="QoS target such as 800Mbps or 1Gbit (empty: as fast as possible; "
                                               "only the fstream tuner holds a target)"),
        "tuner": Param(DEFAULT_TUNER, enum=list(TUNER_NAMES)),
    },
):
    FStreamTransferOperator(
        task_id="transfer",
        sources="{{ params.source }}",
        destination="{{ params.destination }}",
        target_throughput="{{ params.target_throughput or '' }}",
        tuner="{{ params.tuner }}",
        deferrable=True,  # wait in the triggerer (the default is Airflow's [operators] default_deferrable)
    )
