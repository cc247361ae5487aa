"""`fstream send` and the other built-in commands start without the plugins (issue 13: reading the
entry points and importing the benchmarks and the demo cost every run ~50 ms of CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from transfer_agent.cli.main import BUILTIN, build_parser

PROBE = """
import json, sys
from transfer_agent.cli.main import main
try:
    status = main(sys.argv[1:])
except SystemExit as e:
    status = e.code
import gc, os
print(json.dumps({"status": status, "gc": [gc.get_threshold()[0], gc.get_freeze_count() > 1000], "bench": "fstream_bench" in sys.modules,
                  "pydantic_plugins_off": os.environ.get("PYDANTIC_DISABLE_PLUGINS") == "__all__",
                  "metadata": "importlib.metadata" in sys.modules}))
"""


def _run(*argv: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_builtin_names_are_the_parsers_commands():
    sub = next(a for a in build_parser({})._actions if a.dest == "command")
    assert set(sub.choices) == BUILTIN


def test_send_does_not_load_plugins(tmp_path):
    got = _run("send", str(tmp_path / "missing"), "--to", "fstream://127.0.0.1:1/x", "--secret-file",
               str(tmp_path / "none"))
    assert got["status"] == 2 and not got["bench"] and got["pydantic_plugins_off"]
    assert got["gc"] == [20_000, True]  # start-up's objects frozen, young collections rarer


def test_help_and_plugin_commands_still_load_them():
    assert _run("--help")["bench"]
    assert _run("bench", "--help")["bench"]


def test_send_path_does_not_import_asyncio():
    """The watcher awaits only inside the trigger and the sensor; `fstream send` never does (~10 ms)."""
    code = ("import sys, transfer_agent.cli.main, transfer_agent.cli.options, transfer_agent.sending.sender; "
            "print('asyncio' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


# -- issue 29: a one-file `send` costs <= 0.12 CPU-s; pydantic's import alone was ~50 ms of 0.15 -----------------
# Made lazy for `send` (a configured run still loads what the configuration needs): pydantic and what its model
# construction pulls in (importlib.metadata through its plugin loader), the pydantic spec module, tenacity (only
# RetryPolicy.call uses it), the other commands' modules; rich is never needed with --json.
LAZY = ("pydantic", "pydantic_core", "annotated_types", "importlib.metadata", "tenacity", "rich",
        "fstream_provider.model.spec", "fstream_provider.model.options", "transfer_agent.cli.jobs",
        "transfer_agent.cli.keys", "transfer_agent.cli.doctor", "transfer_agent.cli.top",
        "transfer_agent.cli.config_cmd", "transfer_agent.service.options", "tomllib")

SEND_PROBE = """
import json, sys
from transfer_agent.cli.main import main
try:
    status = main(sys.argv[2:])
except SystemExit as e:
    status = e.code
lazy = json.loads(sys.argv[1])
print(json.dumps({"status": status, "loaded": sorted({m for m in sys.modules for n in lazy
                                                      if m == n or m.startswith(n + ".")})}))
