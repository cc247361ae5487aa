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
    jsonschema = pytest.importorskip("jsonschema")
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
