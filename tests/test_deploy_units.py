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

import unitkit

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


# -- the documented layout under the units' sandbox (issue 39) -----------------------------------------------------
# what each daemon writes (besides $FSTREAM_STATE_DIR) and reads, by the option that names it in its section
WRITES = {"receive": ("root",), "agent": ()}
READS = {"receive": ("secret-file", "keyring", "tls-cert", "tls-key", "tls-ca"), "agent": ("policy", "secret-file")}
SANDBOX_UNITS = ("fstream-receive.service", "fstream-agent.service", "fstream-agent@dtn1.service")


def _within(path: str, dirs: list[str]) -> str | None:
    """The first of ``dirs`` that is ``path`` or one of its parents."""
    return next((d for d in dirs if path == d or path.startswith(d.rstrip("/") + "/")), None)


def _sandbox(name: str) -> tuple[list[str], list[str], dict[str, str]]:
    """(writable, to create before start, hidden) of a unit, as systemd sets up its namespace: under
    ``ProtectSystem=strict`` only ``ReadWritePaths=`` (those without ``-`` must exist), the ``*Directory=`` it makes
    and a private ``/tmp`` are writable; ``ProtectHome=`` hides the homes, ``PrivateTmp=`` the host's ``/tmp``,
    ``InaccessiblePaths=`` what it names (path -> the setting)."""
    assert unitkit.values(name, "ProtectSystem") == ["strict"], name
    rw = [p for v in unitkit.values(name, "ReadWritePaths") for p in v.split()]
    writable = [p.lstrip("-+") for p in rw]
    must_exist = [p.lstrip("+") for p in rw if not p.startswith("-")]
    for key, base in (("StateDirectory", "/var/lib"), ("CacheDirectory", "/var/cache"), ("LogsDirectory", "/var/log"),
                      ("RuntimeDirectory", "/run")):
        writable += [f"{base}/{d.split(':')[0]}" for v in unitkit.values(name, key) for d in v.split()]
    hidden = {p.lstrip("-+"): "InaccessiblePaths=" for v in unitkit.values(name, "InaccessiblePaths") for p in v.split()}
    if unitkit.values(name, "ProtectHome")[-1:] in (["yes"], ["tmpfs"]):
        hidden.update({p: "ProtectHome=yes" for p in ("/home", "/root", "/run/user")})
    if unitkit.values(name, "PrivateTmp")[-1:] == ["yes"]:
        writable += ["/tmp", "/var/tmp"]
        hidden.update({p: "PrivateTmp=yes (the unit's own, empty)" for p in ("/tmp", "/var/tmp")})
    return writable, must_exist, hidden


def sandbox_problems(name: str, config: dict, policy: dict, receive_roots: tuple[str, ...] = ()) -> list[str]:
    """What of the documented layout the unit ``name`` as written could not write (or not even see), and what it
    needs to exist that the documented install does not create. ``receive_roots``: ``--root`` values of documented
    ``fstream receive`` command lines."""
    writable, must_exist, hidden = _sandbox(name)
    command = "agent" if " agent" in unitkit.values(name, "ExecStart")[0] else "receive"
    section, env = config.get(command, {}), unitkit.environment(name)
    writes = [(f"[{command}] {k}", section[k]) for k in WRITES[command] if k in section]
    writes += [("FSTREAM_STATE_DIR", env["FSTREAM_STATE_DIR"])]
    writes += [("fstream receive --root", r) for r in receive_roots if command == "receive"]
    reads = [("FSTREAM_CONFIG", env["FSTREAM_CONFIG"])]
    reads += [("[redis] password_file", config["redis"]["password_file"])] if command == "agent" else []
    reads += [(f"[{command}] {k}", section[k]) for k in READS[command] if k in section]
    if command == "agent":
        reads += [("policy [agent] roots", r) for r in policy["agent"]["roots"]]
        reads += [(f"policy [agent.keys] {k}", f) for k, f in policy["agent"].get("keys", {}).items()]
        for sid, sub in policy.get("submitters", {}).items():
            reads += [(f"policy [submitters.{sid}] public_key_file", sub["public_key_file"])]
            reads += [(f"policy [submitters.{sid}] roots", r) for r in sub.get("roots", [])]
    problems = []
    for what, path in writes + reads:
        if (h := _within(path, list(hidden))) is not None:
            problems.append(f"{name}: {what} {path} is hidden by {hidden[h]}")
    for what, path in writes:
        if _within(path, writable) is None:
            problems.append(f"{name}: {what} {path} is not writable under ProtectSystem=strict (writable: "
                            f"{', '.join(writable)}): add it to ReadWritePaths=")
    created = [d for d, _mode in unitkit.doc_install_dirs()]
    for path in must_exist:
        if not any(c == path or c.startswith(path.rstrip("/") + "/") for c in created):
            problems.append(f"{name}: ReadWritePaths={path} is not created by docs/deploy.md's install steps; "
                            "the unit fails to start without it (status 226/NAMESPACE)")
    return problems


def _documented_receive_roots() -> tuple[str, ...]:
    return tuple(re.findall(r"fstream receive [^`\n]*--root (\S+)", unitkit.DEPLOY_DOC.read_text()))


@pytest.mark.parametrize("name", SANDBOX_UNITS)
def test_the_documented_layout_is_writable_under_the_units_sandbox(name):
    """docs/deploy.md's configuration, policy and command lines against the unit as written: every path the daemon
    writes is writable under ``ProtectSystem=strict``, none it reads or writes is hidden, and every
    ``ReadWritePaths=`` the unit needs at start is created by the documented install."""
    config, policy = unitkit.doc_config(), unitkit.doc_policy()
    assert config["receive"]["root"] and policy["agent"]["roots"]  # the examples this reads are still there
    assert sandbox_problems(name, config, policy, _documented_receive_roots()) == []


def test_the_sandbox_check_names_an_uncovered_or_hidden_path():
    """The check above can fail: a data root outside ``ReadWritePaths=``, a source root in a home directory, a
    state dir in ``/tmp``, each named with the setting in the way."""
    config, policy = unitkit.doc_config(), unitkit.doc_policy()
    config["receive"]["root"] = "/srv/fstream"
    policy["agent"]["roots"] = ["/home/lcls/data"]
    (receive,) = sandbox_problems("fstream-receive.service", config, policy)
    assert "[receive] root /srv/fstream is not writable under ProtectSystem=strict" in receive
    assert "writable: /data/fstream, /var/lib/fstream, /tmp, /var/tmp" in receive
    (agent,) = sandbox_problems("fstream-agent.service", config, policy)
    assert agent == "fstream-agent.service: policy [agent] roots /home/lcls/data is hidden by ProtectHome=yes"
    assert any("fstream receive --root /tmp/in is hidden by PrivateTmp=yes" in p
               for p in sandbox_problems("fstream-receive.service", unitkit.doc_config(), policy, ("/tmp/in",)))
