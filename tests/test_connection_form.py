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

EXTRA_FIELDS = {"url", "submitter", "submitter_secret", "submitter_key_file", "key", "namespace", "agent_group", "ssl"}


def _connection(**extra):
    from airflow.models.connection import Connection

    return Connection(conn_id="fstream_form", conn_type="fstream", host="redis.example.org", port=6380,
                      schema="2", extra=json.dumps(extra))


@pytest.mark.parametrize("field,value,attr,expected", [
    ("submitter", "lcls-daq", "submitter", "lcls-daq"),
    ("submitter_secret", "0123456789abcdef0123", "submitter_secret", "0123456789abcdef0123"),
    ("submitter_key_file", "/etc/fstream/submitters/lcls-daq.key", "submitter_key_file",
     "/etc/fstream/submitters/lcls-daq.key"),
    ("key", "beamline7", "key", "beamline7"),
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
    assert (s.redis_url, s.namespace, s.agent_group, s.key) == ("redis://redis.example.org:6380/2", "fstream", None, None)
    assert (s.submitter, s.submitter_secret, s.submitter_key_file) == (None, None, None)


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
    assert fields["submitter"]["schema"]["title"] == "Submitter id"
    assert fields["submitter_secret"]["schema"]["format"] == "password"  # rendered masked
    assert fields["submitter_key_file"]["schema"]["title"] == "Submitter key file"
    assert (fields["key"]["value"], fields["namespace"]["value"]) == ("default", "fstream")
    assert fields["ssl"]["schema"]["type"] == ["boolean", "null"]
    standard = form["standard_fields"]  # the UI calls the schema field url_schema
    assert (standard["host"]["title"], standard["port"]["placeholder"], standard["url_schema"]["title"]) == (
        "Redis host", "6379", "Redis database")


def _form_hook(monkeypatch, redis_url: str, conn_id: str, **extra: str):
    """A hook on connection ``conn_id`` whose extras are ``extra`` (as the form stores them), on the test Redis."""
    from urllib.parse import urlencode, urlparse

    from fstream_provider.hooks.fstream import FStreamHook

    u = urlparse(redis_url)
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}",
                       f"fstream://{u.hostname}:{u.port}/0?" + urlencode({"namespace": "form", **extra}))
    return FStreamHook(fstream_conn_id=conn_id)


def _spec():
    from fstream_provider.model.spec import TransferSpec

    return TransferSpec(sources=["/data/a"], destination="fstream://127.0.0.1:9/x")


def test_the_submitter_fields_sign_jobs_and_the_key_id_reaches_them(monkeypatch, redis_url, redis_client):
    """The inline submitter key signs each job so the agents can verify it; the ``key`` field becomes the job's
    key id (jobs name keys by id, never by file)."""
    import authkit
    from fstream_provider.model.keyfile import read_key_file
    from fstream_provider.model.signing import JobAuth, verify

    secret = read_key_file(authkit.key_file(), "test submitter key").decode()
    hook = _form_hook(monkeypatch, redis_url, "fstream_signform", submitter="lcls-daq", submitter_secret=secret,
                      key="beamline7")
    try:
        job_id, created = hook.submit(_spec(), idempotency_key="sign-form-test")
        assert created
        assert hook.get_job(job_id).spec.key == "beamline7"
        h = redis_client.hgetall(hook.keys.job(job_id))
        auth = JobAuth.from_json(h["auth"])
        assert auth is not None and auth.submitter == "lcls-daq"
        assert verify(secret.encode(), auth, "form", job_id, h["spec"])
    finally:
        hook.close()


@pytest.mark.parametrize("extra", [{"secret_file": "/etc/fstream/secret"},
                                   {"tls_cert": "/etc/fstream/tls/client.pem", "tls_key": "/etc/fstream/tls/client.key",
                                    "tls_ca": "/etc/fstream/tls/ca.pem"}])
def test_a_connection_naming_key_files_is_refused_at_submit_naming_them(monkeypatch, redis_url, redis_client, extra):
    """The old ``secret_file``/``tls_*`` extras named files on the agents' hosts; jobs may not (issue 32), so a
    connection still carrying them is refused, by name, before anything is queued."""
    import authkit
    from urllib.parse import parse_qsl

    hook = _form_hook(monkeypatch, redis_url, "fstream_keyfiles", **dict(parse_qsl(authkit.conn_query())), **extra)
    try:
        with pytest.raises(ValueError) as exc:
            hook.submit(_spec(), idempotency_key="key-files-form-test")
        msg = str(exc.value)
        assert "'fstream_keyfiles'" in msg and all(name in msg for name in extra), msg
        assert "'key'" in msg, msg  # says what to use instead
        assert redis_client.dbsize() == 0, "a refused submit queued something"
    finally:
        hook.close()


def test_a_connection_without_a_submitter_is_refused_at_submit_naming_it(monkeypatch, redis_url):
    hook = _form_hook(monkeypatch, redis_url, "fstream_anon", key="default")
    try:
        with pytest.raises(ValueError, match="'submitter'") as exc:
            hook.submit(_spec(), idempotency_key="anon-form-test")
        assert "submitter_secret" in str(exc.value) and "submitter_key_file" in str(exc.value)
    finally:
        hook.close()
