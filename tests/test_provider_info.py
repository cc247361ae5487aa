"""The provider description lists every hook, operator, sensor and trigger module, and each imports."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import tempfile

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))

import fstream_provider  # noqa: E402
from fstream_provider.provider_info import provider_info  # noqa: E402

pytest.importorskip("airflow")

KINDS = {"hooks": "hooks", "operators": "operators", "sensors": "sensors", "triggers": "triggers"}


def _listed(info: dict, kind: str) -> set[str]:
    return {m for entry in info.get(kind, []) for m in entry["python-modules"]}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_module_of_each_kind_is_listed_and_imports(kind):
    info = provider_info(fstream_provider.__version__)
    pkg = importlib.import_module(f"fstream_provider.{KINDS[kind]}")
    present = {f"{pkg.__name__}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_")}
    assert present, f"no modules in {pkg.__name__}"
    assert _listed(info, kind) == present
    for name in present:
        importlib.import_module(name)


def test_connection_type_hook_exists():
    info = provider_info(fstream_provider.__version__)
    (ct,) = info["connection-types"]
    assert ct["connection-type"] == "fstream"
    mod, _, cls = ct["hook-class-name"].rpartition(".")
    hook = getattr(importlib.import_module(mod), cls)
    assert hook.conn_type == "fstream" and hook.default_conn_name == "fstream_default"


def test_provider_info_matches_airflow_schema():
    import jsonschema  # an Airflow dependency
    import airflow

    with open(os.path.join(os.path.dirname(airflow.__file__), "provider_info.schema.json")) as f:
        schema = json.load(f)
    jsonschema.validate(provider_info(fstream_provider.__version__), schema)


def test_entry_point_returns_the_provider_info():
    """``fstream_provider.get_provider_info`` (the entry point in setup.cfg) must return the full description."""
    assert fstream_provider.get_provider_info() == provider_info(fstream_provider.__version__)


def test_importing_the_package_does_not_import_airflow():
    import subprocess
    import sys

    code = "import sys, fstream_provider, fstream_provider.provider_info, fstream_provider.watch.watcher, " \
           "fstream_provider.model.tasklog; print('airflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_airflow_discovers_the_provider_and_connection_type():
    """Airflow's own ProvidersManager finds the entry point and maps conn type ``fstream`` to the hook."""
    import subprocess
    import sys

    code = ("from airflow.providers_manager import ProvidersManager as P; p = P(); "
            "print('fstream' in p.providers, p.hooks['fstream'].hook_class_name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, AIRFLOW__CORE__LOAD_EXAMPLES="False"))
    assert out.stdout.strip().splitlines()[-1] == "True fstream_provider.hooks.fstream.FStreamHook"


def _airflow_schema(name: str) -> dict:
    import airflow

    with open(os.path.join(os.path.dirname(airflow.__file__), name)) as f:
        return json.load(f)


FORM_FIELDS = {"url", "submitter", "submitter_secret", "submitter_key_file", "key", "namespace", "agent_group",
               "trusted_agents", "ssl"}
KEY_FILE_FIELDS = {"secret_file", "tls_cert", "tls_key", "tls_ca"}
"""Extras that named files on the agents' hosts: the hook refuses them (issue 32), so the form must not offer them."""


def test_connection_type_declares_its_form_like_a_provider_yaml():
    """``conn-fields`` and ``ui-field-behaviour`` follow the schema Airflow 3.3 validates ``provider.yaml`` with
    (``provider_info.schema.json`` does not describe them, so a typo there would pass the other check)."""
    import jsonschema  # an Airflow dependency
    schema = _airflow_schema("provider.yaml.schema.json")["properties"]["connection-types"]
    info = provider_info(fstream_provider.__version__)
    jsonschema.validate(info["connection-types"], schema)
    (ct,) = info["connection-types"]
    assert set(ct["conn-fields"]) == FORM_FIELDS and not KEY_FILE_FIELDS & set(ct["ui-field-behaviour"]["placeholders"])
    for name, field in ct["conn-fields"].items():
        assert field["label"] and field.get("description"), name
    assert ct["conn-fields"]["submitter_secret"]["schema"]["format"] == "password"  # Airflow masks it
    relabeled = set(ct["ui-field-behaviour"]["relabeling"])
    assert {"host", "port", "schema", "login", "password"} <= relabeled


def test_hook_ui_field_behaviour_is_the_provider_infos():
    """Where FAB is installed Airflow calls ``get_ui_field_behaviour``; it must say what the provider info says."""
    import jsonschema  # an Airflow dependency
    from fstream_provider.hooks.fstream import FStreamHook

    got = FStreamHook.get_ui_field_behaviour()
    jsonschema.validate(got, _airflow_schema("customized_form_field_behaviours.schema.json"))
    (ct,) = provider_info(fstream_provider.__version__)["connection-types"]
    want = ct["ui-field-behaviour"]
    assert got == {"hidden_fields": want["hidden-fields"], "relabeling": want["relabeling"],
                   "placeholders": want["placeholders"]}


def test_integration_docs_are_real_pages_not_a_placeholder():
    """The project has no web site: the doc links are ``file:`` URIs of the how-to pages, and they exist."""
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    (integration,) = provider_info(fstream_provider.__version__)["integrations"]
    urls = [integration["external-doc-url"], *integration["how-to-guide"]]
    assert len(urls) == 7  # index + 6 how-to pages (live.md: issue 27)
    for url in urls:
        parsed = urlparse(url)
        assert parsed.scheme == "file", url
        path = url2pathname(parsed.path)
        assert os.path.isfile(path), url
        with open(path) as f:
            assert len(f.read()) > 400, f"{path} is a stub"


def test_airflow_builds_the_fstream_form_from_provider_info_without_the_hook():
    """Airflow's ProvidersManager (as the api-server uses it) turns the provider info into the form's widgets and
    field behaviour; no FAB needed."""
    import subprocess
    import sys

    code = ("import json; from airflow.providers_manager import ProvidersManager as P; p = P(); "
            "w = p.connection_form_widgets; "
            "print(json.dumps({'widgets': sorted(k for k in w if k.startswith('extra__fstream__')), "
            "'behaviour': p.field_behaviours.get('fstream')}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, AIRFLOW__CORE__LOAD_EXAMPLES="False"))
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["widgets"] == sorted(f"extra__fstream__{f}" for f in FORM_FIELDS)
    assert got["behaviour"]["relabeling"]["host"] == "Redis host"
    placeholders = got["behaviour"]["placeholders"]
    assert (placeholders["extra__fstream__submitter"], placeholders["extra__fstream__submitter_key_file"],
            placeholders["extra__fstream__key"]) == ("lcls-daq", "/etc/fstream/submitters/lcls-daq.key", "default")


DOCS_URL = "fstream/docs/index.md"
"""Where the Providers page links FStream: relative, so the UI resolves it against its ``<base href>`` (the
api-server's base URL path) to the how-to pages the provider's Airflow plugin serves under its mount."""


def test_the_providers_page_links_fstream_to_its_own_docs(tmp_path):
    """The Providers page (ui/dist: the package-name cell of the providers table) links a provider to the
    ``documentation_url`` of ``GET /api/v2/providers``, and where that is null to
    ``https://airflow.apache.org/docs/<package>/<version>/``, a page Apache does not publish for ``fstream``.
    Airflow takes that URL from the distribution's ``Project-URL: Documentation``
    (``_shared/providers_discovery/providers_discovery.py``, overwriting any ``documentation-url`` of the
    provider info). setup.cfg names none (no web site; project URLs must be absolute: tests/test_packaging.py),
    so the plugin's root middleware sets it as the api-server builds it (``fstream_provider.ui.doc_link``).
    Asked of Airflow's plugin loading (the middlewares built as the api-server builds them), the ProvidersManager
    and the providers API's own mapper, in a directory without the checkout's ``fstream.egg-info`` (what an
    installed Airflow sees), starting from the null a distribution without the URL gives."""
    import subprocess
    import sys
    from urllib.parse import urljoin

    from fstream_provider.model.plot import PLOT_MOUNT
    from fstream_provider.provider_info import DOC_PAGES, docs_dir

    code = ("import json; from airflow import plugins_manager; from airflow.providers_manager import ProvidersManager as P; "
            "from airflow.api_fastapi.core_api.services.public.providers import _provider_mapper; "
            "P().providers['fstream'].data['documentation-url'] = None; "  # no Project-URL: Documentation
            "_apps, middlewares = plugins_manager.get_fastapi_plugins(); "
            "built = [m['middleware'](None) for m in middlewares]; "  # as the api-server's add_middleware does
            "print(json.dumps(_provider_mapper(P().providers['fstream']).model_dump()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path,
                         env=dict(os.environ, AIRFLOW__CORE__LOAD_EXAMPLES="False"))
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["documentation_url"] == DOCS_URL, f"Airflow reports {got['documentation_url']!r}"
    # the href the UI renders, resolved as the browser does against the page's <base href>
    href = got["documentation_url"] or f"https://airflow.apache.org/docs/{got['package_name']}/{got['version']}/"
    for base in ("http://airflow.example.org:8080/", "https://example.org/airflow/"):
        resolved = urljoin(base, href)
        assert "apache.org" not in resolved, resolved
        assert resolved == base + PLOT_MOUNT.strip("/") + "/docs/index.md", resolved  # the FStream plugin's mount
    page = DOCS_URL.rsplit("/", 1)[1]
    assert page == DOC_PAGES[0] and (docs_dir() / page).is_file()  # docs/airflow/index.md
