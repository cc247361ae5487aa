"""No Redis password in argv (issue 40, item 9): ``ps`` shows every process's arguments to every user.

A URL with a password given as an argument is refused before anything runs, naming the option and the fix; the
password comes from a file (``--redis-password-file``, ``$FSTREAM_REDIS_PASSWORD_FILE``, ``[redis] password_file``).
A real redis-server whose only users are ACL users with passwords, the real ``fstream`` command in a subprocess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

import authkit
import serverkit
from agentkit import write_secret
from fstream_provider.bus.acl import acl_rules
from fstream_provider.bus.agents import start_agent_hint
from fstream_provider.bus.client import connect, describe
from fstream_provider.bus.embedded import RedisServer
from fstream_provider.bus.keys import Keys
from fstream_provider.model.redis_url import secret_in, with_password, without_password
from transfer_agent.cli.redis_auth import refusal

FSTREAM = (sys.executable, "-m", "transfer_agent.cli")
NS = "argv"
USER, PASSWORD = "dtn1-agent", "Agent-pw/with:odd@chars-0123456789"
ADMIN_PW = "admin-pw-0123456789"


class Bus:
    """A redis-server where ``default`` is off: only ``admin`` and ``USER`` (the agent role, with a password)."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.admin = connect(f"redis://admin:{ADMIN_PW}@127.0.0.1:{server.port}/0")

    def plain(self, user: str = USER) -> str:
        return f"redis://{user}@127.0.0.1:{self.server.port}/0"

    def connections(self) -> int:
        return int(self.admin.info("stats")["total_connections_received"])

    def clients_of(self, user: str) -> list[dict[str, Any]]:
        return [c for c in self.admin.client_list() if c.get("user") == user]


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bus]:
    server = RedisServer(str(tmp_path_factory.mktemp("argv-redis")))
    server.start()
    try:
        first = connect(server.url)
        first.execute_command("ACL", "SETUSER", "admin", "on", f">{ADMIN_PW}", "~*", "&*", "+@all")
        first.execute_command("ACL", "SETUSER", USER, "on", f">{PASSWORD}",
                              *acl_rules("agent", NS, serverkit.chosen_version()))
        first.execute_command("ACL", "SETUSER", "default", "off")  # no anonymous way in: a login proves the password
        first.close()
        b = Bus(server)
        yield b
        b.admin.close()
    finally:
        server.stop()


@pytest.fixture
def policy(tmp_path: Path) -> str:
    root = tmp_path / "src"
    root.mkdir()
    return authkit.policy_file(tmp_path, write_secret(tmp_path / "secret"), roots=(str(root),))


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    f = tmp_path / "redis.pw"
    f.write_text(PASSWORD + "\n")
    f.chmod(0o600)
    return f


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSTREAM_REDIS_") and k != "FSTREAM_CONFIG"}
    env.update(extra)
    return env


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*FSTREAM, *args], capture_output=True, text=True, timeout=60, env=env or _env())


@pytest.mark.parametrize("argv", [
    ("agent", "--redis", "{url}", "--namespace", NS, "--policy", "{policy}"),
    ("agent", "--redis={url}", "--namespace", NS, "--policy", "{policy}"),
    ("agent", "--red", "{url}", "--namespace", NS, "--policy", "{policy}"),  # argparse's abbreviation
    ("status", "--redis", "{url}"),
    ("gc", "--redis", "{url}", "--namespace", NS),
    ("redis", "migrate-keys", "--redis", "{url}"),
])
def test_a_password_url_in_argv_is_refused_naming_the_option_and_nothing_connects(bus: Bus, policy: str,
                                                                                   argv: tuple[str, ...]) -> None:
    url = bus.plain().replace(f"{USER}@", f"{USER}:{PASSWORD}@")
    before = bus.connections()
    r = _run(*(a.format(url=url, policy=policy) for a in argv))
    assert r.returncode == 2, r.stdout + r.stderr
    option = "--redis" if argv[1:2] != ("--red",) else "--red"
    assert f"fstream {argv[0]}: error: {option}: the URL carries a password, which every user of this host can " \
           "read in the process list" in r.stderr, r.stderr
    assert "--redis-password-file FILE (mode 0600), $FSTREAM_REDIS_PASSWORD_FILE, or password-file under [redis]" \
        in r.stderr and "$FSTREAM_REDIS_URL" in r.stderr
    assert PASSWORD not in r.stdout + r.stderr
    assert bus.connections() == before  # the server counted no connection: refused before any connect


