"""The ``fstream`` connection form: what Airflow's UI gets for it, and that each field reaches the hook.

The slow tests start a real api-server (private AIRFLOW_HOME, sqlite, simple auth manager with everyone an
admin) and ask the endpoint the UI's connection form is built from, ``GET /ui/connections/hook_meta``; what
the React form makes of that answer is mirrored from the UI bundle Airflow 3.3.2 ships
(``airflow/ui/dist/assets/index-*.js``), and, where Playwright and a Chromium are installed, seen in the form
itself.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
pytest.importorskip("airflow")

import airflowkit  # noqa: E402

EXTRA_FIELDS = {"url", "submitter", "submitter_secret", "submitter_key_file", "key", "namespace", "agent_group",
                "trusted_agents", "ssl"}


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


def _ui_extra_prefill(extra_fields: dict) -> dict:
    """The Extra Fields JSON Airflow 3.3.2's Add Connection form pre-fills, and saves unless the user edits it.

    Mirrored from ``airflow/ui/dist/assets/index-*.js`` (sources ``ConnectionForm.tsx``, ``FlexibleForm.tsx``,
    ``useParamStore.ts``): the form hands ``hook_meta``'s ``extra_fields`` to ``FlexibleForm`` as
    ``initialParamsDict``, which puts a ``structuredClone`` of it in the param store with ``setParamsDict``;
    that sets ``conf = JSON.stringify(Object.fromEntries(Object.entries(paramsDict).map(([k, {value}]) =>
    [k, value])), undefined, 2)``, and the form's ``extra`` follows ``conf``. So every field is a key, with its
    ``value`` (the schema's ``default``, ``null`` without one); ``JSON.stringify`` drops only ``undefined``.
    Clearing a text field later sets its value to ``null`` (``value = t === "" ? null : t``).
    """
    return {name: spec["value"] for name, spec in extra_fields.items() if "value" in spec}


def _ui_string_input(spec: dict) -> dict:
    """What the form's text input for an extra field shows (``FieldString`` in the same bundle): the placeholder
    ``flexibleForm.placeholderExamples`` ("Start typing to see options") and a ``<datalist>`` of
    ``schema.examples`` when there are examples, and under it the field's ``description`` (else
    ``schema.description_md``). It reads no other placeholder: not ``schema.placeholder``, and the api-server
    keeps ``ui-field-behaviour`` placeholders for the standard fields only (``_make_standard_fields``)."""
    examples = spec["schema"].get("examples")
    return {"placeholder": "Start typing to see options" if examples else None, "suggestions": examples or [],
            "help": spec["description"] if spec.get("description") is not None else spec["schema"].get(
                "description_md"), "value": spec["value"] if spec["value"] is not None else ""}


def _local_extra_fields() -> dict:
    """``extra_fields`` of ``hook_meta`` for ``fstream`` as the api-server builds it (no server needed)."""
    import subprocess

    code = ("import json; from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService as H; "
            "print(json.dumps([m.model_dump(mode='json') for m in H.hook_meta_data() "
            "if m.connection_type == 'fstream'][0]['extra_fields']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, AIRFLOW__CORE__LOAD_EXAMPLES="False"))
    return json.loads(out.stdout.strip().splitlines()[-1])


PREFILL = {"url": "", "submitter": "", "submitter_secret": None, "submitter_key_file": "", "key": "default",
           "namespace": "fstream", "agent_group": "", "trusted_agents": "", "ssl": False}
"""The Extra Fields JSON of a new ``fstream`` connection: only the masked key is ``null`` (see
``test_a_masked_field_cannot_have_a_non_null_default``)."""


def _assert_the_form_shows_the_examples_and_prefills_no_null_but_the_key(fields: dict) -> None:
    from fstream_provider.provider_info import EXTRA_PLACEHOLDERS

    assert set(EXTRA_PLACEHOLDERS) <= set(fields)
    for name, example in EXTRA_PLACEHOLDERS.items():
        shown = _ui_string_input(fields[name])
        assert shown["placeholder"] and shown["suggestions"] == [example], (name, shown)
        assert example in shown["help"] or shown["value"] == example, (name, shown)  # always visible
    assert _ui_extra_prefill(fields) == PREFILL
    assert [name for name, spec in fields.items() if spec["value"] is None] == ["submitter_secret"]


def test_the_form_shows_the_examples_and_prefills_no_null_but_the_key():
    """``hook_meta`` as the api-server builds it in-process: each free-text field carries its example where the
    form shows one, and the Extra Fields JSON the form computes from it holds no ``null`` but the masked key."""
    _assert_the_form_shows_the_examples_and_prefills_no_null_but_the_key(_local_extra_fields())


def test_a_masked_field_cannot_have_a_non_null_default():
    """Why ``submitter_secret`` pre-fills ``null``: the api-server's ``ConnectionHookMetaData`` redacts any
    non-null default of a sensitive-named extra field (``redact_extra_fields``), so an ``""`` default would
    reach the form as ``"***"``, and the form would pre-fill and save that as the key."""
    from airflow.api_fastapi.core_api.datamodels.connections import ConnectionHookMetaData

    def served(default):
        spec = {"value": default, "schema": {"type": ["string", "null"], "format": "password"}, "description": None,
                "source": None}
        meta = ConnectionHookMetaData(connection_type="fstream", hook_class_name=None, default_conn_name=None,
                                      hook_name="FStream", standard_fields=None,
                                      extra_fields={"submitter_secret": spec, "submitter": dict(spec)})
        return {k: v["value"] for k, v in meta.extra_fields.items()}

    assert served("") == {"submitter_secret": "***", "submitter": ""}
    assert served(None) == {"submitter_secret": None, "submitter": None}


@pytest.mark.parametrize("extra", [PREFILL, {f: None for f in EXTRA_FIELDS} | {"ssl": False}],
                         ids=["as-prefilled", "all-cleared"])
def test_an_empty_form_keeps_the_defaults(extra):
    """An untouched form saves ``PREFILL``; a field the user cleared is saved as null (ssl as false): either way
    that is host/port/db, namespace ``fstream`` and no submitter."""
    from fstream_provider.hooks.fstream import settings_from_connection

    s = settings_from_connection(_connection(**extra))
    assert (s.redis_url, s.namespace, s.agent_group) == ("redis://redis.example.org:6380/2", "fstream", None)
    assert s.key in (None, "default")  # None: the agents' default key, which is named "default"
    assert (s.submitter, s.submitter_secret, s.submitter_key_file) == (None, None, None)


TEXT_EXTRAS = ("url", "redis_url", "namespace", "secret_file", "agent_group", "tls_cert", "tls_key", "tls_ca",
               "submitter", "submitter_secret", "submitter_key_file", "key")
"""Every extra ``settings_from_connection`` reads as text."""


@pytest.mark.parametrize("connection_class", ["airflow.models.connection.Connection", "airflow.sdk.Connection"])
@pytest.mark.parametrize("unset", ["", None, "   ", " \t\n "], ids=["empty", "null", "blanks", "whitespace"])
def test_empty_null_and_blank_extras_read_as_unset(connection_class, unset):
    """Issue 41 item 13: Airflow's form saves every declared extra, an empty one as ``""`` or ``null``, and keeps the
    blanks a user typed. On real ``Connection`` objects (the api-server's and the task SDK's) each of these reads as
    unset: the settings are exactly those of a connection without extras (blanks were read as a Redis URL ``"   "``,
    a namespace, a submitter, key files that submit then refused)."""
    import importlib

    from fstream_provider.hooks.fstream import FStreamSettings, settings_from_connection

    module, name = connection_class.rsplit(".", 1)
    conn = getattr(importlib.import_module(module), name)(
        conn_id="fstream_blank", conn_type="fstream", host="redis.example.org", port=6380, schema="2",
        extra=json.dumps({f: unset for f in (*TEXT_EXTRAS, "ssl")}))
    assert settings_from_connection(conn) == FStreamSettings(redis_url="redis://redis.example.org:6380/2",
                                                             source="connection 'fstream_blank'")


def test_extras_with_surrounding_blanks_are_read_without_them():
    from fstream_provider.hooks.fstream import settings_from_connection

    s = settings_from_connection(_connection(url=" redis://other.example.org:6390/5\n", submitter=" lcls-daq ",
                                             key="beamline7 ", namespace="\tbeamline7"))
    assert (s.redis_url, s.submitter, s.key, s.namespace) == ("redis://other.example.org:6390/5", "lcls-daq",
                                                              "beamline7", "beamline7")


def test_the_form_says_the_port_is_required():
    """Issue 41 item 13: Airflow 3.3's Test button sends ``port: Number(null)`` = 0 for a saved connection without a
    port, which the API refuses (400: "the host or port to test differs from the stored connection") before the hook
    runs; the provider cannot default a standard field, so the form says the port is required."""
    from fstream_provider.provider_info import UI_FIELD_BEHAVIOUR

    assert "required" in UI_FIELD_BEHAVIOUR["relabeling"]["port"]
    assert UI_FIELD_BEHAVIOUR["placeholders"]["port"] == "6379"


def _get(url: str, token: str | None = None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def api_server(tmp_path_factory):
    """A real ``airflow api-server`` on a free port, shared by this module's tests; yields its base URL; stopped by
    its process group."""
    tmp_path = tmp_path_factory.mktemp("form")
    home = tmp_path / "airflow"
    home.mkdir()
    env = dict(os.environ, AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
               AIRFLOW__CORE__DAGS_FOLDER=str(tmp_path / "dags"), AIRFLOW__CORE__TEST_CONNECTION="Enabled")
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, cwd=home, check=True,
                   capture_output=True, timeout=300)
    with airflowkit.api_server(env, all_admins=True) as base:
        yield base


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
    _assert_the_form_shows_the_examples_and_prefills_no_null_but_the_key(fields)


def _post(url: str, body: dict, token: str) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.slow
def test_a_connection_saved_as_the_form_saves_it_keeps_the_prefill_and_reaches_the_hook(api_server):
    """Save what the untouched form sends (``addConnection`` in the UI bundle: ``extra`` is the JSON text as
    shown, ``host`` what was typed; empty standard fields are left out) and read it back from the API: the
    stored extra is the pre-fill, no ``null`` but the masked key, and the hook reads it as the defaults."""
    from airflow.models.connection import Connection
    from fstream_provider.hooks.fstream import settings_from_connection

    token = _get(api_server + "/auth/token")["access_token"]
    meta = {m["connection_type"]: m for m in _get(api_server + "/ui/connections/hook_meta", token)}
    extra = json.dumps(_ui_extra_prefill(meta["fstream"]["extra_fields"]), indent=2)
    _post(api_server + "/api/v2/connections", {"conn_type": "fstream", "connection_id": "fstream_saved_form",
                                               "extra": extra, "host": "redis.example.org"}, token)
    saved = _get(api_server + "/api/v2/connections/fstream_saved_form", token)
    assert json.loads(saved["extra"]) == PREFILL
    conn = Connection(conn_id="fstream_saved_form", conn_type="fstream", host=saved["host"], extra=saved["extra"])
    s = settings_from_connection(conn)
    assert (s.redis_url, s.namespace, s.key, s.submitter) == ("redis://redis.example.org:6379/0", "fstream",
                                                              "default", None)


@pytest.mark.slow
def test_the_providers_api_gives_fstream_its_own_docs_url(api_server):
    """``GET /api/v2/providers`` (what the Providers page links the package name to) names FStream's own docs."""
    from test_provider_info import DOCS_URL

    token = _get(api_server + "/auth/token")["access_token"]
    providers = {p["package_name"]: p for p in _get(api_server + "/api/v2/providers", token)["providers"]}
    assert providers["fstream"]["documentation_url"] == DOCS_URL


