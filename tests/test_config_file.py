"""The configuration file (issue 30, "Configuration file"): precedence on a real `fstream receive`, `config show`
and `config check`, errors that name file, section, key, value and reason, and `[redis]` for the job commands."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from agentkit import write_secret

from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.model.spec import TransferSpec
from transfer_agent.cli import config
from transfer_agent.cli.main import build_parser


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This process's environment without any FSTREAM_* variable (a private state dir), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSTREAM_")}
    env["FSTREAM_STATE_DIR"] = str(tmp_path / "state")
    return {**env, **extra}


def _fstream(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transfer_agent.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60)


@contextmanager
def _receive(*args: str, env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """A real `fstream receive` process; yields the (host, port) it says it listens on; stopped (SIGINT) after."""
    proc = subprocess.Popen([sys.executable, "-m", "transfer_agent.cli", "receive", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        line = ""
        while not line.startswith("listening on "):
            left = deadline - time.monotonic()
            if proc.poll() is not None or left <= 0:
                why = proc.stderr.read() if proc.poll() is not None else "timeout"
                raise AssertionError(f"receive did not start: {why}")
            if select.select([proc.stdout], [], [], left)[0]:
                line = proc.stdout.readline()
        host, _, port = line.split()[-1].rpartition(":")
        yield host, int(port)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # SIGINT stops at once (SIGTERM drains)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def _accepts(host: str, port: int) -> bool:
    with socket.create_connection((host, port), timeout=5):
        return True


@pytest.fixture
def site(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "dst").mkdir()
    return {"dst": tmp_path / "dst", "secret": write_secret(tmp_path / "secret"), "file": tmp_path / "fstream.toml"}


def test_receive_listens_where_the_file_says_then_env_then_flag_override(tmp_path, site):
    site["file"].write_text(f'[receive]\nlisten = "127.0.0.2:0"\nroot = "{site["dst"]}"\n'
                            f'secret_file = "{site["secret"]}"\n')
    env = _env(tmp_path, FSTREAM_CONFIG=str(site["file"]))
    with _receive(env=env) as (host, port):  # only the file: --root (required) and --listen come from it
        assert host == "127.0.0.2" and _accepts(host, port)
    env["FSTREAM_RECEIVE_LISTEN"] = "127.0.0.3:0"
    with _receive(env=env) as (host, port):  # the environment over the file
        assert host == "127.0.0.3" and _accepts(host, port)
    with _receive("--listen", "127.0.0.4:0", env=env) as (host, port):  # the command line over both
        assert host == "127.0.0.4" and _accepts(host, port)


def test_required_root_comes_from_the_file(tmp_path, site):
    site["file"].write_text(f'[receive]\nroot = "{site["dst"]}"\n')
    env = _env(tmp_path)
    without = _fstream("receive", "--clean", env=env)
    assert without.returncode == 2 and "--root" in without.stderr and "required" in without.stderr
    got = _fstream("--config", str(site["file"]), "receive", "--clean", env=env)
    assert got.returncode == 0, got.stderr
    assert f"0 orphaned part file(s) removed from {site['dst']}" in got.stdout


def test_config_show_names_where_each_value_came_from(tmp_path, site):
    site["file"].write_text('[receive]\nlisten = "127.0.0.2:9000"\nmax-unauth = 8\n\n'
                            '[redis]\nurl = "redis://:hunter2@127.0.0.1:6390/0"\n')
    env = _env(tmp_path, FSTREAM_CONFIG=str(site["file"]), FSTREAM_RECEIVE_MAX_UNAUTH="12")
    got = _fstream("config", "show", "--json", "receive", "--root", "/srv/in", env=env)
    assert got.returncode == 0, got.stderr
    shown = json.loads(got.stdout)
    rx = shown["commands"]["receive"]
    assert shown["file"] == str(site["file"])
    assert rx["listen"] == {"value": "127.0.0.2:9000", "source": f"file {site['file']}"}
    assert rx["max-unauth"] == {"value": 12, "source": "env FSTREAM_RECEIVE_MAX_UNAUTH"}
    assert rx["root"] == {"value": "/srv/in", "source": "command line"}
    assert rx["handshake-timeout"] == {"value": "10s", "source": "default"}
    text = _fstream("config", "show", env=env)  # receive and agent, as a file would say them
    assert text.returncode == 0, text.stderr
    assert "[receive]" in text.stdout and "[agent]" in text.stdout
    agent_redis = next(line for line in text.stdout.splitlines() if line.startswith("redis "))
    assert '"redis://:***@127.0.0.1:6390/0"' in agent_redis and f"# file {site['file']}" in agent_redis
    assert "hunter2" not in text.stdout  # a password in a URL is never printed


def test_config_check_counts_a_good_file(tmp_path, site):
    site["file"].write_text('[receive]\nlisten = "0.0.0.0:9000"\nroot = "/srv/in"\nmax_unauth = 8\n\n'
                            '[agent]\nroot = ["/data/a", "/data/b"]\nscheduler = "seal"\n\n'
                            '[redis]\nurl = "redis://bus.example.org:6379/0"\n')
    got = _fstream("config", "check", str(site["file"]), env=_env(tmp_path))
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "ok: 6 keys in 3 sections"


def test_config_check_reports_every_problem(tmp_path, site):
    f = site["file"]
    f.write_text('[receive]\nmax-unauth = "lots"\nhandshake-timeout = "soon"\n\n[recieve]\nroot = "/x"\n')
    got = _fstream("config", "check", str(f), env=_env(tmp_path))
    assert got.returncode == 2
    assert "3 problems" in got.stderr
    assert f'config {f}: [receive] max-unauth = "lots": not an integer' in got.stderr
    assert f'config {f}: [receive] handshake-timeout = "soon": not a duration' in got.stderr
    assert f"config {f}: [recieve]: unknown section; did you mean [receive]?" in got.stderr


def test_toml_syntax_error_names_file_line_and_column(tmp_path, site):
    site["file"].write_text('[receive]\nlisten = "127.0.0.1:9000"\nroot = \n')
    got = _fstream("config", "check", str(site["file"]), env=_env(tmp_path))
    assert got.returncode == 2
    assert f"config {site['file']}: TOML syntax error at line 3, column 8" in got.stderr


def test_unknown_key_is_refused_with_a_suggestion(tmp_path, site):
    site["file"].write_text('[receive]\nmax-unath = 8\n')
    got = _fstream("--config", str(site["file"]), "receive", "--root", str(site["dst"]), "--clean",
                   env=_env(tmp_path))
    assert got.returncode == 2
    assert f"config {site['file']}: [receive] max-unath = 8: unknown key; did you mean max-unauth?" in got.stderr
    env = _env(tmp_path, FSTREAM_RECEIVE_MAX_UNATH="8")  # a misspelt variable is refused too (fail closed)
    got = _fstream("receive", "--root", str(site["dst"]), "--clean", env=env)
    assert got.returncode == 2
    assert "env FSTREAM_RECEIVE_MAX_UNATH: unknown key max-unath in [receive]; did you mean " \
           "FSTREAM_RECEIVE_MAX_UNAUTH?" in got.stderr


def test_redis_section_applies_to_status(tmp_path, site, redis_url, redis_client):
    spec = TransferSpec(sources=["/data/run1"], destination="fstream://127.0.0.1:9000/dst", tuner="fixed")
    job_id, _ = JobStore(redis_client, keys=Keys("cfgtest")).submit(spec)
    site["file"].write_text(f'[redis]\nurl = "{redis_url}"\nnamespace = "cfgtest"\n')
    got = _fstream("--config", str(site["file"]), "status", "--json", env=_env(tmp_path))
    assert got.returncode == 0, got.stderr
    assert [j["job_id"] for j in json.loads(got.stdout)["jobs"]] == [job_id]
    # FSTREAM_REDIS_URL works as before, and as the environment it overrides the file
    site["file"].write_text('[redis]\nurl = "redis://127.0.0.1:1/0"\nnamespace = "cfgtest"\n')
    env = _env(tmp_path, FSTREAM_CONFIG=str(site["file"]), FSTREAM_REDIS_URL=redis_url)
    got = _fstream("status", "--json", env=env)
    assert got.returncode == 0, got.stderr
    assert [j["job_id"] for j in json.loads(got.stdout)["jobs"]] == [job_id]
    got = _fstream("status", "--json", "--namespace", "cfgtest", env=_env(tmp_path, FSTREAM_REDIS_URL=redis_url))
    assert [j["job_id"] for j in json.loads(got.stdout)["jobs"]] == [job_id]


def test_a_named_config_file_that_does_not_exist_is_an_error(tmp_path, site):
    missing = tmp_path / "nope.toml"
    got = _fstream("--config", str(missing), "receive", "--root", str(site["dst"]), "--clean", env=_env(tmp_path))
    assert got.returncode == 2 and f"fstream receive: error: config {missing}: no such file" in got.stderr
    got = _fstream("receive", "--root", str(site["dst"]), "--clean", env=_env(tmp_path, FSTREAM_CONFIG=str(missing)))
    assert got.returncode == 2 and f"config {missing}: no such file" in got.stderr


def _parsed(argv: list[str], path: Path | None) -> object:
    parser = build_parser({})
    after = config.apply(parser, argv, argv[0], str(path) if path else None)
    args = parser.parse_args(argv)
    after(args)
    return args


def test_lists_flags_and_types_follow_the_parser(tmp_path, monkeypatch):
    for name in [n for n in os.environ if n.startswith("FSTREAM_")]:
        monkeypatch.delenv(name)
    f = tmp_path / "fstream.toml"
    f.write_text('[agent]\nroot = ["/a", "/b"]\nmax-retries = 7\npreemption-factor = 2\n\n'
                 '[send]\nblock-size = "1MiB"\n')
    args = _parsed(["agent"], f)
    assert args.root == ["/a", "/b"] and args.max_retries == 7 and args.preemption_factor == 2.0
    assert _parsed(["agent", "--root", "/c"], f).root == ["/c"]  # the command line replaces a configured list
    monkeypatch.setenv("FSTREAM_AGENT_ROOT", "/x, /y")  # lists in the environment are comma-separated
    monkeypatch.setenv("FSTREAM_AGENT_ONCE", "yes")
    args = _parsed(["agent"], f)
    assert args.root == ["/x", "/y"] and args.once is True
    assert _parsed(["send", "src", "--to", "fstream://h:1/x"], f).block_size == 1 << 20  # argparse's own type
    monkeypatch.setenv("FSTREAM_AGENT_SCHEDULER", "random")
    with pytest.raises(config.ConfigError, match='env FSTREAM_AGENT_SCHEDULER = "random": not one of fifo, seal'):
        _parsed(["agent"], f)


PROBE = ("import json, sys; from transfer_agent.cli.main import build_parser; from transfer_agent.cli import config; "
         "p = build_parser({}); argv = ['receive', '--root', 'x']; after = config.apply(p, argv, 'receive', None); "
         "print(json.dumps(['tomllib' in sys.modules, p.parse_args(argv).max_unauth]))")


def test_nothing_is_read_without_a_file_or_a_new_variable(tmp_path, site):
    """The built-in fast path: with no file and only the old variables the TOML parser is not even imported."""
    def probe(**extra: str) -> list:
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60,
                             env=_env(tmp_path, **extra))
        return json.loads(out.stdout)

    assert probe(FSTREAM_REDIS_URL="redis://127.0.0.1:1/0") == [False, 64]
    assert probe(FSTREAM_RECEIVE_MAX_UNAUTH="9") == [False, 9]  # a variable alone: applied, still no TOML
    site["file"].write_text('[receive]\nmax-unauth = 8\n')
    assert probe(FSTREAM_CONFIG=str(site["file"])) == [True, 8]


def test_the_documented_example_file_checks(tmp_path):
    """docs/config.md's example (receive, agent, redis, metrics) is a valid file for the commands as they are."""
    doc = (Path(__file__).parent.parent / "docs" / "config.md").read_text()
    example = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "example.toml").write_text(example)
    got = _fstream("config", "check", str(tmp_path / "example.toml"), env=_env(tmp_path))
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "ok: 21 keys in 3 sections"
