"""Packaging: every package is listed in setup.cfg, and the agent side never imports Airflow."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg


def _listed_packages() -> set[str]:
    return {p.strip() for p in _setup_cfg()["options"]["packages"].split() if p.strip()}


def test_python_floor_is_the_native_modules_abi3_floor() -> None:
    """setup.cfg's python_requires and native/Cargo.toml's pyo3 ``abi3-pyXY`` name one Python: a lower
    python_requires installs where the native module cannot build (it is optional, so silently)."""
    cfg = _setup_cfg()
    floor = re.fullmatch(r">=\s*3\.(\d+)", cfg["options"]["python_requires"].strip())
    assert floor, f"python_requires should be '>=3.N', is {cfg['options']['python_requires']!r}"
    cargo = tomllib.loads((ROOT / "native" / "Cargo.toml").read_text())
    abi3 = [f for f in cargo["dependencies"]["pyo3"]["features"] if f.startswith("abi3-py")]
    assert len(abi3) == 1, f"pyo3 features should name one abi3-pyXY: {abi3}"
    assert abi3[0] == f"abi3-py3{floor.group(1)}", (
        f"setup.cfg python_requires >=3.{floor.group(1)} but native/Cargo.toml builds {abi3[0]}")
    minors = sorted(int(m) for m in re.findall(r"Programming Language :: Python :: 3\.(\d+)",
                                               cfg["metadata"]["classifiers"]))
    assert minors and minors[0] == int(floor.group(1)), f"the classifiers name 3.{minors}, not from the floor on"
    assert minors == list(range(minors[0], minors[-1] + 1)), f"classifiers skip a version: {minors}"


def test_every_package_directory_is_listed() -> None:
    found = set()
    for top, name in (("fstream_provider", "fstream_provider"), ("transfer_agent", "transfer_agent"),
                      ("bench", "fstream_bench"), ("fstream_demo", "fstream_demo")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    missing = found - _listed_packages()
    assert not missing, f"add to setup.cfg [options] packages: {sorted(missing)}"


def test_agent_side_imports_without_airflow() -> None:
    code = ("import sys; import fstream_provider, fstream_provider.tuning, fstream_provider.model.spec, "
            "fstream_provider.bus.jobs, transfer_agent.cli, transfer_agent.sending.sender, transfer_agent.receiving.receiver, "
            "transfer_agent.daemon.worker, transfer_agent.cli.main; "
            "bad = sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')); "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"Airflow imported by the agent side: {r.stdout} {r.stderr[-2000:]}"


def test_console_script_runs() -> None:
    r = subprocess.run([sys.executable, "-m", "transfer_agent.cli", "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0
    for cmd in ("receive", "send", "bench", "demo"):
        assert cmd in r.stdout
