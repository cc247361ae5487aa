"""Who sees what on the FStream page (issue 41): per-connection access, jobs without a task, a deleted DAG's jobs.

A real ``airflow api-server`` (tests/airflowkit.py) with the provider's plugin and a real ``redis-server``; the
users are real logins of a SimpleAuthManager subclass written here (``AUTH_MANAGER``): ``admin`` (ADMIN),
``ops`` (OP: may read connections, not an admin) and ``viewer`` (VIEWER: may read one DAG, and of the ``fstream``
connections only ``fstream_shared``). Jobs are submitted on three namespaces of the bus, one per connection,
with the operator's idempotency key where a job belongs to a task: of a DAG in Airflow's database, of a DAG
that is not (deleted), and with none (``fstream submit``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
pytest.importorskip("airflow")

from fstream_provider.bus.client import connect  # noqa: E402
from fstream_provider.bus.embedded import RedisServer  # noqa: E402
from fstream_provider.bus.jobs import JobStore  # noqa: E402
from fstream_provider.bus.keys import Keys  # noqa: E402
from fstream_provider.model.spec import TransferSpec  # noqa: E402

import authkit  # noqa: E402
from airflowkit import api_server, http, token  # noqa: E402

DAG, GONE_DAG = "fstream_access_dag", "fstream_access_deleted"
NAMESPACES = {"fstream_default": "fstream", "fstream_shared": "fsshared", "fstream_other": "fsother"}

DAGS = '''
"""A DAG of tests/test_live_view_access.py (only its id matters: the jobs are submitted by the test)."""
from datetime import datetime

from airflow.sdk import DAG, task

with DAG("fstream_access_dag", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    @task
    def copy():
        return None

    copy()
'''

AUTH_MANAGER = r'''
"""SimpleAuthManager plus ``ops`` (OP) and ``viewer`` (VIEWER) who may read one DAG and one connection (tests)."""
import os

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] = (
    os.environ.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS") or "admin:admin") + ",viewer:viewer,ops:op"


class PerConnectionAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        if getattr(user, "username", None) == "viewer" and details is not None and details.id != "fstream_access_dag":
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)

    def is_authorized_connection(self, *, method, user, details=None):
        if getattr(user, "username", None) == "viewer" and method == "GET" and details is not None \
                and details.conn_id == "fstream_shared":
            return True
        return super().is_authorized_connection(method=method, user=user, details=details)
'''


@pytest.fixture(scope="module")
def bus(tmp_path_factory):
    server = RedisServer(str(tmp_path_factory.mktemp("redis")))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def jobs(bus) -> dict[str, str]:
    """The jobs on the bus, by what they are: ``dag``, ``free`` (no task), ``gone`` (a deleted DAG's), ``shared``,
    ``other`` (one on each other connection's namespace)."""
    client = connect(bus)
    out = {}
    try:
        def submit(what: str, namespace: str, key: str | None) -> None:
            store = JobStore(client, keys=Keys(namespace), signer=authkit.signer())
            out[what], _ = store.submit(TransferSpec(sources=[f"/data/{what}"], destination="fstream://127.0.0.1:9/x",
                                                     label=f"access-{what}"), idempotency_key=key)

        submit("dag", "fstream", f"{DAG}/manual__2026-01-01T00:00:00+00:00/copy/-1")
        submit("gone", "fstream", f"{GONE_DAG}/manual__2026-01-01T00:00:00+00:00/copy/-1")
        submit("free", "fstream", None)
        submit("shared", NAMESPACES["fstream_shared"], None)
        submit("other", NAMESPACES["fstream_other"], None)
    finally:
        client.close()
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory, bus):
    """A migrated AIRFLOW_HOME whose database knows ``DAG`` (not ``GONE_DAG``), and a running api-server."""
    home = tmp_path_factory.mktemp("airflow-home")
    (home / "dags").mkdir()
    (home / "dags" / "fstream_access_dags.py").write_text(DAGS)
    (home / "lib").mkdir()
    (home / "lib" / "fstream_access_test_auth.py").write_text(AUTH_MANAGER)
    conn = bus.replace("redis://", "fstream://", 1) + "?" + authkit.conn_query()
    env = dict(os.environ, AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
               FSTREAM_STATE_DIR=str(home / "fstream-state"),
               AIRFLOW__CORE__AUTH_MANAGER="fstream_access_test_auth.PerConnectionAuthManager",
               PYTHONPATH=os.pathsep.join([str(home / "lib"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    for conn_id, ns in NAMESPACES.items():
        env[f"AIRFLOW_CONN_{conn_id.upper()}"] = conn + f"&namespace={ns}"
    for cmd in (["db", "migrate"], ["dags", "reserialize"]):
        subprocess.run([sys.executable, "-m", "airflow", *cmd], env=env, check=True, capture_output=True, timeout=300)
    with api_server(env) as base:
        passwords = json.loads((home / "test-passwords.json").read_text())
        yield {"base": base, "admin": token(base), "viewer": token(base, "viewer", passwords["viewer"]),
               "ops": token(base, "ops", passwords["ops"])}


def _data(site: dict, who: str, conn_id: str | None = None) -> tuple[int, dict]:
    q = f"?conn_id={conn_id}" if conn_id else ""
    status, _ctype, body = http(site["base"] + "/fstream/live/data" + q, site[who])
    return status, (json.loads(body) if status == 200 else {"detail": body.decode(errors="replace")})


def _ids(data: dict) -> set[str]:
    return {j["job_id"] for j in data["jobs"]}


def test_a_user_chooses_only_a_connection_airflow_lets_them_read(site, jobs):
    base = site["base"]
    for route in ("/fstream/live", "/fstream/live/data", "/fstream/live/stream"):
        status, _ctype, body = http(f"{base}{route}?conn_id=fstream_other", site["viewer"])
        assert status == 403 and b"fstream_other" in body, (route, status, body[:300])
    status, data = _data(site, "viewer", "nope")  # refused before the lookup: no hint whether it exists
    assert status == 403, data
    status, data = _data(site, "viewer", "fstream_shared")  # the one connection the viewer may read
    assert status == 200 and jobs["shared"] in _ids(data), data
    for who in ("admin", "ops"):
        status, data = _data(site, who, "fstream_other")
        assert status == 200 and _ids(data) == {jobs["other"]}, (who, data)
    assert _data(site, "admin", "nope")[0] == 404 and _data(site, "admin", "not_there")[0] == 404
    status, _ctype, body = http(f"{base}/fstream/live?conn_id=fstream_other", site["admin"])
    assert status == 200 and b"fstream_other" in body


def test_jobs_without_an_airflow_task_are_for_those_who_may_read_the_bus(site, jobs):
    status, data = _data(site, "viewer")
    assert status == 200 and jobs["dag"] in _ids(data), data  # what the viewer may read is there
    assert jobs["free"] not in _ids(data) and data["hidden"]["jobs"] == 2  # the free job and the deleted DAG's
    for who in ("admin", "ops"):
        assert {jobs["dag"], jobs["free"]} <= _ids(_data(site, who)[1]), who
    # the pushed overview filters the same way
    from test_airflow_live_view import _sse

    with _sse(site["base"], "/fstream/live/stream", site["viewer"]) as s:
        frame = next(f for f in iter(s.next, None) if f[0] == "overview")
    assert {j["job_id"] for j in frame[2]["jobs"]} == {jobs["dag"]}


def test_a_deleted_dags_jobs_are_visible_to_admins(site, jobs):
    for who in ("admin", "ops"):
        status, data = _data(site, who)
        row = next((j for j in data["jobs"] if j["job_id"] == jobs["gone"]), None)
        assert status == 200 and row is not None and row["airflow"]["dag_id"] == GONE_DAG, (who, data)
    assert jobs["gone"] not in _ids(_data(site, "viewer")[1])