def test_the_password_file_way_logs_in_as_the_acl_user(bus: Bus, policy: str, password_file: Path,
                                                        tmp_path: Path) -> None:
    check = ("agent", "--namespace", NS, "--policy", policy, "--check")
    r = _run(*check, "--redis", bus.plain(), "--redis-password-file", str(password_file))
    assert r.returncode == 0 and r.stdout.startswith("ready\n"), r.stdout + r.stderr
    assert "ok: redis reachable" in r.stdout
    # the same through the variables (a unit's Environment=), and through the configuration file
    r = _run(*check, env=_env(FSTREAM_REDIS_URL=bus.plain(), FSTREAM_REDIS_PASSWORD_FILE=str(password_file)))
    assert r.returncode == 0 and r.stdout.startswith("ready\n"), r.stdout + r.stderr
    conf = tmp_path / "fstream.toml"
    conf.write_text(f'[redis]\nurl = "{bus.plain()}"\npassword_file = "{password_file}"\n')
    r = _run(*check, env=_env(FSTREAM_CONFIG=str(conf)))
    assert r.returncode == 0 and r.stdout.startswith("ready\n"), r.stdout + r.stderr
    # the password is the file's: without it, or with another, the same user is refused by Redis
    r = _run(*check, "--redis", bus.plain())
    assert r.returncode == 1 and "failed: redis reachable" in r.stdout, r.stdout + r.stderr
    wrong = tmp_path / "wrong.pw"
    wrong.write_text("not-the-password\n")
    wrong.chmod(0o600)
    r = _run(*check, "--redis", bus.plain(), "--redis-password-file", str(wrong))
    assert r.returncode == 1 and "AuthenticationError" in r.stdout and "not-the-password" not in r.stdout, r.stdout


def test_a_password_file_others_may_read_or_a_second_password_is_refused(bus: Bus, policy: str,
                                                                          password_file: Path) -> None:
    password_file.chmod(0o644)
    before = bus.connections()
    r = _run("status", "--redis", bus.plain(), "--redis-password-file", str(password_file))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"Redis password file {password_file}: readable or writable by others (mode 644)" in r.stderr
    assert f"chmod 600 {password_file}" in r.stderr
    password_file.chmod(0o600)
    with_pw = bus.plain().replace(f"{USER}@", f"{USER}:{PASSWORD}@")  # in the environment: allowed, but not twice
    r = _run("status", "--redis-password-file", str(password_file), env=_env(FSTREAM_REDIS_URL=with_pw))
    assert r.returncode == 2 and "the Redis URL carries a password too; give one of them" in r.stderr, r.stderr
    r = _run("status", "--redis-password-file", str(password_file))
    assert r.returncode == 2 and "no Redis URL to use it with" in r.stderr, r.stderr
    assert bus.connections() == before


