"""A real Airflow 3 as a deployment runs it: api-server, scheduler, dag-processor and triggerer as four processes.

They share a sqlite database in a private ``AIRFLOW_HOME`` (LocalExecutor). Each component can be started,
stopped (SIGTERM), killed (SIGKILL) and restarted on its own. DAG runs are triggered through the REST API;
run and task states are read from the database. Used by the scheduler and fault tests, and meant for
benchmarks (``bench/``) that need a long-running Airflow under faults.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fstream_bench.airflow.api_server import is_up
from fstream_provider.bus.embedded import free_port

# each component's command line after ``python -m airflow``
COMPONENTS: dict[str, tuple[str, ...]] = {
    "api-server": ("api-server", "--workers", "1"),
    "scheduler": ("scheduler",),
    "dag-processor": ("dag-processor",),
    "triggerer": ("triggerer", "--skip-serve-logs"),
}
FINISHED = ("success", "failed", "upstream_failed", "skipped", "removed")


def wait(pred: Callable[[], Any], timeout: float, what: str, diag: Callable[[], str] = lambda: "", *,
         every: float = 0.25) -> Any:
    """Poll ``pred`` (every ``every`` seconds) until it returns something true and return that; after ``timeout``
    seconds fail naming ``what``, with ``diag()`` (logs) appended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)  # polling other processes (their database, their HTTP port) with a deadline
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{diag()}")


