"""Packaging: every package is listed in setup.cfg, and the agent side never imports Airflow."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _listed_packages() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return {p.strip() for p in cfg["options"]["packages"].split() if p.strip()}


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
