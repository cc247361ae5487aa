"""The daemons say once at start whether native BLAKE3 tree hashing is in use, and if not why (issue 39).

Real ``fstream receive`` and ``fstream agent`` processes, with ``FSTREAM_NATIVE=0``, without it, and with the
native module missing (an import of it refused, as in a package built without cargo); ``fstream doctor``'s
report of it is in ``tests/test_doctor.py``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import unitkit

NATIVE_BUILT = importlib.util.find_spec("transfer_agent.storage._blake3tree") is not None
IN_USE = "native BLAKE3 tree hashing in use: received files are verified from their blocks as they land"
OFF = ("native BLAKE3 tree hashing not in use (FSTREAM_NATIVE=0): each received file is read back once at commit "
       "to verify it")
MISSING = ("native BLAKE3 tree hashing not in use (module transfer_agent.storage._blake3tree not installed: the "
           "package was built without it): each received file is read back once at commit to verify it")
# the real CLI, with the native module's import refused (None in sys.modules: ModuleNotFoundError)
WITHOUT_MODULE = ("import sys; sys.modules['transfer_agent.storage._blake3tree'] = None; "
                  "from transfer_agent.cli.main import main; sys.exit(main(sys.argv[1:]))")
CASES = {
    "default": ({}, False, IN_USE if NATIVE_BUILT else MISSING),
    "FSTREAM_NATIVE=0": ({"FSTREAM_NATIVE": "0"}, False, OFF),
    "module missing": ({}, True, MISSING),
}


def _start(tmp_path: Path, case: str, *args: str) -> tuple[subprocess.Popen, str]:
    env_extra, without_module, expected = CASES[case]
    env = {k: v for k, v in os.environ.items() if k != "FSTREAM_NATIVE"}
    env.update(env_extra, FSTREAM_STATE_DIR=str(tmp_path / "state"))
    cmd = [sys.executable, "-c", WITHOUT_MODULE] if without_module else [sys.executable, "-m", "transfer_agent.cli"]
    proc = subprocess.Popen([*cmd, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return proc, expected


class _Stderr:
    """Every line of a process's stderr, read by a thread; ``wait`` for the native-hashing line."""

    def __init__(self, proc: subprocess.Popen, prefix: str) -> None:
        self.proc, self.prefix, self.lines = proc, prefix, []
        self.found = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            if line.startswith(self.prefix) and "native BLAKE3" in line:
                self.found.set()

    def wait(self, timeout: float = 30) -> None:
        if not self.found.wait(timeout):
            pytest.fail(f"no native hashing line within {timeout} s; stderr so far: {self.lines}")

    def stop(self) -> list[str]:
        """Stop the process (SIGINT) and return all it wrote to stderr."""
        unitkit.interrupt(self.proc)
        self.reader.join(10)
        return self.lines


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("daemon", ["receive", "agent"])
def test_the_daemon_says_once_at_start_whether_native_hashing_is_in_use(tmp_path, secret, redis_url, daemon, case):
    if daemon == "receive":
        args, prefix = ("receive", "--listen", "127.0.0.1:0", "--root", str(tmp_path / "dst"), "--secret-file",
                        str(secret)), "fstream receive: "
    else:
        (tmp_path / "src").mkdir()
        args, prefix = ("agent", "--redis", redis_url, "--root", str(tmp_path / "src"), "--namespace", "nativeline",
                        "--name", "native-line"), "fstream agent native-line: "
    proc, expected = _start(tmp_path, case, *args)
    err = _Stderr(proc, prefix)
    try:
        err.wait()
    finally:
        lines = err.stop()
    said = [line for line in lines if "native BLAKE3" in line]
    assert said == [f"{prefix}{expected}"], lines  # once
    if daemon == "agent":
        assert proc.returncode == 0, lines
