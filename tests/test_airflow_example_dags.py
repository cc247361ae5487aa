"""The example DAGs load with no import errors, serialize like the scheduler does, and wire the provider right."""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
pytest.importorskip("airflow")

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "example_dags")
EXPECTED = {"fstream_transfer_example", "fstream_lcls_stream", "fstream_sra_batch", "fstream_asset_pipeline"}


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=EXAMPLES)


def test_example_dags_import_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert EXPECTED <= set(dagbag.dags)


def test_example_dags_serialize(dagbag):
    from airflow.serialization.serialized_objects import DagSerialization

    for dag_id in EXPECTED:
        data = DagSerialization.to_dict(dagbag.dags[dag_id])
        back = DagSerialization.from_dict(data)
        assert back.dag_id == dag_id and set(back.task_ids) == set(dagbag.dags[dag_id].task_ids)


def test_transfer_example_takes_the_documented_params(dagbag):
    dag = dagbag.dags["fstream_transfer_example"]
    assert {"source", "destination", "target_throughput"} <= set(dag.params)
    op = dag.get_task("transfer")
    assert op.deferrable and "{{ params.source }}" in op.sources


def test_asset_pipeline_is_driven_by_the_new_files_event_trigger(dagbag):
    from fstream_provider.triggers.new_files import FStreamNewFilesTrigger

    dag = dagbag.dags["fstream_asset_pipeline"]
    (asset,) = dag.timetable.asset_condition.objects
    (watcher,) = asset.watchers
    assert isinstance(watcher.trigger, FStreamNewFilesTrigger)


def test_every_example_docstring_explains_the_connection():
    assert any(n.endswith(".py") for n in os.listdir(EXAMPLES)), EXAMPLES
    for name in os.listdir(EXAMPLES):
        if name.endswith(".py"):
            with open(os.path.join(EXAMPLES, name)) as f:
                text = f.read()
            assert "AIRFLOW_CONN_FSTREAM_DEFAULT" in text.split('"""')[1], name
