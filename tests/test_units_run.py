"""The units work on first deployment (issue 39): each unit's ``ExecStartPre``, ``ExecStart`` and ``ExecReload`` run
in order, as written in ``deploy/systemd``, against an empty Redis and a fresh state directory, as the unit's user,
on the layout docs/deploy.md installs (its directories, its configuration file and policy, under a scratch root).

What systemd would do is done by hand: the ``Environment=`` lines and the specifiers are applied, the unit's user
runs each command (an unprivileged account when the tests run as root), ``ExecStart`` gets a ``NOTIFY_SOCKET`` and a
``WATCHDOG_USEC`` (2 s here, as a drop-in's ``WatchdogSec=2s`` would give, so pings come within the test), the test
waits for ``READY=1``, runs ``ExecReload`` with ``$MAINPID``, and stops the daemon with the unit's ``KillSignal``.
Two substitutions, both said where they are made: ``/usr/local/bin/fstream`` is this checkout's ``fstream`` (as
tests/test_deploy_units.py installs the units), and the documented paths live under a scratch root. The sandbox
settings themselves (``ProtectSystem=strict`` and the paths it leaves writable) are checked against the same layout
by tests/test_deploy_units.py.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import unitkit
from agentkit import wait_until

UNITS = ("fstream-receive.service", "fstream-agent.service", "fstream-agent@dtn1.service")
WATCHDOG_USEC = 2_000_000


class Host:
    """docs/deploy.md's layout under a scratch root: the ``install -d`` directories (owned by the unit's user, with
    their documented modes), the keys, ``/etc/fstream/policy.toml`` and ``/etc/fstream/fstream.toml`` as documented,
    with what cannot be literal on a test machine replaced: the listen and metrics ports (any free one), the Redis
    URL (the test's empty server) and the free-space floor (1 MiB: the documented 50 GiB may exceed this disk)."""

    def __init__(self, root: Path, redis_url: str) -> None:
        self.root = root
        self.uid, self.gid = unitkit.unit_user()
        for directory, mode in unitkit.doc_install_dirs():
            self._dir(directory, mode)
        self._dir(unitkit.doc_home_dir(), 0o700)  # StateDirectory=fstream, StateDirectoryMode=0700
        policy = unitkit.doc_policy()
        for key_file in policy["agent"]["keys"].values():
            self._secret(key_file)
        for name, sub in policy["submitters"].items():  # docs: fstream keys new submitter NAME (only .pub here)
            self._public(sub["public_key_file"], name)
        for src in [*policy["agent"]["roots"], *(r for s in policy["submitters"].values() for r in s["roots"])]:
            self.path(src).mkdir(parents=True, exist_ok=True)  # the instrument's data: readable, not the unit's
        self._write("/etc/fstream/policy.toml", _toml(self._mapped(policy)))
        config = self._mapped(unitkit.doc_config())
        config["receive"].update({"listen": "127.0.0.1:0", "metrics-listen": "127.0.0.1:0", "free-space-floor": "1MiB"})
        config["agent"]["metrics-listen"] = "127.0.0.1:0"
        config["redis"]["url"] = self._redis_user(redis_url, unitkit.doc_config()["redis"])
        self._secret(unitkit.doc_config()["receive"]["secret-file"])
        self.config = config
        self._write("/etc/fstream/fstream.toml", _toml(config))
        # fstream-agent@dtn1.service reads /etc/fstream/agent-dtn1.toml: the same [agent] and [redis]
        self._write("/etc/fstream/agent-dtn1.toml", _toml({"agent": config["agent"], "redis": config["redis"]}))

    def _redis_user(self, redis_url: str, documented: dict[str, str]) -> str:
        """The documented ``[redis]``: the ACL user in the URL, its password in ``password_file`` (0600, the unit
        user's); the user is made on the test's server (all rights: the roles' rules are test_redis_acl's)."""
        from urllib.parse import urlsplit

        from fstream_provider.bus.client import connect

        user, password = urlsplit(documented["url"]).username, secrets.token_hex(16)
        self._secret(documented["password_file"])
        self.path(documented["password_file"]).write_text(password + "\n")
        admin = connect(redis_url)
        try:
            admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all")
        finally:
            admin.close()
        return redis_url.replace("redis://", f"redis://{user}@", 1)

    def path(self, documented: str) -> Path:
        """Where a documented absolute path is on this scratch host."""
        return self.root / documented.lstrip("/")

    def _mapped(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self._mapped(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._mapped(v) for v in value]
        if isinstance(value, str) and value.startswith("/"):
            return str(self.path(value))
        return value

    def _dir(self, documented: str, mode: int) -> None:
        p = self.path(documented)
        p.mkdir(parents=True, exist_ok=True)
        os.chown(p, self.uid, self.gid)
        p.chmod(mode)

    def _own(self, p: Path, mode: int) -> None:
        os.chown(p, self.uid, self.gid)
        p.chmod(mode)

    def _secret(self, documented: str) -> None:
        p = self.path(documented)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(secrets.token_hex(32) + "\n")  # docs: head -c 32 /dev/urandom | xxd -p -c 64
        self._own(p, 0o600)

    def _public(self, documented: str, name: str) -> None:
        from fstream_provider.authz.ed25519 import PrivateKey

        p = self.path(documented)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(PrivateKey.generate(name).public.line() + "\n")
        self._own(p, 0o644)

    def _write(self, documented: str, text: str) -> None:
        p = self.path(documented)
        p.write_text(text)
        self._own(p, 0o600)

    def rewrite(self, documented: str, old: str, new: str) -> None:
        """Edit a configuration file in place (as an operator would before ``systemctl reload``)."""
        p = self.path(documented)
        text = p.read_text()
        assert old in text, (old, text)
        p.write_text(text.replace(old, new))


def _toml(data: dict[str, Any]) -> str:
    """A TOML file of tables of strings, integers and lists of strings (all docs/deploy.md's examples use)."""
    def value(v: Any) -> str:
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines: list[str] = []

    def table(name: str, body: dict[str, Any]) -> None:
        lines.append(f"[{name}]")
        lines.extend(f'"{k}" = {value(v)}' for k, v in body.items() if not isinstance(v, dict))
        for k, v in body.items():
            if isinstance(v, dict):
                table(f"{name}.{k}", v)

    for name, body in data.items():
        table(name, body)
    return "\n".join(lines) + "\n"


@pytest.fixture
def host(redis_url: str) -> Iterator[Host]:
    root = Path(tempfile.mkdtemp(prefix="fstream-host-"))  # not under pytest's tmp dir: that is root's alone
    root.chmod(0o755)
    try:
        yield Host(root, redis_url)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _argv(line: str, name: str, **subs: str) -> list[str]:
    """An ``Exec*=`` line as systemd runs it: specifiers expanded, ``$VAR`` words given, this checkout's fstream."""
    assert not line.startswith(("-", "@", "+", "!", ":")), f"{name}: exec prefix not handled here: {line}"
    argv = shlex.split(unitkit.expand(line, name))
    argv = [unitkit.fstream_exe() if a == unitkit.INSTALLED_FSTREAM else a for a in argv]
    return [subs.get(a[1:], a) if a.startswith("$") else a for a in argv]


def _env(name: str, host: Host, **extra: str) -> dict[str, str]:
    """The environment systemd gives the unit's commands: its own few variables, the unit's ``Environment=`` lines
    (documented paths on the scratch host), nothing of the test's own."""
    home = str(host.path(unitkit.doc_home_dir()))
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": home,
           "USER": "fstream", "LOGNAME": "fstream", "SHELL": "/usr/sbin/nologin"}
    for k, v in unitkit.environment(name).items():
        env[k] = str(host.path(v)) if v.startswith("/") else v
    return {**env, **extra}


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.parametrize("name", UNITS)
def test_unit_commands_succeed_in_order_on_an_empty_bus_as_the_units_user(host: Host, name: str,
                                                                          redis_client: Any) -> None:
    agent = "agent" in name
    assert redis_client.dbsize() == 0  # the first deployment: no agent has ever run on this bus
    user = unitkit.as_user(host.uid, host.gid)
    config = unitkit.environment(name)["FSTREAM_CONFIG"]
    assert unitkit.values(name, "Type") == ["notify"] and unitkit.values(name, "KillSignal") == ["SIGTERM"]
    assert unitkit.values(name, "WatchdogSec"), f"{name}: no WatchdogSec="

    # ExecStartPre: the readiness checks pass on the first start
    for line in unitkit.values(name, "ExecStartPre"):
        pre = subprocess.run([*user, *_argv(line, name)], env=_env(name, host), capture_output=True, text=True,
                             timeout=120)
        assert pre.returncode == 0, f"{line}\n{pre.stdout}{pre.stderr}"
        assert pre.stdout.startswith("ready\n"), pre.stdout
        if agent:
            assert "the agent creates it and group 'agents' when it starts" in pre.stdout, pre.stdout
        else:
            assert f"ok: data root {host.path('/data/fstream')} writable" in pre.stdout, pre.stdout

    # ExecStart: the daemon, as Type=notify, until READY=1
    notify = unitkit.NotifySocket(host.root / "notify.sock")  # where the unit's user can reach it, as /run/systemd
    (start,) = unitkit.values(name, "ExecStart")
    proc = subprocess.Popen([*user, *_argv(start, name)],  # setpriv executes the daemon: its pid is MAINPID
                            env=_env(name, host, NOTIFY_SOCKET=notify.path, WATCHDOG_USEC=str(WATCHDOG_USEC)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = unitkit.Output(proc.stdout)
    try:
        t_ready, _ready = notify.wait_for("READY", timeout=60, proc=proc)
        _t, m = out.wait_for(r"metrics on (http://\S+)/metrics")
        code, body = _get(m.group(1) + "/readyz")
        assert code == 200 and body.startswith("ready\n"), body
        if agent:  # consuming: the group it made, its heartbeat under the unit's name (%H-%i for the template)
            groups = [g["name"] for g in redis_client.xinfo_groups("{fstream}:jobs")]
            assert groups == ["agents"]
            me = f"{socket.gethostname()}-{'dtn1' if '@' in name else proc.pid}"
            wait_until(lambda: me in redis_client.smembers("{fstream}:agents"), 10, f"heartbeat of {me}")
        else:
            _t, m = out.wait_for(r"listening on 127\.0\.0\.1:(\d+)")
            socket.create_connection(("127.0.0.1", int(m.group(1))), timeout=5).close()
        notify.wait_for("WATCHDOG", after=t_ready, timeout=10)  # the watchdog is on under the unit

        # ExecReload with $MAINPID, after the operator edited the configuration file
        section = "agent" if agent else "receive"
        assert host.config[section]["drain-grace"] == "30s"
        host.rewrite(config, 'drain-grace" = "30s"', 'drain-grace" = "7s"')
        t0 = notify.messages[-1][0]
        for line in unitkit.values(name, "ExecReload"):
            reload = subprocess.run([*user, *_argv(line, name, MAINPID=str(proc.pid))], env=_env(name, host),
                                    capture_output=True, text=True, timeout=60)
            assert reload.returncode == 0, reload.stderr
        t_reloading, _ = notify.wait_for("RELOADING", after=t0)
        notify.wait_for(lambda f: f.get("STATUS") == "configuration reloaded", after=t_reloading)
        out.wait_for(r"configuration reloaded: applied drain_grace: '30s' -> '7s'")

        # KillSignal=SIGTERM from the manager: it drains within the reloaded grace and exits 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(unitkit.seconds(unitkit.values(name, "TimeoutStopSec")[0])) == 0, out.text
        _t, stopping = notify.wait_for("STOPPING", after=t_reloading)
        assert stopping["EXTEND_TIMEOUT_USEC"] == "7000000"  # the grace the reload applied
    finally:
        unitkit.stop(proc)
        notify.close()
    assert "Traceback" not in out.text, out.text


def test_the_commands_run_as_the_units_user_here(host: Host) -> None:
    """What the test above relies on: its commands run unprivileged (when the tests run as root), and this checkout's
    fstream starts as that user."""
    user = unitkit.as_user(host.uid, host.gid)
    r = subprocess.run([*user, unitkit.fstream_exe(), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("fstream "), r.stderr
    r = subprocess.run([*user, "sh", "-c", "id -u; grep CapEff /proc/self/status"], capture_output=True, text=True,
                       timeout=10)
    uid, caps = r.stdout.split("\n", 1)
    assert int(uid) == host.uid != 0 and caps.split()[-1] == "0" * 16, r.stdout
