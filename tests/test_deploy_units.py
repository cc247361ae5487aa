"""The systemd units of docs/deploy.md (issue 30): each parses cleanly under ``systemd-analyze verify`` (warnings
count as failures: verify exits 0 on a misspelt value), the hardening scores "OK" or better under
``systemd-analyze security --offline``, and the units start the daemons the way the tests prove they behave
(``Type=notify``: tests/test_drain.py; ``--check``: tests/test_metrics.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parent.parent / "deploy" / "systemd"
FSTREAM = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "fstream"
NAMES = ("fstream-receive.service", "fstream-agent.service", "fstream-agent@.service")


def _analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        if os.environ.get("FSTREAM_REQUIRE_WAN") == "1":
            pytest.fail("systemd-analyze is missing although bench/install-deps.sh installs it (package systemd)")
        pytest.skip("systemd-analyze not installed (Debian package systemd)")
    return tool


def _installed(tmp_path: Path) -> Path:
    """The units as `docs/deploy.md` installs them, with ExecStart pointing at this checkout's fstream."""
    exe = FSTREAM if FSTREAM.exists() else Path(shutil.which("fstream") or "/usr/local/bin/fstream")
    for name in NAMES:
        text = (UNITS / name).read_text().replace("/usr/local/bin/fstream", str(exe))
        (tmp_path / name).write_text(text)
    (tmp_path / "fstream-agent@dtn1.service").write_text((tmp_path / "fstream-agent@.service").read_text())
    return tmp_path


@pytest.mark.parametrize("name", ["fstream-receive.service", "fstream-agent.service", "fstream-agent@dtn1.service"])
def test_unit_verifies_without_a_warning(tmp_path, name):
    tool = _analyze()
    d = _installed(tmp_path)
    cp = subprocess.run([tool, "verify", "--man=no", f"./{name}"], cwd=d, capture_output=True, text=True, timeout=60)
    ours = [line for line in (cp.stdout + cp.stderr).splitlines() if "fstream" in line]
    assert cp.returncode == 0 and ours == [], cp.stdout + cp.stderr


def test_verify_catches_a_misspelt_value(tmp_path):
    """The check above can fail: a value systemd cannot parse is reported (and would be ignored at run time)."""
    tool = _analyze()
    d = _installed(tmp_path)
    bad = d / "fstream-receive.service"
    bad.write_text(bad.read_text().replace("ProtectSystem=strict", "ProtectSystem=strictly"))
    cp = subprocess.run([tool, "verify", "--man=no", "./fstream-receive.service"], cwd=d, capture_output=True,
                        text=True, timeout=60)
    assert "protect system value" in (cp.stdout + cp.stderr)


@pytest.mark.parametrize("name", ["fstream-receive.service", "fstream-agent.service"])
def test_hardening_exposure_is_ok(tmp_path, name):
    tool = _analyze()
    d = _installed(tmp_path)
    cp = subprocess.run([tool, "security", "--offline=true", "--no-pager", f"./{name}"], cwd=d,
                        capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", cp.stdout)
    assert m, cp.stdout[-2000:] + cp.stderr
    assert float(m.group(1)) < 4.0, m.group(0)  # systemd's words: below 4 is "OK", below 2 "SAFE"


def test_units_run_as_their_own_user_notify_and_reload_by_sighup():
    for name in NAMES:
        text = (UNITS / name).read_text()
        for line in ("Type=notify", "User=fstream", "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes",
                     "ExecReload=/bin/kill -HUP $MAINPID", "StateDirectory=fstream", "StandardError=journal"):
            assert line in text.splitlines(), f"{name}: {line}"
        assert re.search(r"^LimitNOFILE=\d+$", text, re.M), name
    assert "ReadWritePaths=/data/fstream" in (UNITS / "fstream-receive.service").read_text()
    assert "ReadWritePaths" not in (UNITS / "fstream-agent.service").read_text()  # sources are only read
