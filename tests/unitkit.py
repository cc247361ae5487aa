"""Helpers for the tests of the systemd units (``deploy/systemd``) and of the daemons under them (issue 39): the unit
files read as systemd reads them, the layout docs/deploy.md documents, a ``NOTIFY_SOCKET`` like the one systemd binds
for a ``Type=notify`` unit, and a daemon's output read while it runs."""

from __future__ import annotations

import os
import pwd
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
import tomllib
from pathlib import Path
from typing import Any, Callable, IO

REPO = Path(__file__).resolve().parent.parent
UNITS = REPO / "deploy" / "systemd"
DEPLOY_DOC = REPO / "docs" / "deploy.md"
INSTALLED_FSTREAM = "/usr/local/bin/fstream"  # where docs/deploy.md links it and the units run it


def fstream_exe() -> str:
    """This checkout's ``fstream`` (what the units' ``/usr/local/bin/fstream`` stands for in a test)."""
    import shutil

    exe = REPO / ".venv" / "bin" / "fstream"
    return str(exe) if exe.exists() else (shutil.which("fstream") or INSTALLED_FSTREAM)


# -- unit files ------------------------------------------------------------------------------------------------
def unit_file(name: str) -> Path:
    """``fstream-agent@dtn1.service`` is the template ``fstream-agent@.service``, as systemd finds it."""
    return UNITS / re.sub(r"@[^.]+\.service$", "@.service", name)