class Airflow:
    """Airflow's four components as subprocesses of this one, each in its own session (signalled by pid).

    :param home: the AIRFLOW_HOME (made if missing); logs go to ``home/<component>.log``, tasks' to ``home/logs``.
    :param dags: the DAGs folder.
    :param env: extra environment (connections ``AIRFLOW_CONN_*``, config ``AIRFLOW__*``) over ``os.environ`` and
        the defaults below, which it may override; ``None`` drops a default (the key is as ``os.environ`` has it).
    :param triggerer_health_s: seconds after its last heartbeat that a triggerer counts as dead and its
        triggers go to another one (Airflow's default is 30; a restarted triggerer waits that long).
    """

    def __init__(self, home: Path, dags: Path, env: dict[str, str] | None = None, *,
                 triggerer_health_s: float = 10) -> None:
        self.home, self.dags = Path(home), Path(dags)
        self.home.mkdir(parents=True, exist_ok=True)
        self.db = self.home / "airflow.db"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = dict(
            AIRFLOW_HOME=str(self.home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__DAGS_FOLDER=str(self.dags), AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{self.db}",
            AIRFLOW__CORE__EXECUTOR="LocalExecutor", AIRFLOW__CORE__PARALLELISM="4",
            AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
            AIRFLOW__API__HOST="127.0.0.1", AIRFLOW__API__PORT=str(self.port), AIRFLOW__API__BASE_URL=self.base,
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"{self.base}/execution/",
            AIRFLOW__API_AUTH__JWT_SECRET="fstream-procs-test-jwt-secret-0123456789",
            AIRFLOW__API__SECRET_KEY="fstream-procs-test", AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
            AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),
            AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
            AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5", AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="1",
            AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC="1",
            AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD=f"{triggerer_health_s:g}",
            PYTHONUNBUFFERED="1")  # a component's log is read while it runs (and kept whole when it is killed)
        for key, value in (env or {}).items():
            if value is None:
                self.env.pop(key, None)
            else:
                self.env[key] = value
        self.env = {**os.environ, **self.env}
        self.procs: dict[str, subprocess.Popen] = {}
        self._token: str | None = None

    # -- processes -----------------------------------------------------------------------------------
    def migrate(self, timeout: float = 300) -> None:
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=self.env, cwd=self.home, check=True,
                       capture_output=True, timeout=timeout)

    def start(self, name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start component ``name`` (a key of ``COMPONENTS``), with ``env`` over ``self.env`` for this process only;
        its output is appended to ``home/<name>.log``. Returns its process."""
        assert name not in self.procs or self.procs[name].poll() is not None, f"{name} is already running"
        args = COMPONENTS[name] + (("--port", str(self.port)) if name == "api-server" else ())
        with open(self.home / f"{name}.log", "a") as log:
            log.write(f"\n===== airflow_procs: starting {name} at {time.strftime('%H:%M:%S')}\n")
            log.flush()
            # cwd is the home, where nothing can shadow a module Airflow imports
            self.procs[name] = subprocess.Popen([sys.executable, "-m", "airflow", *args],
                                                env={**self.env, **(env or {})}, cwd=self.home, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True)
        return self.procs[name]

    def start_all(self, names: Iterable[str] = tuple(COMPONENTS), timeout: float = 180) -> None:
        """Start ``names`` (default: all four) and wait for the api-server (if started) to answer."""
        for name in names:
            self.start(name)
        if "api-server" in names:
            self.wait_api(timeout)

    def stop(self, name: str, timeout: float = 30) -> bool:
        """SIGTERM ``name``'s process group (Airflow's graceful shutdown), SIGKILL after ``timeout`` seconds.
        True when it exited by itself."""
        p = self.procs.pop(name)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
                return False
        return True

    def kill(self, name: str) -> None:
        """SIGKILL ``name``'s whole process group (a crash, an OOM kill): nothing of it runs on."""
        p = self.procs.pop(name)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(10)

    def restart(self, name: str, *, kill: bool = False, stop_timeout: float = 30) -> bool:
        """Stop (SIGKILL after ``stop_timeout`` s) or ``kill`` ``name``, and start it again; an api-server is
        waited for. True when the stop ended it (by itself, not killed)."""
        graceful = False
        if kill:
            self.kill(name)
        else:
            graceful = self.stop(name, stop_timeout)
        self.start(name)
        if name == "api-server":
            self.wait_api()
        return graceful

    def stop_all(self, timeout: float = 30) -> None:
        for name in list(self.procs):
            self.stop(name, timeout)

    def alive(self, name: str) -> bool:
        return name in self.procs and self.procs[name].poll() is None

    def log(self, name: str) -> str:
        p = self.home / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def diag(self, names: Iterable[str] = ("scheduler", "triggerer"), tail: int = 2500) -> str:
        """The tails of the components' logs and the logs of failed tasks: what a failed wait shows."""
        return "\n".join([f"--- {n}.log\n{self.log(n)[-tail:]}" for n in names] + [self.failed_task_logs()])

    # -- the REST API ----------------------------------------------------------------------------------
    def api_up(self) -> bool:
        return is_up(self.base)

    def wait_api(self, timeout: float = 180) -> None:
        wait(lambda: self.api_up() or (not self.alive("api-server") and _raise(self.log("api-server")[-3000:])),
             timeout, "the api-server to answer", lambda: self.log("api-server")[-3000:])

    def token(self) -> str:
        """An admin's JWT (every user is an admin here: ``GET /auth/token`` hands one out)."""
        if self._token is None:
            with urllib.request.urlopen(self.base + "/auth/token", timeout=30) as r:
                self._token = json.loads(r.read())["access_token"]
        return self._token

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """``method path`` on ``/api/v2`` as an admin; the decoded JSON answer (HTTP errors raise)."""
        req = urllib.request.Request(self.base + "/api/v2" + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {self.token()}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:2000]!r}") from None

    def trigger(self, dag_id: str, conf: dict | None = None, run_id: str | None = None) -> str:
        """Trigger a run of ``dag_id`` now (as the UI's Trigger button does); returns its run id."""
        body: dict[str, Any] = {"logical_date": None, "conf": conf or {}}
        if run_id:
            body["dag_run_id"] = run_id
        return self.api("POST", f"/dags/{quote(dag_id, safe='')}/dagRuns", body)["dag_run_id"]

    # -- the database ----------------------------------------------------------------------------------
    def query(self, sql: str, *args: Any) -> list[tuple]:
        """Rows of ``sql`` on Airflow's database; none while its tables do not exist yet."""
        try:
            with sqlite3.connect(self.db, timeout=10) as c:
                return c.execute(sql, args).fetchall()
        except sqlite3.OperationalError:
            return []

    def wait_dag(self, dag_id: str, timeout: float = 180) -> None:
        """Wait until the dag-processor has stored ``dag_id`` (a run of it can be triggered)."""
        wait(lambda: self.query("select 1 from dag where dag_id = ? and is_stale = 0", dag_id), timeout,
             f"the dag-processor to parse {dag_id}", lambda: self.diag(("dag-processor",)))

    def runs(self, dag_id: str) -> list[tuple[str, str]]:
        """``(run_id, state)`` of ``dag_id``'s runs, oldest first."""
        return self.query("select run_id, state from dag_run where dag_id = ? order by id", dag_id)

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        rows = self.query("select state from dag_run where dag_id = ? and run_id = ?", dag_id, run_id)
        return rows[0][0] if rows else None

    def task(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> tuple[str | None, int]:
        """``(state, try_number)`` of a task instance (``(None, 0)`` before it exists)."""
        rows = self.query("select state, try_number from task_instance where dag_id = ? and run_id = ? "
                          "and task_id = ? and map_index = ?", dag_id, run_id, task_id, map_index)
        return (rows[0][0], rows[0][1]) if rows else (None, 0)

    def wait_task(self, dag_id: str, run_id: str, task_id: str, states: Iterable[str], timeout: float = 180,
                  map_index: int = -1) -> str:
        """Wait until the task instance is in one of ``states``; returns that state."""
        states = tuple(states)
        return wait(lambda: (s := self.task(dag_id, run_id, task_id, map_index)[0]) in states and s, timeout,
                    f"{dag_id}/{run_id}/{task_id} to be {'/'.join(states)}", self.diag)

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 180) -> str:
        """Wait until the DAG run finished; returns its state (``success`` or ``failed``)."""
        return wait(lambda: (s := self.run_state(dag_id, run_id)) in ("success", "failed") and s, timeout,
                    f"run {dag_id}/{run_id} to finish", self.diag)

    def task_logs(self, dag_id: str, run_id: str, task_id: str | None = None) -> str:
        """The task's log files (each try; the triggerer's part too), concatenated with their names."""
        pattern = f"dag_id={dag_id}/run_id={run_id}/task_id={task_id or '*'}/**/*"
        out = []
        for f in sorted((self.home / "logs").glob(pattern)):
            if f.is_file():
                out.append(f"--- {f.relative_to(self.home)}\n{f.read_text(errors='replace')[-4000:]}")
        return "\n".join(out)

    def trigger_logs(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1,
                     map_index: int = -1) -> dict[int, str]:
        """What each triggerer logged for the task's trigger, by the triggerer's job id (a triggerer that took the
        trigger over after another died writes a file of its own)."""
        d = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        if map_index >= 0:
            d = d / f"map_index={map_index}"
        out = {}
        for f in d.glob(f"attempt={try_number}.log.trigger.*.log"):
            out[int(f.name.rsplit(".", 2)[-2])] = f.read_text(errors="replace")
        return dict(sorted(out.items()))

    def failed_task_logs(self) -> str:
        """The logs of failed task instances (why a run failed)."""
        return "\n".join(self.task_logs(d, r, t) for d, r, t in
                         self.query("select dag_id, run_id, task_id from task_instance where state = 'failed'"))


def _raise(text: str) -> bool:
    raise AssertionError(f"the process exited:\n{text}")
