"""``fstream --version`` (issue 30, defect 3): the package version and the protocol versions, without plugins."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from importlib.metadata import version

import pytest

from transfer_agent.cli.main import build_parser, main
from transfer_agent.cli.version import version_text
from transfer_agent.wire import protocol

PROBE = """
import json, sys
from transfer_agent.cli.main import main
try:
    status = main(sys.argv[1:])
except SystemExit as e:
    status = e.code
print(json.dumps({"status": status, "plugins": "fstream_bench" in sys.modules or "fstream_demo" in sys.modules}))
"""


def _module(**names: object) -> types.ModuleType:
    mod = types.ModuleType("fake_protocol")
    for k, v in names.items():
        setattr(mod, k, v)
    return mod


def test_version_prints_package_and_protocol_and_exits_0() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, "--version"], capture_output=True, text=True, timeout=60)
    first, probe = out.stdout.strip().splitlines()
    assert json.loads(probe) == {"status": 0, "plugins": False}, out.stderr  # no plugin loaded for it
    assert first.startswith(f"fstream {version('fstream')} (protocol {protocol.VERSION}")
    accepted = getattr(protocol, "SUPPORTED", (protocol.VERSION,))
    if set(accepted) != {protocol.VERSION}:  # what the receiver accepts, as the protocol module says it
        assert first.endswith(f"; accepts {', '.join(map(str, sorted(accepted, reverse=True)))})"), first
    else:
        assert first.endswith(f"(protocol {protocol.VERSION})"), first


def test_console_script_and_module_agree(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == version_text()
    assert "--version" in build_parser({}).format_help()


@pytest.mark.parametrize("names, shown", [
    ({"VERSION": 2}, "(protocol 2)"),
    ({"VERSION": 3, "SUPPORTED": (3, 2)}, "(protocol 3; accepts 3, 2)"),
    ({"VERSION": 3, "ACCEPTED_VERSIONS": frozenset({2, 3}), "OTHER_VERSIONS": (9,)}, "(protocol 3; accepts 3, 2)"),
    ({"VERSION": 4, "MIN_VERSION": 2}, "(protocol 4; accepts 4, 3, 2)"),
    ({"VERSION": 3, "SUPPORTED": (3,)}, "(protocol 3)"),
])
def test_prints_whatever_the_protocol_module_defines(names: dict, shown: str) -> None:
    assert version_text(_module(**names)) == f"fstream {version('fstream')} {shown}"
