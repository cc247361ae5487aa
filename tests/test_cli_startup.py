"""`fstream send` and the other built-in commands start without the plugins (issue 13: reading the
entry points and importing the benchmarks and the demo cost every run ~50 ms of CPU)."""

from __future__ import annotations

import json
import subprocess
import sys

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