"""


def _send_probe(*argv: str, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", SEND_PROBE, json.dumps(LAZY), *argv], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.stdout.strip(), out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _plain_env() -> dict[str, str]:
    """No configuration: no FSTREAM_* variable but the state dir (conftest's), and no default file."""
    from transfer_agent.cli.config import DEFAULT_PATH

    if os.path.exists(DEFAULT_PATH):
        pytest.skip(f"{DEFAULT_PATH} exists here: every command is configured by it")
    return {k: v for k, v in os.environ.items() if not k.startswith("FSTREAM_") or k == "FSTREAM_STATE_DIR"}


def test_a_one_file_send_lands_without_importing_pydantic_tenacity_or_other_commands(tmp_path):
    """A real send over loopback: the file lands, and the sender never imported what ``LAZY`` names."""
    from agentkit import make_files, start_receiver, write_secret

    secret = write_secret(tmp_path / "secret")
    src = make_files(tmp_path / "src", {"one": 1})
    rcv = start_receiver(tmp_path / "dst", secret)
    try:
        for extra in ((), ("--tuner", "fixed", "--cc", "1", "--p", "1", "--pp", "1")):  # the default tuner, the bench's
            got = _send_probe("send", str(src / "one"), "--to", f"fstream://127.0.0.1:{rcv.port}/out{len(extra)}",
                              "--secret-file", str(secret), "--json", *extra, env=_plain_env())
            assert got == {"status": 0, "loaded": []}
            assert (tmp_path / "dst" / f"out{len(extra)}" / "one").read_bytes() == (src / "one").read_bytes()
    finally:
        rcv.stop()


def test_a_refused_send_says_the_models_own_words_and_only_then_imports_pydantic(tmp_path):
    """An option the rules refuse goes to the pydantic model, whose message is the one printed (exit 2)."""
    argv = ("send", str(tmp_path), "--to", "fstream://127.0.0.1:9/x", "--secret-file", str(tmp_path / "s"))
    got = _send_probe(*argv, "--cc", "0", "--key", "bad key", env=_plain_env())
    assert got["status"] == 2 and "pydantic" in got["loaded"]
    out = subprocess.run([sys.executable, "-m", "transfer_agent.cli", *argv, "--cc", "0", "--key", "bad key"],
                         capture_output=True, text=True, timeout=60, env=_plain_env())
    assert out.returncode == 2
    assert out.stderr.strip() == ("fstream send: error: transfer spec: cc 0: must be between 1 and 1024; key 'bad key': "
                                  "a key id is 1-64 letters, digits, '.', '_' or '-'")


def test_a_configured_send_still_checks_the_whole_configuration(tmp_path):
    """With a file, `send` builds every command's parser: a bad key in another command's section is refused."""
    conf = tmp_path / "fstream.toml"
    conf.write_text("[agent]\nmax-unath = 8\n")
    env = {**_plain_env(), "FSTREAM_CONFIG": str(conf)}
    got = subprocess.run([sys.executable, "-m", "transfer_agent.cli", "send", str(tmp_path), "--to",
                          "fstream://127.0.0.1:9/x"], capture_output=True, text=True, timeout=60, env=env)
    assert got.returncode == 2 and f"config {conf}: [agent] max-unath = 8: unknown key" in got.stderr


def test_send_alone_parses_and_helps_as_the_whole_parser():
    def send_parser(parser):
        return next(a for a in parser._actions if a.dest == "command").choices["send"]

    alone, whole = send_parser(build_parser({}, only="send")), send_parser(build_parser({}))
    assert alone.format_help() == whole.format_help()
    argv = ["/a", "--to", "fstream://h:1/x", "--cc", "3", "--tuner", "fixed", "--json"]
    assert vars(alone.parse_args(argv)).keys() == vars(whole.parse_args(argv)).keys()
    assert {k: v for k, v in vars(alone.parse_args(argv)).items() if k != "func"} == \
           {k: v for k, v in vars(whole.parse_args(argv)).items() if k != "func"}


# -- issue 42: every command that nothing configures builds its own parser alone ------------------------------------
# so a benchmark's processes (`fstream receive`, `fstream agent`, `fstream bench X`) import only the commands they
# run, and a change to another command's module does not stale their results (bench/core/provenance.py)
def _command_parser(parser, name):
    return next(a for a in parser._actions if a.dest == "command").choices[name]


@pytest.mark.parametrize("name", sorted(BUILTIN - {"config"}))
def test_each_builtin_command_alone_helps_as_in_the_whole_parser(name):
    alone, whole = build_parser({}, only=name), build_parser({})
    assert set(next(a for a in alone._actions if a.dest == "command").choices) == {name}
    assert _command_parser(alone, name).format_help() == _command_parser(whole, name).format_help()


MODULES = """
import json, sys
from transfer_agent.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith("transfer_agent.cli.") and m.count(".") == 2
                        or m.startswith("fstream_demo"))))
"""


def _modules(*argv: str, env: dict | None = None) -> set[str]:
    out = subprocess.run([sys.executable, "-c", MODULES, *argv], capture_output=True, text=True, timeout=120,
                         env=env or _plain_env())
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_plugin_command_and_a_daemon_import_no_other_commands_module(tmp_path):
    bench = _modules("bench", "report", "--help")
    assert "transfer_agent.cli.jobs" not in bench and "transfer_agent.cli.top" not in bench, bench
    assert not {m for m in bench if m.startswith("fstream_demo")}, bench  # the demo's plugin is not loaded
    receive = _modules("receive", "--root", str(tmp_path), "--check")
    assert "transfer_agent.cli.jobs" not in receive and "transfer_agent.cli.doctor" not in receive, receive
    agent = _modules("agent", "--help")
    assert "transfer_agent.cli.jobs" in agent and "transfer_agent.cli.top" not in agent, agent


def test_a_configured_command_still_builds_the_whole_parser(tmp_path):
    conf = tmp_path / "fstream.toml"
    conf.write_text("[receive]\nmax-unauth = 8\n")
    got = _modules("receive", "--root", str(tmp_path), "--check", env={**_plain_env(), "FSTREAM_CONFIG": str(conf)})
    assert {"transfer_agent.cli.jobs", "transfer_agent.cli.top"} <= got, got