def _browser():
    """Playwright driving the system Chromium (its own browser download cannot work here), or skip."""
    import shutil

    sync_api = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("no chromium binary")
    return sync_api, chromium


@pytest.mark.slow
def test_the_add_connection_form_in_a_browser(api_server):
    """The real form in Chromium: each free-text extra field offers its example (placeholder "Start typing to
    see options", a datalist with the example, the example in the help text or as the value); Save posts the
    pre-fill, no ``null`` but the masked key; the Providers page links ``fstream`` to its own docs."""
    from fstream_provider.provider_info import EXTRA_PLACEHOLDERS
    from test_provider_info import DOCS_URL

    sync_api, chromium = _browser()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.goto(api_server + "/connections", wait_until="networkidle")
            page.get_by_role("button", name="Add Connection").click()
            dialog = page.get_by_role("dialog")
            dialog.get_by_role("combobox").first.fill("FStream")
            page.keyboard.press("Enter")
            dialog.locator("input[name=connection_id]").fill("fstream_browser_form")
            dialog.locator("input[name=host]").fill("redis.example.org")
            dialog.get_by_role("button", name="Extra Fields", exact=True).click()
            for name, example in EXTRA_PLACEHOLDERS.items():
                field = dialog.locator(f"#element_{name}")
                assert field.get_attribute("placeholder") == "Start typing to see options", name
                assert [o.get_attribute("value") for o in dialog.locator(f"#list_{name} option").all()] == [example]
                shown = field.evaluate("e => e.closest('[data-part=root]').innerText")
                assert example in shown or field.input_value() == example, (name, shown)
            with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/api/v2/connections")) as req:
                dialog.get_by_role("button", name="Save").click()
            posted = json.loads(req.value.post_data)
            assert json.loads(posted["extra"]) == PREFILL, posted

            page.goto(api_server + "/providers", wait_until="networkidle")
            link = page.get_by_role("link", name="fstream", exact=True)
            assert link.get_attribute("href") == DOCS_URL
            assert link.evaluate("e => e.href") == f"{api_server}/{DOCS_URL}"
        finally:
            browser.close()


