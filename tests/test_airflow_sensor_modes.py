"""``FStreamNewFilesSensor`` in all three modes on real Airflow (``dag.test()``) with a real Redis.

Deferrable (the trigger runs inline), ``mode="poke"`` (one process pokes in a loop) and
``mode="reschedule"``. How ``dag.test()`` runs a reschedule: its loop re-runs the task instance after
each ``AirflowRescheduleException`` and the task runner executes ``task.prepare_for_execution()``, a
*fresh copy* of the operator per poke (airflow/sdk/bases/operator.py) — so, as in production where
each poke is a new worker process, nothing the previous poke kept on the object survives. Before the
fix the stability looks lived on that object: the sensor never saw a file twice and timed out on a
complete file. The looks now live in Redis (``looks:<scope>``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
pytest.importorskip("airflow")

from airflow.sdk.exceptions import TaskDeferred  # noqa: E402

from fstream_provider.bus.client import connect  # noqa: E402
from fstream_provider.bus.keys import Keys  # noqa: E402
from fstream_provider.sensors.new_files import FStreamNewFilesSensor  # noqa: E402
from fstream_provider.triggers.new_files import FStreamNewFilesTrigger  # noqa: E402

_RUN_DAG = r"""
import json, os, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
dag_id, conf = sys.argv[1], json.loads(sys.argv[2])
bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
assert not bag.import_errors, bag.import_errors
dr = bag.dags[dag_id].test(run_conf=conf)
out = {"state": str(dr.state), "tis": {}, "xcom": {}}
with create_session() as s:
    for ti in dr.get_task_instances(session=s):
        out["tis"][ti.task_id] = str(ti.state)
    for x in s.query(XComModel).filter(XComModel.run_id == dr.run_id, XComModel.dag_id == dag_id):
        out["xcom"][x.task_id + ":" + x.key] = x.value
