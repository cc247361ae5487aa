"""The Airflow rigs tests and benchmarks share (``fstream_bench.airflow.procs``): what a caller may change."""

from __future__ import annotations

import pytest

pytest.importorskip("airflow")

from fstream_bench.airflow import procs, triggerer  # noqa: E402


def test_procs_env_overrides_a_default_and_none_leaves_the_key_to_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC", "7")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    af = procs.Airflow(tmp_path / "home", tmp_path / "dags", {
        "AIRFLOW__CORE__PARALLELISM": "32", "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": None, "PYTHONUNBUFFERED": None,
        "FSTREAM_PROBE": "yes"})
    assert af.env["AIRFLOW__CORE__PARALLELISM"] == "32"  # a default, overridden
    assert af.env["AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC"] == "7"  # the default dropped: the environment's value
    assert "PYTHONUNBUFFERED" not in af.env  # dropped, and not in the environment
    assert af.env["FSTREAM_PROBE"] == "yes" and af.env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"


def test_triggerer_bench_runs_airflow_with_its_own_settings_and_airflows_heartbeats(tmp_path, monkeypatch):
    monkeypatch.setenv("FSTREAM_STATE_DIR", str(tmp_path / "state"))
    for key in ("AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC", "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD",
                "PYTHONUNBUFFERED"):
        monkeypatch.delenv(key, raising=False)
    af = triggerer.airflow(tmp_path, "redis://127.0.0.1:6399", tmp_path / "k.key", tasks=200)
    env = af.env
    assert (env["AIRFLOW__CORE__PARALLELISM"], env["AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG"]) == ("32", "216")
    assert env["AIRFLOW__LOGGING__LOGGING_LEVEL"] == "WARNING" and env["AIRFLOW__CORE__DAGS_FOLDER"] == str(
        tmp_path / "dags")
    assert not {"AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC", "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD",
                "PYTHONUNBUFFERED"} & set(env)
    conn = env["AIRFLOW_CONN_FSTREAM_DEFAULT"]
    assert conn.startswith("fstream://127.0.0.1:6399?submitter=bench&") and "trusted_agents=" in conn
    assert env["AIRFLOW__API__BASE_URL"] == af.base and env["FSTREAM_STATE_DIR"] == str(tmp_path / "fstream-state")


def test_a_component_starts_with_its_own_environment_over_the_rigs(tmp_path, monkeypatch):
    """``start(name, env=...)``: one process gets more environment (the triggerer bench's mode switch), the rig's
    own ``env`` stays as it was. A real ``airflow config get-value`` shows what the process saw."""
    monkeypatch.setitem(procs.COMPONENTS, "probe", ("config", "get-value", "core", "parallelism"))
    af = procs.Airflow(tmp_path / "home", tmp_path / "dags")
    proc = af.start("probe", env={"AIRFLOW__CORE__PARALLELISM": "23"})
    assert proc.wait(120) == 0, af.log("probe")
    assert af.log("probe").strip().splitlines()[-1] == "23"
    assert af.env["AIRFLOW__CORE__PARALLELISM"] == "4"
