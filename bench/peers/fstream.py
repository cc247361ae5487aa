"""Our agent as a peer: ``fstream receive`` at the destination, ``fstream send --json`` at the source."""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from fstream_bench.peers.base import PeerError, PeerResult, Sites, log_tail, run_client, spawn, stop, wait_logged

_LISTENING = re.compile(rb"listening on (\S+):(\d+)")
_CONSUMING = re.compile(r"consuming jobs on")


def fstream_argv() -> list[str]:
    """argv prefix that runs this checkout's ``fstream`` CLI (the venv's console script if present)."""
    script = Path(sys.executable).parent / "fstream"
    if script.exists():
        return [str(script)]
    found = shutil.which("fstream")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from transfer_agent.cli.main import main; sys.exit(main())"]


@functools.cache
def precompile() -> None:
    """Write the agent's bytecode once, as ``pip install`` does for an installed package.

    An editable checkout under ``PYTHONDONTWRITEBYTECODE`` (this machine sets it) otherwise compiles
    ~75 modules from source in every ``fstream send``: ~60 ms of CPU that an installed agent never pays.
    """
    import compileall

    import fstream_provider
    import transfer_agent

    for pkg in (transfer_agent, fstream_provider):
        compileall.compile_dir(str(Path(pkg.__file__).parent), quiet=1)


def available() -> str | None:
    """Return None when the agent's CLI is importable, else why not."""
    try:
        import transfer_agent.cli.main  # noqa: F401
    except ImportError as e:
        return f"transfer_agent.cli is not importable yet ({e})"
    return None