@pytest.mark.slow
def test_a_connection_saved_by_the_form_with_empty_fields_tests_and_reads_as_the_defaults(api_server, redis_url,
                                                                                           monkeypatch):
    """Issue 41 item 13, in Chromium against the real api-server and a real Redis: save a connection with the optional
    extra fields left empty (as pre-filled), cleared, or holding blanks; the REST API gives back what Airflow stored,
    every declared field with ``""``, ``null`` or the blanks (Airflow has no way to leave a key out); the row's Test
    button runs the hook on the api-server and it answers PING on the Redis of host and port; and the hook in a task
    reads the stored connection as the defaults."""
    from urllib.parse import urlparse

    from fstream_provider.bus.client import describe
    from fstream_provider.hooks.fstream import FStreamHook, FStreamSettings

    redis = urlparse(redis_url)
    conn_id = "fstream_form_empties"
    token = _get(api_server + "/auth/token")["access_token"]
    with airflowkit.browser_page(api_server, token, viewport={"width": 1400, "height": 2400}) as page:
        page.goto(api_server + "/connections", wait_until="networkidle")
        page.get_by_role("button", name="Add Connection").click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_role("combobox").first.fill("FStream")
        page.keyboard.press("Enter")
        dialog.locator("input[name=connection_id]").fill(conn_id)
        dialog.locator("input[name=host]").fill(redis.hostname)
        dialog.locator("input[name=port]").fill(str(redis.port))
        if redis.password:
            dialog.locator("input[name=password]").fill(redis.password)
        dialog.get_by_role("button", name="Extra Fields", exact=True).click()
        dialog.locator("#element_url").fill("   ")  # blanks typed into the URL
        dialog.locator("#element_key").fill(" ")
        for name in ("namespace", "agent_group"):  # typed into, then cleared
            dialog.locator(f"#element_{name}").fill("x")
            dialog.locator(f"#element_{name}").fill("")
        with page.expect_response(lambda r: r.request.method == "POST" and r.url.endswith("/api/v2/connections")) as rs:
            dialog.get_by_role("button", name="Save").click()
        assert rs.value.status == 201, rs.value.text()

        saved = _get(f"{api_server}/api/v2/connections/{conn_id}", token)
        assert json.loads(saved["extra"]) == {"url": "   ", "submitter": "", "submitter_secret": None,
                                              "submitter_key_file": "", "key": " ", "namespace": None,
                                              "agent_group": None, "trusted_agents": "", "ssl": False}

        page.goto(api_server + "/connections", wait_until="networkidle")
        row = page.get_by_role("row").filter(has_text=conn_id)
        row.get_by_role("button", name="Test Connection").click()
        title = page.get_by_text(re.compile(r"^Test Connection (Successful|Failed)$"))
        title.wait_for(timeout=30_000)
        shown = title.locator("xpath=..").inner_text()  # the toast: its title and the hook's message
        assert "Test Connection Successful" in shown, shown
        assert f"Redis {describe(redis_url)} answered PING (namespace 'fstream'); 0 live agent(s)" in shown, shown

    stored = {"conn_type": "fstream", "host": saved["host"], "port": saved["port"], "extra": json.loads(saved["extra"])}
    if redis.password:
        stored["password"] = redis.password
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(stored))
    hook = FStreamHook(fstream_conn_id=conn_id)
    try:
        assert hook.settings == FStreamSettings(redis_url=redis_url, source=f"connection {conn_id!r}")
        ok, message = hook.test_connection()
        assert ok, message
    finally:
        hook.close()


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
    """The inline submitter key (the Ed25519 private key's PEM) signs each job so the agents can verify it with
    its public key; the ``key`` field becomes the job's key id (jobs name keys by id, never by file)."""
    import authkit
    from fstream_provider.authz.ed25519 import load_private, load_public
    from fstream_provider.model.keyfile import read_key_file
    from fstream_provider.authz.signing import JobAuth, verify

    secret = read_key_file(authkit.key_file(), "test submitter key").decode()
    assert secret.startswith("-----BEGIN PRIVATE KEY-----")
    public = load_public(authkit.public_key_file())
    assert load_private(authkit.key_file()).key_id == public.key_id
    hook = _form_hook(monkeypatch, redis_url, "fstream_signform", submitter="lcls-daq", submitter_secret=secret,
                      key="beamline7")
    try:
        job_id, created = hook.submit(_spec(), idempotency_key="sign-form-test")
        assert created
        assert hook.get_job(job_id).spec.key == "beamline7"
        h = redis_client.hgetall(hook.keys.job(job_id))
        auth = JobAuth.from_json(h["auth"])
        assert auth is not None and auth.submitter == "lcls-daq"
        assert auth.key_id == public.key_id and verify([public], auth, "form", job_id, h["spec"])
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
