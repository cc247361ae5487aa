"""The ``fstream`` connection form: what Airflow's UI gets for it, and that each field reaches the hook.

The slow test starts a real api-server (private AIRFLOW_HOME, sqlite, simple auth manager with everyone an
admin) and asks the endpoint the UI's connection form is built from, ``GET /ui/connections/hook_meta``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
pytest.importorskip("airflow")

from fstream_provider.bus.embedded import free_port  # noqa: E402

EXTRA_FIELDS = {"url", "secret_file", "namespace", "agent_group", "ssl", "tls_cert", "tls_key", "tls_ca"}


def _connection(**extra):
    from airflow.models.connection import Connection

    return Connection(conn_id="fstream_form", conn_type="fstream", host="redis.example.org", port=6380,
                      schema="2", extra=json.dumps(extra))


@pytest.mark.parametrize("field,value,attr,expected", [
    ("secret_file", "/etc/fstream/secret", "secret_file", "/etc/fstream/secret"),
    ("namespace", "beamline7", "namespace", "beamline7"),
    ("agent_group", "xpp", "agent_group", "xpp"),
    ("ssl", True, "redis_url", "rediss://redis.example.org:6380/2"),
    ("url", "redis://other.example.org:6390/5", "redis_url", "redis://other.example.org:6390/5"),
])
def test_each_form_field_reaches_the_hook_settings(field, value, attr, expected):
    """The form stores the field under its own name in ``extra`` (as the UI does); the hook must read it."""
    from fstream_provider.hooks.fstream import settings_from_connection

    assert getattr(settings_from_connection(_connection(**{field: value})), attr) == expected


def test_an_empty_form_keeps_the_defaults():
    """The UI stores empty fields as null (and ssl as false): that is host/port/db and namespace ``fstream``."""
    from fstream_provider.hooks.fstream import settings_from_connection

    s = settings_from_connection(_connection(**{f: None for f in EXTRA_FIELDS} | {"ssl": False}))
    assert (s.redis_url, s.namespace, s.secret_file, s.agent_group) == (
        "redis://redis.example.org:6380/2", "fstream", None, None)


def _get(url: str, token: str | None = None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture
def api_server(tmp_path):
    """A real ``airflow api-server`` on a free port; yields its base URL; stopped by its process group."""
    home, port = tmp_path / "airflow", free_port()
    home.mkdir()
    env = dict(os.environ, AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
               AIRFLOW__CORE__DAGS_FOLDER=str(tmp_path / "dags"),
               AIRFLOW__API__HOST="127.0.0.1", AIRFLOW__API__PORT=str(port),
               AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{port}",
               AIRFLOW__API_AUTH__JWT_SECRET="fstream-form-test-jwt-secret-0123456789",
               AIRFLOW__API__SECRET_KEY="fstream-form-test", AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
               AIRFLOW__CORE__TEST_CONNECTION="Enabled")
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, cwd=home, check=True,
                   capture_output=True, timeout=300)
    log = open(home / "api-server.log", "a")
    proc = subprocess.Popen([sys.executable, "-m", "airflow", "api-server", "--port", str(port), "--workers", "1"],
                            env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                _get(base + "/api/v2/monitor/health")
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("api-server did not come up:\n"
                                         + (home / "api-server.log").read_text(errors="replace")[-3000:])
                time.sleep(0.5)  # polling another process with a deadline
        yield base
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.mark.slow
def test_the_api_server_serves_the_fstream_form(api_server):
    """``/ui/connections/hook_meta`` (what the Add Connection form renders) lists type fstream with our fields,
    labels and relabeled standard fields."""
    token = _get(api_server + "/auth/token")["access_token"]
    meta = {m["connection_type"]: m for m in _get(api_server + "/ui/connections/hook_meta", token)}
    assert "fstream" in meta, sorted(meta)
    form = meta["fstream"]
    assert form["hook_name"] == "FStream"
    fields = form["extra_fields"] or {}
    assert set(fields) == EXTRA_FIELDS, sorted(fields)
    assert fields["secret_file"]["schema"]["title"] == "Secret file"
    assert fields["namespace"]["value"] == "fstream"
    assert fields["ssl"]["schema"]["type"] == ["boolean", "null"]
    standard = form["standard_fields"]  # the UI calls the schema field url_schema
    assert (standard["host"]["title"], standard["port"]["placeholder"], standard["url_schema"]["title"]) == (
        "Redis host", "6379", "Redis database")


def test_the_connection_tls_files_reach_jobs_that_name_none(monkeypatch, redis_url):
    """Like ``secret_file``, the TLS fields of the form are defaults for the jobs submitted through the hook."""
    from urllib.parse import quote, urlparse

    from fstream_provider.hooks.fstream import FStreamHook
    from fstream_provider.model.spec import TransferSpec

    u = urlparse(redis_url)
    tls = {"tls_cert": "/etc/fstream/tls/client.pem", "tls_key": "/etc/fstream/tls/client.key",
           "tls_ca": "/etc/fstream/tls/ca.pem"}
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in tls.items())
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_TLSFORM", f"fstream://{u.hostname}:{u.port}/0?namespace=tlsform&{query}")
    hook = FStreamHook(fstream_conn_id="fstream_tlsform")
    try:
        job_id, _ = hook.submit(TransferSpec(sources=["/data/a"], destination="fstream://127.0.0.1:9/x"),
                                idempotency_key="tls-form-test")
        spec = hook.get_job(job_id).spec
        assert {k: getattr(spec, k) for k in tls} == tls
    finally:
        hook.close()