class FStreamReceiver:
    """``fstream receive`` on a free port at the destination, with a temp shared secret unless the caller brings
    its own authentication.

    :param sites: where it runs (``dst``) and the address it listens on.
    :param workdir: directory for the secret file and the log.
    :param root: destination root the receiver writes under.
    :param extra_args: more ``receive`` options.
    :param env: more environment for the receiver (``FSTREAM_NATIVE=0``: without the native module).
    :param secret: the caller's shared-secret file (senders read ``self.secret``); default: a fresh one in
        ``workdir``.
    :param auth_args: the ``receive`` options that authenticate (TLS certificates, ...); default
        ``--secret-file SECRET``.
    :param precompiled: write the agent's bytecode first (``precompile``), as an installed agent has it; the
        Airflow bench's rig does not (its CLI figures were measured without).
    """

    def __init__(self, *, sites: Sites, workdir: Path, root: Path, extra_args: Sequence[str] = (),
                 env: dict[str, str] | None = None, secret: Path | None = None,
                 auth_args: Sequence[str] | None = None, precompiled: bool = True) -> None:
        self.sites = sites
        self.env = dict(env or {})
        self.workdir = Path(workdir)
        self.root = Path(root)
        self.extra_args = list(extra_args)
        self.given_secret = secret
        self.auth_args = None if auth_args is None else list(auth_args)
        self.precompiled = precompiled
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def __enter__(self) -> "FStreamReceiver":
        why = available()
        if why:
            raise PeerError(why)
        if self.precompiled:
            precompile()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        if self.given_secret is not None:
            self.secret = Path(self.given_secret)
        else:
            self.secret = self.workdir / "secret"
            fd = os.open(self.secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
        self.log = self.workdir / "receiver.log"
        auth = ["--secret-file", str(self.secret)] if self.auth_args is None else self.auth_args
        argv = [*fstream_argv(), "receive", "--listen", f"{self.sites.dst_host}:0", "--root", str(self.root),
                *auth, *self.extra_args]
        self.proc = spawn(self.sites, "dst", argv, log_path=self.log, stdout=subprocess.PIPE,
                          env={**os.environ, "FSTREAM_STATE_DIR": str(self.workdir / "state"), **self.env})
        try:
            self.port = self._wait_port(timeout=30.0)
        except BaseException:
            stop(self.proc)
            raise
        return self

    def _wait_port(self, timeout: float) -> int:
        """Read the receiver's stdout until it prints ``listening on HOST:PORT``."""
        assert self.proc is not None and self.proc.stdout is not None
        found: list[int] = []
        seen: list[bytes] = []
        done = threading.Event()

        def reader() -> None:
            for line in self.proc.stdout:  # type: ignore[union-attr]
                if not found:
                    seen.append(line)
                    m = _LISTENING.search(line)
                    if m:
                        found.append(int(m.group(2)))
                        done.set()
            done.set()

        threading.Thread(target=reader, name="fstream-receive-stdout", daemon=True).start()
        if not done.wait(timeout) or not found:
            status = self.proc.poll()
            raise PeerError(f"fstream receive: no 'listening on HOST:PORT' line within {timeout:.0f} s "
                            f"(status {status}; stdout {b''.join(seen)[-300:]!r}; log: {log_tail(self.log, 300)})")
        return found[0]

    def __exit__(self, *exc) -> None:
        stop(self.proc)

    def url(self, dest: str) -> str:
        return f"fstream://{self.sites.dst_host}:{self.port}/{dest.strip('/')}"


class FStreamAgent:
    """``fstream agent`` at the source site, in its own process group, up once its log says it consumes jobs.

    :param sites: where it runs (``src``).
    :param redis_url: the bus.
    :param policy: its policy file (roots, destinations, keys, submitters).
    :param name: its worker name.
    :param log: its log file (stdout and stderr).
    :param namespace: the bus namespace (default: the agent's).
    :param extra_args: more ``agent`` options.
    :param env: more environment (``FSTREAM_STATE_DIR``, ...).
    """

    def __init__(self, *, sites: Sites, redis_url: str, policy: Path, name: str, log: Path,
                 namespace: str | None = None, extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
                 timeout: float = 30.0) -> None:
        self.sites, self.log, self.timeout = sites, Path(log), timeout
        self.argv = [*fstream_argv(), "agent", "--redis", redis_url, *(("--namespace", namespace) if namespace else ()),
                     "--policy", str(policy), "--name", name, *extra_args]
        self.env = dict(env or {})
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "FStreamAgent":
        self.proc = spawn(self.sites, "src", self.argv, log_path=self.log, env={**os.environ, **self.env})
        try:
            wait_logged(self.log, _CONSUMING, self.proc, "fstream agent", self.timeout)
        except BaseException:
            stop(self.proc)
            raise
        return self

    def __exit__(self, *exc) -> None:
        stop(self.proc)


def tool_tuner(tool: str) -> tuple[str, dict]:
    """The tuner and extra options a bench tool name asks for.

    ``fstream-<tuner>``; ``fstream-<tuner>@<variant>`` runs a variant (``fstream-fstream@thesis``);
    ``fstream-fixed:CCxPxPP`` runs fixed settings (oracle candidates; plain ``fstream-fixed`` is 4x2x8). The
    name becomes a directory and a log file name, so it holds no ``/``.
    """
    name, _, variant = tool.removeprefix("fstream-").partition("@")
    tuner, _, fixed = name.partition(":")
    opts: dict = {"variant": variant} if variant else {}
    if tuner == "fixed":
        try:
            cc, p, pp = (int(x) for x in (fixed or "4x2x8").split("x"))
        except ValueError:
            raise ValueError(f"bench tool {tool!r}: fixed settings must read CCxPxPP, e.g. fstream-fixed:8x4x2")
        opts.update({"cc": cc, "p": p, "pp": pp})
    elif fixed:
        raise ValueError(f"bench tool {tool!r}: only fstream-fixed takes CCxPxPP")
    return tuner, opts


def send_argv(url: str, secret: Path, sources: Sequence[Path], tuner: str, options: dict,
              watch: dict | None) -> list[str]:
    """``fstream send SOURCES --to URL --json`` with ``--key value`` per option (and ``--watch`` options)."""
    argv = [*fstream_argv(), "send", *map(str, sources), "--to", url, "--secret-file", str(secret),
            "--tuner", tuner, "--json"]
    for k, v in options.items():
        if v is True:  # a flag
            argv.append(f"--{k.replace('_', '-')}")
        elif v is not None and v is not False:
            argv += [f"--{k.replace('_', '-')}", str(v)]
    if watch is not None:
        argv.append("--watch")
        for k, v in watch.items():
            argv += [f"--{k.replace('_', '-')}", str(v)]
    return argv


def send(receiver: FStreamReceiver, sources: Sequence[Path], dest: str, *, tuner: str = "fixed",
         options: dict | None = None, watch: dict | None = None, label: str | None = None,
         timeout: float = 1800.0) -> PeerResult:
    """Run ``fstream send SOURCES --to URL --json`` at the source site and parse its JSON.

    :param options: tuning options (``cc``, ``p``, ``pp``, ``max_cc``, ``bandwidth``, ``rtt``,
        ``target_throughput``, ``profile_interval``) passed as ``--cc 4`` etc.
    :param watch: ``{"interval": "1s", "idle_exit": "3s"}`` to run in streaming mode.
    """
    options = dict(options or {})
    label = label or f"fstream-{tuner}"
    argv = send_argv(receiver.url(dest), receiver.secret, sources, tuner, options, watch)
    log = receiver.workdir / f"{label}.log"
    env = {**os.environ, "FSTREAM_STATE_DIR": str(receiver.workdir / "state-send")}
    t0 = time.monotonic()
    done = run_client(receiver.sites.argv("src", argv), timeout, log, env=env)
    status, wall, out = done.status, done.wall, done.out
    settings = {"tuner": tuner, **options}
    doc = _last_json(out)
    if doc is None:
        return PeerResult(tool=label, settings=settings, seconds=wall, ok=False,
                          error=f"fstream send: status {status}, no JSON on stdout: {log_tail(log, 400)}")
    intervals = [{"t": float(iv.get("t", 0.0)), "throughput_bps": float(iv.get("throughput_bps", 0.0)),
                  "cc": iv.get("cc"), "p": iv.get("p"), "pp": iv.get("pp"), "reason": iv.get("reason", "")}
                 for iv in doc.get("intervals", [])]
    failed = doc.get("failed_files", 0)
    failed_n = len(failed) if isinstance(failed, list) else int(failed or 0)
    ok = status == 0 and failed_n == 0
    result = PeerResult(tool=label, settings=settings, files=int(doc.get("files", 0)), bytes=int(doc.get("bytes", 0)),
                        seconds=wall, ok=ok, verified=int(doc.get("verified_files", 0)) == int(doc.get("files", 0)),
                        intervals=intervals,
                        extra={"self_seconds": doc.get("seconds"), "self_throughput_bps": doc.get("throughput_bps"),
                               "verified_files": doc.get("verified_files"), "failed_files": failed,
                               "started": t0},
                        cpu_src_s=done.cpu_s)
    if not ok:
        rx = receiver.proc.poll() if receiver.proc else None
        result.error = (f"fstream send: status {status}, failed files {failed!r}: {log_tail(log, 400)}"
                        f" | receiver {'exited with ' + str(rx) if rx is not None else 'running'}: "
                        f"{log_tail(receiver.log, 300)}")
    return result


def _last_json(out: str) -> dict | None:
    """The JSON object ``send --json`` printed (the last line that parses as an object)."""
    text = out.strip()
    try:
        doc = json.loads(text)
        return doc if isinstance(doc, dict) else None
    except json.JSONDecodeError:
        pass
    for line in reversed(text.splitlines()):
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict):
            return doc
    return None