def section(name: str, which: str = "Service") -> list[tuple[str, str]]:
    """The ``KEY=VALUE`` lines of a unit's ``[which]`` section in order (comments skipped, repeated keys kept)."""
    out, current = [], None
    for raw in unit_file(name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif current == which:
            key, _, value = line.partition("=")
            out.append((key.strip(), value.strip()))
    return out


def values(name: str, key: str, which: str = "Service") -> list[str]:
    return [v for k, v in section(name, which) if k == key]


def expand(text: str, name: str, host: str | None = None) -> str:
    """The specifiers the units use, as systemd expands them: ``%i`` (instance), ``%H`` (host name), ``%%``."""
    instance = name.partition("@")[2].rpartition(".service")[0] if "@" in name else ""
    subs = {"i": instance, "I": instance, "H": host or socket.gethostname(), "%": "%"}
    return re.sub(r"%(.)", lambda m: subs[m.group(1)], text)


def environment(name: str) -> dict[str, str]:
    """The unit's ``Environment=`` assignments (specifiers expanded)."""
    env = {}
    for value in values(name, "Environment"):
        for item in shlex.split(expand(value, name)):
            k, _, v = item.partition("=")
            env[k] = v
    return env


def seconds(value: str) -> float:
    """A systemd time span (``90``, ``5s``, ``3min``, ``1min 30s``) in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "ms": 1e-3, "us": 1e-6}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


# -- docs/deploy.md -----------------------------------------------------------------------------------------------
def doc_blocks(lang: str) -> list[str]:
    """The fenced ``lang`` blocks of docs/deploy.md (indented ones, in list items, dedented)."""
    blocks, lines, indent = [], None, 0
    for raw in DEPLOY_DOC.read_text().splitlines():
        stripped = raw.lstrip()
        if lines is None and stripped == f"```{lang}":
            lines, indent = [], len(raw) - len(stripped)
        elif lines is not None and stripped == "```":
            blocks.append("\n".join(lines) + "\n")
            lines = None
        elif lines is not None:
            lines.append(raw[indent:])
    return blocks


def doc_config() -> dict[str, Any]:
    """The example configuration file (``/etc/fstream/fstream.toml``) of docs/deploy.md, section 4."""
    return next(tomllib.loads(b) for b in doc_blocks("toml") if "[receive]" in b)


def doc_policy() -> dict[str, Any]:
    """The example policy (``/etc/fstream/policy.toml``) of docs/deploy.md, section 3."""
    return next(tomllib.loads(b) for b in doc_blocks("toml") if "[submitters." in b)


def doc_install_dirs() -> list[tuple[str, int]]:
    """(directory, mode) of every ``install -d`` in docs/deploy.md's shell blocks."""
    out = []
    for block in doc_blocks("sh"):
        for line in block.splitlines():
            line = line.split("#", 1)[0]
            for command in line.split("&&"):
                argv = shlex.split(command)
                if argv[:2] != ["install", "-d"]:
                    continue
                mode, args, i = 0o755, argv[2:], 0
                dirs = []
                while i < len(args):
                    if args[i] in ("-o", "-g", "-m"):
                        if args[i] == "-m":
                            mode = int(args[i + 1], 8)
                        i += 2
                        continue
                    dirs.append(args[i])
                    i += 1
                out += [(d, mode) for d in dirs]
    return out


def doc_home_dir() -> str:
    """The ``fstream`` account's home (docs/deploy.md's ``useradd --home-dir``)."""
    m = re.search(r"useradd [^\n]*--home-dir (\S+)", DEPLOY_DOC.read_text())
    assert m, "docs/deploy.md no longer creates the fstream account with useradd --home-dir"
    return m.group(1)


# -- the unit's user -------------------------------------------------------------------------------------------
def unit_user() -> tuple[int, int]:
    """(uid, gid) to run a unit's commands as: an unprivileged account when the tests run as root (the units say
    ``User=fstream``; ``nobody`` stands for it), else the current user."""
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    pw = pwd.getpwnam("nobody")
    return pw.pw_uid, pw.pw_gid


def as_user(uid: int, gid: int) -> list[str]:
    """The argv prefix that runs a command as ``uid``/``gid`` with no supplementary groups, no capabilities and
    ``NoNewPrivileges`` (what the units' ``User=``, ``CapabilityBoundingSet=`` and ``NoNewPrivileges=yes`` give),
    or nothing when that is who we are.

    An interpreter under a directory only root may enter (a pyenv Python in ``/root``) is made reachable the way a
    unit would with ``TemporaryFileSystem=/root`` and ``BindReadOnlyPaths=/root/.pyenv``: in a mount namespace of
    the command's own, that directory is an empty tmpfs the user may cross, with the interpreter's tree bound back
    in; nothing else of it is visible, and nothing changes outside the namespace."""
    if os.geteuid() == uid:
        return []
    drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs", "--bounding-set=-all",
            "--"]
    interpreter = Path(os.path.realpath(_shebang(fstream_exe())))
    blocked = next((d for d in reversed(interpreter.parents) if not os.stat(d).st_mode & 0o001), None)
    if blocked is None:
        return drop
    keep = interpreter.parents[len(interpreter.parents) - len(blocked.parts) - 1]  # blocked's child towards it
    script = ('set -e; v=$(mktemp -d); mount --bind "$1" "$v"; mount -t tmpfs -o mode=0711,size=1m tmpfs "$2"; '
              'mkdir -p "$1"; mount --bind "$v" "$1"; umount "$v"; rmdir "$v"; shift 2; exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(keep), str(blocked), *drop]


def _shebang(script: str) -> str:
    with open(script, "rb") as f:
        first = f.readline().decode()
    return first[2:].split()[0] if first.startswith("#!") else script


# -- sd_notify -------------------------------------------------------------------------------------------------
class NotifySocket:
    """A ``NOTIFY_SOCKET`` (datagrams), as systemd binds one for a ``Type=notify`` unit: every message is kept with
    the monotonic time it arrived. Writable by anyone, so a daemon run as another user can send to it.

    :param path: where to bind it.
    """

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._cond = threading.Condition()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)
        os.chmod(self.path, 0o666)
        self._sock.settimeout(0.2)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, name="notify-socket", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                data = self._sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            now = time.monotonic()
            fields = dict(line.partition("=")[::2] for line in data.decode().splitlines() if line)
            with self._cond:
                self.messages.append((now, fields))
                self._cond.notify_all()

    def wait_for(self, match: Callable[[dict[str, str]], bool] | str, timeout: float = 30.0,
                 after: float = float("-inf"), proc: subprocess.Popen | None = None) -> tuple[float, dict[str, str]]:
        """The first message (arrived after ``after``) that ``match`` accepts; ``match`` may be a key (``"READY"``:
        ``READY=1``). Fails naming what arrived, at once if ``proc`` (the sender) exited."""
        if isinstance(match, str):
            key = match
            match = lambda f: f.get(key) == "1"  # noqa: E731
        deadline, exited = time.monotonic() + timeout, None
        with self._cond:
            while True:
                for t, fields in self.messages:
                    if t > after and match(fields):
                        return t, fields
                left = deadline - time.monotonic()
                assert left > 0, f"no such sd_notify message in {timeout:g} s; got {self.messages[-10:]}"
                if proc is not None and proc.poll() is not None:  # give what it sent before it exited 0.5 s to be read
                    exited = exited or time.monotonic()
                    assert time.monotonic() - exited < 0.5, f"the daemon exited ({proc.returncode}); got " \
                                                            f"{self.messages[-10:]}"
                self._cond.wait(min(left, 0.2))

    def times(self, key: str, after: float = float("-inf")) -> list[float]:
        """When each ``KEY=1`` message arrived (after ``after``)."""
        with self._cond:
            return [t for t, fields in self.messages if t > after and fields.get(key) == "1"]

    def close(self) -> None:
        self._closed.set()
        self._sock.close()
        self._thread.join(5)


class Output:
    """A daemon's output pipe read line by line as it comes (a thread), so tests wait for a line instead of
    sleeping; ``text`` is all of it so far."""

    def __init__(self, pipe: IO[str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(pipe,), name="daemon-output", daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            with self._cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float = 30.0) -> tuple[float, re.Match]:
        """(when, match) of the first line matching the regular expression ``pattern``."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for t, line in self.lines:
                    m = rx.search(line)
                    if m:
                        return t, m
                left = deadline - time.monotonic()
                assert left > 0, f"no line matching {pattern!r} in {timeout:g} s:\n{self.text[-3000:]}"
                ended = not self._thread.is_alive()  # the pipe closed: every line is in
                assert not ended, f"output ended before a line matching {pattern!r}:\n{self.text[-3000:]}"
                self._cond.wait(min(left, 0.2))

    @property
    def text(self) -> str:
        with self._cond:
            return "\n".join(line for _, line in self.lines)


def interrupt(proc: subprocess.Popen, sig: int = signal.SIGINT, timeout: float = 20) -> None:
    """Send ``sig`` to ``proc`` if it still runs and wait for it; kill it if it has not exited within ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop(proc: subprocess.Popen) -> None:
    """Kill ``proc`` if a failed test left it running."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
