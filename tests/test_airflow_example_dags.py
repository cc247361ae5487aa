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

import authkit  # noqa: E402

EXAMPLES = str(Path(__file__).resolve().parent.parent / "fstream_provider" / "example_dags")
EXPECTED = {"fstream_transfer_example", "fstream_lcls_stream", "fstream_sra_batch", "fstream_asset_pipeline",
            "fstream_deadline"}


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


def test_no_example_starts_work_nobody_asked_for(dagbag):
    """Issue 31: unpausing a cron-scheduled example started a run at once that sat deferred waiting for files.
    Each example runs when triggered (no schedule) or when its files arrive (an asset's watcher)."""
    for dag_id in EXPECTED:
        timetable = dagbag.dags[dag_id].timetable
        kind = type(timetable).__name__
        assert kind == "NullTimetable" or getattr(timetable, "asset_condition", None) is not None, (dag_id, kind)


def test_every_example_docstring_explains_the_connection():
    assert any(n.endswith(".py") for n in os.listdir(EXAMPLES)), EXAMPLES
    for name in os.listdir(EXAMPLES):
        if name.endswith(".py") and name != "__init__.py":
            with open(os.path.join(EXAMPLES, name)) as f:
                text = f.read()
            doc = text.split('"""')[1]
            assert "AIRFLOW_CONN_FSTREAM_DEFAULT" in doc, name
            # issue 32: the connection names the submitter jobs are signed as, never key files on the agents' hosts
            assert "submitter=" in doc and "secret_file" not in doc and "tls_" not in doc, name


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


_MANUAL_RUNS = r"""
import json, os, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.utils.session import create_session
runs = json.loads(sys.argv[1])
bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
assert not bag.import_errors, bag.import_errors
for dag_id, conf in runs.items():
    dag = bag.dags[dag_id]
    if dag.deadline:  # Airflow 3.3.2's dag.test() cannot end a run of a DAG with a DeadlineAlert: DagRun.update_state
        dag.deadline = None  # looks its alerts up by id and dag.test() hands it their definitions (not a scheduler run)
    dr = dag.test(logical_date=None, run_conf=conf)  # what a UI/API trigger gets: no logical date
    with create_session() as s:
        tis = {ti.task_id: str(ti.state) for ti in dr.get_task_instances(session=s)}
    print("RESULT_JSON " + json.dumps({"dag_id": dag_id, "state": str(dr.state), "run_type": str(dr.run_type),
                                       "logical_date": str(dr.logical_date), "tis": tis}), flush=True)
"""


@pytest.mark.slow
def test_every_example_dag_runs_end_to_end_as_a_manual_run(tmp_path, redis_url):
    """Each example DAG under ``dag.test(logical_date=None)`` with a real Redis, receiver and agent: the run
    succeeds and the files land (the asset pipeline, triggered by hand, has no asset event: it skips)."""
    import json
    import re
    import threading

    from transfer_agent.daemon.worker import Agent
    from transfer_agent.receiving.receiver import Receiver

    secret = b"fstream-example-dags-manual-run-secret-0123"
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(secret)
    secret_file.chmod(0o600)
    src, out_dir, run_dir, xpp, home = (tmp_path / d for d in ("src", "outgoing", "run", "xpp", "airflow"))
    for d, prefix, suffix in ((src, "a", ".dat"), (out_dir, "s", ".sra"), (run_dir, "r", ".xtc"), (xpp, "x", ".h5")):
        d.mkdir()
        for i in range(3):
            (d / f"{prefix}{i}{suffix}").write_bytes(os.urandom(40_000 + i))
    home.mkdir()
    receiver = Receiver(listen=("127.0.0.1", 0), root=str(tmp_path / "dst"), secret=secret).start()
    agent = Agent(redis_url, policy=authkit.policy(secret_file), name="manual-run-agent", block_ms=200,
                  poll_interval=0.1)
    agent_thread = threading.Thread(target=agent.run, name="agent", daemon=True)
    dest = f"fstream://127.0.0.1:{receiver.port}"
    env = dict(os.environ, AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__CORE__DAGS_FOLDER=EXAMPLES, AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
               FSTREAM_STATE_DIR=str(tmp_path / "state"), FSTREAM_EXAMPLE_WATCH_DIR=str(tmp_path / "watch"),
               FSTREAM_EXAMPLE_DESTINATION=f"{dest}/assets",
               AIRFLOW_CONN_FSTREAM_DEFAULT=redis_url.replace("redis://", "fstream://", 1)
               + "?" + authkit.conn_query())
    runs = {
        "fstream_transfer_example": {"source": str(src), "destination": f"{dest}/transfer"},
        "fstream_sra_batch": {"outgoing": str(out_dir), "destination": f"{dest}/sra", "min_files": 3},
        "fstream_lcls_stream": {"run_dir": str(run_dir), "destination": f"{dest}/lcls", "idle_exit": "2s"},
        "fstream_asset_pipeline": {},
        "fstream_deadline": {"run_dir": str(xpp), "destination": f"{dest}/xpp", "deadline": "10m"},
    }
    assert set(runs) == EXPECTED
    try:
        agent_thread.start()
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True,
                       timeout=300)
        p = subprocess.run([sys.executable, "-c", _MANUAL_RUNS, json.dumps(runs)], env=env, capture_output=True,
                           text=True, timeout=600)
    finally:
        agent.stop()
        agent_thread.join(timeout=30)
        receiver.stop()
    results = {r["dag_id"]: r for r in map(json.loads, re.findall(r"^RESULT_JSON (.*)$", p.stdout, re.M))}
    log = (p.stdout + p.stderr)[-6000:]
    assert set(results) == EXPECTED, log
    for dag_id, r in results.items():
        assert r["logical_date"] == "None" and "manual" in r["run_type"], r
        assert r["state"] == "success", f"{dag_id}: {r}\n{log}"
    assert results["fstream_asset_pipeline"]["tis"] == {"batch_files": "success", "transfer": "skipped",
                                                        "process": "skipped"}, results["fstream_asset_pipeline"]
    assert all(state == "success" for dag_id, r in results.items() if dag_id != "fstream_asset_pipeline"
               for state in r["tis"].values()), results
    landed = {p.relative_to(tmp_path / "dst").as_posix() for p in (tmp_path / "dst").rglob("*") if p.is_file()}
    assert {f"transfer/a{i}.dat" for i in range(3)} <= landed, sorted(landed)
    assert {f"lcls/r{i}.xtc" for i in range(3)} <= landed, sorted(landed)
    assert len([n for n in landed if n.startswith("sra/") and n.endswith(".sra")]) == 3, sorted(landed)
    assert {f"xpp/x{i}.h5" for i in range(3)} <= landed, sorted(landed)
    assert "reconstructing 3 files (deadline met)" in p.stdout + p.stderr, log