print("RESULT_JSON " + json.dumps(out, default=str))
"""

_SENSOR_DAGS = '''
from datetime import datetime
from airflow.sdk import DAG
from fstream_provider.sensors.new_files import FStreamNewFilesSensor

for mode, deferrable in (("deferred", True), ("poke", False), ("reschedule", False)):
    with DAG(f"fstream_sensor_{mode}", schedule=None, start_date=datetime(2026, 1, 1),
             params={"path": "", "min_files": 1}):
        FStreamNewFilesSensor(task_id="found", path="{{ params.path }}", pattern="*.dat", deferrable=deferrable,
                              mode="poke" if mode == "deferred" else mode, poke_interval=1.0, timeout=90,
                              min_files="{{ params.min_files }}", scope=f"modes-{mode}")
'''


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    """A private AIRFLOW_HOME with a migrated sqlite database and a DAGs folder with the three sensor DAGs."""
    home = tmp_path_factory.mktemp("airflow-home")
    dags = home / "dags"
    dags.mkdir()
    (dags / "sensor_modes.py").write_text(_SENSOR_DAGS)
    env = dict(os.environ, AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__CORE__DAGS_FOLDER=str(dags), AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
               FSTREAM_STATE_DIR=str(home / "fstream-state"))
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True,
                   timeout=300)
    return env


def _run_dag(env: dict, dag_id: str, conf: dict, timeout: float = 240) -> tuple[dict, str]:
    p = subprocess.run([sys.executable, "-c", _RUN_DAG, dag_id, json.dumps(conf)], env=env, capture_output=True,
                       text=True, timeout=timeout)
    text = p.stdout + p.stderr
    m = re.search(r"^RESULT_JSON (.*)$", p.stdout, re.M)
    assert m, f"dag.test produced no result (rc {p.returncode}):\n{text[-4000:]}"
    return json.loads(m.group(1)), text


class _Grower(threading.Thread):
    """Appends to a file every ``step`` seconds for ``seconds``, then closes it: a writer still at work."""

    def __init__(self, path: Path, seconds: float, step: float = 0.3) -> None:
        super().__init__(daemon=True)
        self.path, self.seconds, self.step = path, seconds, step
        self.stopped = threading.Event()

    def run(self) -> None:
        end = time.monotonic() + self.seconds
        with self.path.open("ab") as fh:
            while time.monotonic() < end and not self.stopped.wait(self.step):
                fh.write(b"g" * 1000)
                fh.flush()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["deferred", "poke", "reschedule"])
def test_the_sensor_reports_complete_files_once_and_a_growing_one_only_when_it_stops(mode, airflow_env, tmp_path,
                                                                                     redis_url):
    watch = tmp_path / "watch"
    watch.mkdir()
    (watch / "a.dat").write_bytes(b"x" * 1000)  # complete before the DAG starts
    growing = watch / "g.dat"
    growing.write_bytes(b"")
    env = dict(airflow_env, AIRFLOW_CONN_FSTREAM_DEFAULT=redis_url.replace("redis://", "fstream://", 1))
    grower = _Grower(growing, seconds=12)  # longer than dag.test's start-up: the sensor looks while it grows
    grower.start()
    try:
        out, log = _run_dag(env, f"fstream_sensor_{mode}", {"path": str(watch), "min_files": 2}, timeout=180)
    finally:
        grower.stopped.set()
        grower.join(10)
    assert out["tis"]["found"] == "success", log[-4000:]
    assert sorted(out["xcom"]["found:return_value"]) == [str(watch / "a.dat"), str(growing)]
    # the batch's byte count is the grown file's final size: it was not taken while it grew
    final = 1000 + growing.stat().st_size
    assert growing.stat().st_size >= 10_000 and f"2 new complete file(s), {final} bytes" in log, log[-4000:]

    # reported once: the next run of the same sensor reports only the new file
    (watch / "c.dat").write_bytes(b"c" * 10)
    out2, log2 = _run_dag(env, f"fstream_sensor_{mode}", {"path": str(watch), "min_files": 1}, timeout=180)
    assert out2["tis"]["found"] == "success", log2[-4000:]
    assert out2["xcom"]["found:return_value"] == [str(watch / "c.dat")]
    client = connect(redis_url)
    assert client.smembers(Keys().seen(f"modes-{mode}")) == {str(watch / n) for n in ("a.dat", "g.dat", "c.dat")}
    assert client.hlen(Keys().pending(f"modes-{mode}")) == 0  # deferred: execute_complete acknowledged


def test_a_fresh_sensor_per_poke_waits_for_a_growing_file_then_reports_it_once(tmp_path, monkeypatch, redis_url):
    """``mode="reschedule"`` at the unit level: a new sensor object per poke, the file grows between pokes."""
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", redis_url.replace("redis://", "fstream://", 1))
    f = tmp_path / "g.dat"

    def poke() -> object:
        s = FStreamNewFilesSensor(task_id="s", path=str(tmp_path), pattern="*.dat", deferrable=False,
                                  mode="reschedule", scope="growing")
        return s.poke({})

    f.write_bytes(b"x" * 10)
    assert not poke().is_done  # first look
    with f.open("ab") as fh:
        fh.write(b"y" * 10)
    assert not poke().is_done  # still growing: not complete
    got = poke()
    assert got.is_done and got.xcom_value == [str(f)]  # held still since the last (other process's) look
    assert not poke().is_done and not poke().is_done  # reported once
    looks = connect(redis_url).ttl(Keys().looks("growing"))
    assert 0 < looks <= 3600  # the looks expire: nothing is kept for a scope nobody watches


def test_sftp_paths_get_the_remote_poll_default_and_local_ones_the_local_default(tmp_path):
    assert FStreamNewFilesSensor(task_id="s", path="sftp://u@h/d").poke_interval == 5.0
    assert FStreamNewFilesSensor(task_id="s", path=str(tmp_path)).poke_interval == 0.25
    assert FStreamNewFilesSensor(task_id="s", path="sftp://u@h/d", poke_interval=2).poke_interval == 2
    assert FStreamNewFilesTrigger(path="sftp://u@h/d").effective_poll_interval() == 5.0
    assert FStreamNewFilesTrigger(path=str(tmp_path)).effective_poll_interval() == 0.25
    assert FStreamNewFilesTrigger(path="sftp://u@h/d", poll_interval=1).effective_poll_interval() == 1.0
    # a templated path is only known once rendered: the deferred trigger gets the rendered path's default
    sensor = FStreamNewFilesSensor(task_id="s", path="{{ params.path }}", deferrable=True)
    assert sensor.poke_interval == 0.25
    sensor.path = "sftp://u@h/incoming"  # what rendering the template did
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    assert deferred.value.trigger.poll_interval == 5.0
