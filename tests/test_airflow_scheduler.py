"""A real Airflow (api-server, scheduler, dag-processor, triggerer) runs the asset pipeline once per new batch, never twice per file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

pytest.importorskip("airflow")

from fstream_provider.bus.client import connect  # noqa: E402
from fstream_provider.bus.embedded import free_port  # noqa: E402
from fstream_provider.bus.keys import Keys  # noqa: E402
from transfer_agent.receiving.receiver import Receiver  # noqa: E402
from transfer_agent.daemon.worker import Agent  # noqa: E402

import authkit  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SECRET = b"fstream-scheduler-test-secret-012345"
DAG_ID = "fstream_asset_pipeline"


class _Airflow:
    """The four Airflow 3 components as subprocesses, each in its own session (stopped by pid)."""

    def __init__(self, env: dict, workdir: Path) -> None:
        self.env, self.workdir = env, workdir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *args: str) -> None:
        log = open(self.workdir / f"{name}.log", "a")
        # cwd is a private empty directory: nothing there can shadow a module Airflow imports.
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "airflow", *args], env=self.env, cwd=self.workdir,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def stop(self, name: str) -> None:
        p = self.procs.pop(name)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")


def _runs(db: Path) -> list[tuple[str, str]]:
    try:
        with sqlite3.connect(db, timeout=5) as c:
            return c.execute("select run_id, state from dag_run where dag_id = ? order by id", (DAG_ID,)).fetchall()
    except sqlite3.OperationalError:
        return []  # tables not there yet


def _batches(db: Path) -> dict[str, list[str]]:
    with sqlite3.connect(db, timeout=5) as c:
        rows = c.execute("select run_id, value from xcom where dag_id = ? and task_id = 'batch_files' "
                         "and key = 'return_value'", (DAG_ID,)).fetchall()
    return {run_id: json.loads(v) for run_id, v in rows}


def _wait(pred, timeout: float, what: str, diag=lambda: ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.25)  # polling another process's database with a deadline
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{diag()}")


def _failed_task_logs(work: Path, db: Path) -> str:
    """The task logs of failed task instances (the reason a run failed)."""
    try:
        with sqlite3.connect(db, timeout=5) as c:
            failed = c.execute("select run_id, task_id from task_instance where state = 'failed'").fetchall()
    except sqlite3.OperationalError:
        return ""
    out = []
    for run_id, task_id in failed:
        for f in sorted((work / "logs").glob(f"dag_id={DAG_ID}/run_id={run_id}/task_id={task_id}/*.log")):
            out.append(f"--- {f.relative_to(work)}\n{f.read_text(errors='replace')[-3000:]}")
    return "\n".join(out)


def _drop(watch: Path, names: list[str]) -> float:
    """Write files under a hidden name, then rename (how instruments close files); returns the close time."""
    for n in names:
        tmp = watch / f".{n}.writing"
        tmp.write_bytes(os.urandom(64_000))
    closed = time.time()
    for n in names:
        (watch / f".{n}.writing").rename(watch / n)
    return closed


def _latencies(redis_url: str, db: Path, closed: list[float]) -> str:
    """File closed -> asset event, and -> the agent claiming the transfer job (the transfer starting)."""
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.jobs import JobStore

    with sqlite3.connect(db, timeout=5) as c:
        events = [r[0] for r in c.execute("select timestamp from asset_event order by id")]
    to_event = [datetime.fromisoformat(ts).replace(tzinfo=timezone.utc).timestamp() - t  # stored as naive UTC
                for ts, t in zip(events, closed)]
    client = connect(redis_url)
    try:
        store = JobStore(client)
        claims = sorted(e["ts"] for j in store.list() for _, e in store.events(j.job_id, count=1000)
                        if e["kind"] == "claimed")
    finally:
        client.close()
    to_claim = [c - t for c, t in zip(claims, closed)]
    return ("file closed -> asset event: " + ", ".join(f"{x:.2f} s" for x in to_event)
            + "; file closed -> transfer claimed by the agent: " + ", ".join(f"{x:.2f} s" for x in to_claim))


def _pending_batches(redis_url: str) -> int:
    """Batches a new-files watcher claimed and Airflow has not yet confirmed stored (every scope)."""
    client = connect(redis_url)
    try:
        return sum(client.hlen(k) for k in client.scan_iter(Keys().pending("x")[:-1] + "*"))
    finally:
        client.close()


def test_asset_triggered_dag_runs_once_per_batch_never_twice_per_file(tmp_path, redis_url):
    watch, dags, work = tmp_path / "watch", tmp_path / "dags", tmp_path / "airflow"
    for d in (watch, dags, work):
        d.mkdir()
    shutil.copy(REPO / "fstream_provider" / "example_dags" / "fstream_asset_pipeline.py", dags)
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)  # load_secret refuses a secret others can read
    receiver = Receiver(listen=("127.0.0.1", 0), root=str(tmp_path / "dst"), secret=SECRET).start()
    agent = Agent(redis_url, policy=authkit.policy(secret), name="sched-test-agent", block_ms=200, poll_interval=0.1)
    agent_thread = threading.Thread(target=agent.run, daemon=True)
    agent_thread.start()
    api = free_port()
    db = work / "airflow.db"
    env = dict(
        os.environ, AIRFLOW_HOME=str(work), AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{db}", AIRFLOW__CORE__EXECUTOR="LocalExecutor",
        AIRFLOW__CORE__PARALLELISM="4", AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
        AIRFLOW__API__HOST="127.0.0.1", AIRFLOW__API__PORT=str(api), AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{api}",
        AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{api}/execution/",
        AIRFLOW__API_AUTH__JWT_SECRET="fstream-scheduler-test-jwt-secret-0123456789",
        AIRFLOW__API__SECRET_KEY="fstream-scheduler-test", AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
        AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),
        AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
        AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5", AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="1",
        FSTREAM_EXAMPLE_WATCH_DIR=str(watch), FSTREAM_EXAMPLE_DESTINATION=f"fstream://127.0.0.1:{receiver.port}/landed",
        FSTREAM_STATE_DIR=str(tmp_path / "state"),
        AIRFLOW_CONN_FSTREAM_DEFAULT=redis_url.replace("redis://", "fstream://", 1) + "?" + authkit.conn_query(),
    )
    af = _Airflow(env, work)
    diag = lambda: "\n".join([f"--- {n}\n{af.log(n)[-2500:]}" for n in ("scheduler", "triggerer")]  # noqa: E731
                              + [_failed_task_logs(work, db)])
    fired = lambda: sum(1 for line in af.log("triggerer").splitlines()  # noqa: E731  (watcher events only)
                        if "Trigger fired event" in line and "new complete file(s)" in line)
    try:
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, cwd=work, check=True,
                       capture_output=True, timeout=300)
        af.start("api-server", "api-server", "--port", str(api), "--workers", "1")
        af.start("scheduler", "scheduler")
        af.start("dag-processor", "dag-processor")
        af.start("triggerer", "triggerer", "--skip-serve-logs")
        _wait(lambda: af.log("triggerer").count("watching " + str(watch)) >= 1, 180, "the watcher to start", diag)

        batch1 = ["a0.h5", "a1.h5", "a2.h5"]
        closed = [_drop(watch, batch1)]
        (watch / "ignored.txt").write_text("not matching *.h5")
        _wait(lambda: len(_runs(db)) == 1 and _runs(db)[0][1] in ("success", "failed"), 180, "run 1", diag)

        # Restart the triggerer: the watcher is rebuilt from serialize(); its memory is gone, Redis remembers.
        af.stop("triggerer")
        starts = af.log("triggerer").count("watching " + str(watch))
        af.start("triggerer", "triggerer", "--skip-serve-logs")
        _wait(lambda: af.log("triggerer").count("watching " + str(watch)) > starts, 120, "the watcher to restart", diag)

        batch2 = ["b0.h5", "b1.h5"]
        closed.append(_drop(watch, batch2))
        _wait(lambda: len(_runs(db)) >= 2 and all(s in ("success", "failed") for _, s in _runs(db)), 180, "run 2",
              diag)

        # The watcher keeps running (shared-stream ack mode: one poll loop, not a re-run per event); each batch
        # is acknowledged once the triggerer confirmed its event stored. Then a third batch: its run holds only
        # its own file, so the watcher looked again after both acknowledgements and re-reported nothing (a
        # re-reported file would come out in an extra run before it, or in its batch).
        _wait(lambda: _pending_batches(redis_url) == 0, 60, "the triggerer to acknowledge the stored batches", diag)
        batch3 = ["c0.h5"]
        closed.append(_drop(watch, batch3))
        _wait(lambda: len(_runs(db)) >= 3 and all(s in ("success", "failed") for _, s in _runs(db)), 180, "run 3",
              diag)

        runs = _runs(db)
        assert [s for _, s in runs] == ["success", "success", "success"], f"{runs}\n{diag()}"
        batches = _batches(db)
        assert sorted(map(sorted, batches.values())) == [sorted(str(watch / n) for n in batch1),
                                                         sorted(str(watch / n) for n in batch2),
                                                         sorted(str(watch / n) for n in batch3)]
        assert sorted(p.name for p in (tmp_path / "dst" / "landed").iterdir()) == sorted(batch1 + batch2 + batch3)
        assert fired() == 3  # one watcher event per batch, none for files already reported
        print("LATENCY " + _latencies(redis_url, db, closed))
    finally:
        af.stop_all()
        agent.stop()
        agent_thread.join(timeout=30)
        receiver.stop()
