"""The example DAGs load with no import errors, serialize like the scheduler does, and wire the provider right."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
pytest.importorskip("airflow")

EXAMPLES = str(Path(__file__).resolve().parent.parent / "fstream_provider" / "example_dags")
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
        if name.endswith(".py") and name != "__init__.py":
            with open(os.path.join(EXAMPLES, name)) as f:
                text = f.read()
            assert "AIRFLOW_CONN_FSTREAM_DEFAULT" in text.split('"""')[1], name


def _manual_run_context(task, conf: dict | None = None):
    """The template context the Task SDK builds for a manual (API/UI) run: no logical date, no data interval."""
    import uuid

    from airflow.sdk import timezone
    from airflow.sdk.api.datamodels._generated import DagRun, TIRunContext
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    now = timezone.utcnow()
    dag_run = DagRun(dag_id=task.dag_id, run_id="manual__2026-05-04T03:02:01+00:00", logical_date=None,
                     data_interval_start=None, data_interval_end=None, run_after=now, start_date=now,
                     end_date=None, run_type="manual", state="running", conf=conf or {},
                     consumed_asset_events=[], partition_key=None)
    ti = RuntimeTaskInstance.model_construct(
        id=uuid.uuid4(), task=task, task_id=task.task_id, dag_id=task.dag_id, run_id=dag_run.run_id,
        try_number=1, map_index=-1, start_date=now, max_tries=0,
        _ti_context_from_server=TIRunContext(dag_run=dag_run, max_tries=0))
    ti._ti_context_from_server = TIRunContext(dag_run=dag_run, max_tries=0)
    return ti.get_template_context()


def _without_xcom(value):
    """``value`` with every XCom reference (resolved from XCom at run time, not by Jinja) replaced by a string."""
    from airflow.sdk.definitions._internal.mixins import ResolveMixin

    if isinstance(value, ResolveMixin):
        return "<xcom>"
    if isinstance(value, (list, tuple)):
        return type(value)(_without_xcom(v) for v in value)
    if isinstance(value, dict):
        return {k: _without_xcom(v) for k, v in value.items()}
    return value


def test_every_templated_field_renders_for_a_manual_run_without_logical_date(dagbag):
    """Airflow 3 sets no ``ds``/``ts``/``logical_date`` for a run triggered from the UI or API; every example
    DAG must still render (``{{ ds_nodash }}`` in a template is an UndefinedError there)."""
    rendered = 0
    for dag_id in sorted(EXPECTED):
        for task in dagbag.dags[dag_id].tasks:
            context = _manual_run_context(task)
            assert "logical_date" not in context and "ds_nodash" not in context
            for field in task.template_fields:
                value = _without_xcom(getattr(task, field))
                try:
                    task.render_template(value, context)
                except Exception as exc:  # noqa: BLE001 - the message names the DAG, task and field
                    pytest.fail(f"{dag_id}.{task.task_id}.{field} = {value!r} does not render for a manual run: "
                                f"{type(exc).__name__}: {exc}")
                rendered += 1
    assert rendered >= 8, rendered


def test_demo_finds_the_example_dags_through_the_package():
    """``fstream demo`` takes its dags folder from the installed package, not from a path next to a checkout."""
    import fstream_provider.example_dags as pkg
    from fstream_demo.airflow_demo import example_dags_dir

    assert example_dags_dir() == Path(pkg.__file__).resolve().parent
    assert {f"{d}.py" for d in EXPECTED} <= {p.name for p in example_dags_dir().iterdir()}


@pytest.mark.slow
def test_the_wheel_ships_the_example_dags_and_the_demo_finds_them(tmp_path):
    """Build the wheel, check the example DAG files are in it, and run ``example_dags_dir()`` from the unpacked
    wheel alone (outside the source tree): the demo works from an installed wheel."""
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(root)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("fstream-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(tmp_path / "site")
    for dag_id in EXPECTED:
        assert f"fstream_provider/example_dags/{dag_id}.py" in names, sorted(n for n in names if "example" in n)
    for page in ("index", "connection", "operators", "sensors", "triggers", "hooks"):  # the provider info links them
        assert f"fstream-0.1.0.data/data/share/doc/fstream/airflow/{page}.md" in names, page
    code = "from fstream_demo.airflow_demo import example_dags_dir; print(example_dags_dir())"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")))
    assert out.returncode == 0, out.stderr[-2000:]
    assert Path(out.stdout.strip()) == tmp_path / "site" / "fstream_provider" / "example_dags"