def test_a_running_agent_started_the_documented_way_has_no_password_in_its_cmdline(bus: Bus, policy: str,
                                                                                   password_file: Path,
                                                                                   tmp_path: Path) -> None:
    """deploy/systemd: ``FSTREAM_CONFIG`` names a file with ``[redis] url`` (the user) and ``password_file``."""
    conf = tmp_path / "agent-dtn1.toml"
    conf.write_text(f'[agent]\npolicy = "{policy}"\nname = "dtn1"\n\n'
                    f'[redis]\nurl = "{bus.plain()}"\nnamespace = "{NS}"\npassword_file = "{password_file}"\n')
    proc = subprocess.Popen([*FSTREAM, "agent"], env=_env(FSTREAM_CONFIG=str(conf)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        heartbeat, deadline = Keys(NS).agent("dtn1"), time.monotonic() + 60
        while not (bus.admin.exists(heartbeat) and bus.clients_of(USER)) and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[0]
        assert bus.admin.exists(heartbeat), "the agent never announced itself"
        logged_in = bus.clients_of(USER)
        assert logged_in, "no connection logged in as the agent's ACL user"
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert b"agent" in cmdline and cmdline[:3] == [os.fsencode(a) for a in FSTREAM]
        assert PASSWORD.encode() not in b" ".join(cmdline)
        assert PASSWORD.encode() not in Path(f"/proc/{proc.pid}/environ").read_bytes()
        ps = subprocess.run(["ps", "-ww", "-o", "args=", "-p", str(proc.pid)], capture_output=True, text=True)
        assert "transfer_agent.cli agent" in ps.stdout and PASSWORD not in ps.stdout, ps.stdout
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    assert PASSWORD not in out  # nor in what it logged


# -- what the checks are made of (no process) --------------------------------------------------------------------
def test_urls_get_and_lose_passwords_in_every_form() -> None:
    pw = "p@ss/w:rd"
    for url, want in [
        ("redis://u@h:6379/0", "redis://u:p%40ss%2Fw%3Ard@h:6379/0"),
        ("redis://h:6379/0", "redis://:p%40ss%2Fw%3Ard@h:6379/0"),
        ("rediss://u@h:6380/0?ssl_ca_certs=/ca.pem", "rediss://u:p%40ss%2Fw%3Ard@h:6380/0?ssl_ca_certs=/ca.pem"),
        ("redis+sentinel://u@h1:1,h2:2/main?db=1", "redis+sentinel://u:p%40ss%2Fw%3Ard@h1:1,h2:2/main?db=1"),
        ("unix:///run/redis.sock?db=2", "unix://:p%40ss%2Fw%3Ard@/run/redis.sock?db=2"),
    ]:
        got = with_password(url, pw)
        assert got == want and secret_in(got) == "a password" and secret_in(url) is None
        assert without_password(got) == url
    assert secret_in("redis+sentinel://h1:1/m?sentinel_password=x") == "?sentinel_password="
    assert secret_in("redis://h/0?password=x") == "?password="
    assert without_password("redis://u:x@h/0?password=y&db=1") == "redis://u@h/0?db=1"
    assert secret_in("redis://[::1]:6379/0") is None and secret_in("/data/a:b@c") is None
    raw = f"redis://{USER}:{PASSWORD}@h:6379/0"  # not percent-encoded: '/', ':' and '@' in the password
    assert secret_in(raw) == "a password" and without_password(raw) == f"redis://{USER}@h:6379/0"
    assert describe(raw) == f"redis://{USER}:***@h:6379/0"  # what logs show ("consuming jobs on ...")
    assert describe("redis+sentinel://h1:1/m?db=1&sentinel_password=x") == \
        "redis+sentinel://h1:1/m?db=1&sentinel_password=***"


def test_the_operators_start_an_agent_hint_shows_a_command_that_runs() -> None:
    """The operator's "no agent" error prints a command to start one: never a password, and not a command the
    refusal above rejects (it used to print ``--redis redis://user:***@...``)."""
    hint = start_agent_hint(describe(f"redis://{USER}:{PASSWORD}@bus:6379/0"), "lab")
    assert f"--redis redis://{USER}@bus:6379/0 --redis-password-file FILE --namespace lab" in hint, hint
    assert PASSWORD not in hint and "***" not in hint
    command = hint.split("`")[1].split()
    assert refusal(command) is None


def test_a_reload_reads_the_password_file_again_and_sees_no_change_without_one(password_file: Path) -> None:
    """``systemctl reload`` (SIGHUP) parses the command line again (``cli.reload.reparse``): the password file is
    read again, so an unchanged file is no change (not "redis changed, needs a restart") and a new password is
    what the next start would use."""
    from transfer_agent.cli import redis_auth
    from transfer_agent.cli.main import build_parser
    from transfer_agent.cli.reload import changes, reparse

    argv = ["agent", "--redis", "redis://dtn1-agent@bus:6379/0", "--redis-password-file", str(password_file)]
    args = build_parser({}).parse_args(argv)
    redis_auth.resolve(args)
    args.argv, args.parser_factory, args.config_file = argv, lambda: build_parser({}), None
    assert secret_in(args.redis) == "a password"
    assert "redis" not in changes(args, reparse(args))
    password_file.write_text("a-new-password-0123456789\n")
    new = reparse(args)
    assert changes(args, new)["redis"][1] == "redis://dtn1-agent:a-new-password-0123456789@bus:6379/0"
