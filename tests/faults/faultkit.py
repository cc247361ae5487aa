"""Real agents as subprocesses (so SIGKILL is real) and an in-path TCP proxy, for the fault suite.

``fstream receive`` and ``fstream send`` run as ``sys.executable -m transfer_agent.cli`` (they
inherit PYTHONPATH, so the worktree's code runs). Each process's stderr goes to a log file the
test can count lines in. ``Proxy`` sits between sender and receiver on loopback: it counts the
bytes going to the receiver (to SIGKILL the sender at a chosen byte), paces them (so a kill or a
modification lands mid-file on a fast machine) and can throttle one connection to a crawl.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from agentkit import make_files

CLI = [sys.executable, "-m", "transfer_agent.cli"]


write_files = make_files  # reproducible random files: one implementation, in tests/agentkit.py


def seeds() -> list[int]:
    """Seeds of the randomized rows: ``FSTREAM_FAULT_SEEDS`` (default ``1,2,3``)."""
    text = os.environ.get("FSTREAM_FAULT_SEEDS", "1,2,3")
    return [int(s) for s in text.replace(" ", "").split(",") if s]


def wait_for(pred: Callable[[], Any], timeout: float, what: str, step: float = 0.02) -> Any:
    """Poll ``pred`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)


def _env(faultpoint: str | None, state_dir: Path) -> dict[str, str]:
    env = os.environ.copy()
    env.pop("FSTREAM_FAULTPOINT", None)
    env.pop("FSTREAM_REDIS_URL", None)
    env["FSTREAM_STATE_DIR"] = str(state_dir)
    if faultpoint:
        env["FSTREAM_FAULTPOINT"] = faultpoint
    return env


class Proc:
    """A started agent process; ``kill()`` sends SIGKILL to its pid and reaps it."""

    def __init__(self, popen: subprocess.Popen, log: Path) -> None:
        self.popen, self.log = popen, log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        if self.popen.poll() is None:
            try:
                os.kill(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""


class Agents:
    """Starts receivers and senders for one test and kills whatever is left at the end.

    :param workdir: where logs and the private state dir go.
    :param secret: the shared-secret file both sides use.
    :param wan: a ``WanPath``: receivers run in its dst namespace on its dst address, senders in src.
    """

    def __init__(self, workdir: Path, secret: Path, wan: Any = None) -> None:
        self.workdir, self.secret, self.wan = Path(workdir), Path(secret), wan
        self.state = self.workdir / "state"
        self.state.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []
        self._n = 0

    def _popen(self, argv: list[str], name: str, faultpoint: str | None, ns: str,
               stdout: Any = subprocess.DEVNULL) -> Proc:
        self._n += 1
        log = self.workdir / f"{self._n:02d}-{name}.log"
        err = open(log, "wb")
        kw = dict(stdout=stdout, stderr=err, env=_env(faultpoint, self.state))
        if self.wan is not None:
            p = self.wan.exec(ns, argv, **kw)
        else:
            p = subprocess.Popen(argv, **kw)
        err.close()
        proc = Proc(p, log)
        self.procs.append(proc)
        return proc

    def receiver(self, root: Path, *, port: int = 0, faultpoint: str | None = None,
                 extra: tuple[str, ...] = ()) -> "ReceiverProc":
        host = self.wan.dst_ip if self.wan is not None else "127.0.0.1"
        root.mkdir(parents=True, exist_ok=True)
        argv = [*CLI, "-v", "receive", "--listen", f"{host}:{port}", "--root", str(root),
                "--secret-file", str(self.secret), *extra]
        proc = self._popen(argv, "receive", faultpoint, "dst", stdout=subprocess.PIPE)
        line = proc.popen.stdout.readline().decode().strip()  # "listening on HOST:PORT", or EOF if it died
        proc.popen.stdout.close()
        if not line.startswith("listening on"):
            proc.kill()
            raise AssertionError(f"receiver did not start: {line!r}\n{proc.log_text()}")
        rp = ReceiverProc(proc.popen, proc.log)
        rp.host, rp.port, rp.root = host, int(line.rsplit(":", 1)[1]), root
        self.procs[-1] = rp
        return rp

    def sender(self, sources: list[Path | str], port: int, *, host: str | None = None, dest: str = "out",
               faultpoint: str | None = None, cc: int = 2, p: int = 2, pp: int = 2,
               extra: tuple[str, ...] = ()) -> "SenderProc":
        host = host or (self.wan.dst_ip if self.wan is not None else "127.0.0.1")
        argv = [*CLI, *(["-vv"] if os.environ.get("FAULT_DEBUG") else ["-v"]), "send", *map(str, sources), "--to", f"fstream://{host}:{port}/{dest}",
                "--secret-file", str(self.secret), "--json", "--tuner", "fixed", "--cc", str(cc),
                "--p", str(p), "--pp", str(pp), *extra]
        self._n += 1
        out = self.workdir / f"{self._n:02d}-send.json"
        fh = open(out, "wb")
        self._n -= 1
        proc = self._popen(argv, "send", faultpoint, "src", stdout=fh)
        fh.close()
        sp = SenderProc(proc.popen, proc.log)
        sp.out = out
        self.procs[-1] = sp
        return sp

    def send(self, *args: Any, timeout: float = 60.0, **kw: Any) -> tuple[int, dict | None, str]:
        """Run a sender to the end: (exit code, its --json result or None, its log)."""
        sp = self.sender(*args, **kw)
        return sp.wait(timeout)

    def cleanup(self) -> None:
        for p in self.procs:
            p.kill()


class ReceiverProc(Proc):
    host: str
    port: int
    root: Path


class SenderProc(Proc):
    out: Path

    def wait(self, timeout: float) -> tuple[int, dict | None, str]:
        try:
            rc = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"sender still running after {timeout:.0f} s (hung)\n{self.log_text()[-3000:]}")
        return rc, self.result(), self.log_text()

    def result(self) -> dict | None:
        try:
            text = self.out.read_text().strip()
        except FileNotFoundError:
            return None
        for line in reversed(text.splitlines()):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
        return None


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of ``target``.

    :param rate: bytes/s each connection forwards towards the receiver (None: as fast as it can).
    :param on_forward: called with the running total of bytes forwarded towards the receiver.
    """

    def __init__(self, target: tuple[str, int], rate: float | None = None) -> None:
        self.target, self.rate = target, rate
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.forwarded = 0
        self.conns = 0
        self.throttle: dict[int, float] = {}  # connection index -> bytes/s
        self.throttled_bytes: dict[int, int] = {}
        # bytes/s for the first data connection (index >= 1) that moves more than a handshake's worth:
        # which stream takes a block first is up to thread scheduling, so pick it when it happens
        self.throttle_first_data: float | None = None
        self._kill_at: tuple[int, int] | None = None
        self.killed_at: int | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def kill_at(self, nbytes: int, pid: int) -> None:
        """SIGKILL ``pid`` as soon as ``nbytes`` were forwarded towards the receiver."""
        self._kill_at = (nbytes, pid)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                idx = self.conns
                self.conns += 1
            try:
                u = socket.create_connection(self.target, timeout=10)
            except OSError:
                c.close()
                continue
            u.settimeout(None)
            for s in (c, u):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks += [c, u]
            threading.Thread(target=self._pump, args=(c, u, idx, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c, idx, False), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket, idx: int, upstream: bool) -> None:
        t0, moved = time.monotonic(), 0
        try:
            while not self._stop.is_set():
                rate = self.throttle.get(idx) if upstream else None
                rate = rate or (self.rate if upstream else None)
                chunk = a.recv(max(256, int(rate / 20)) if rate else 1 << 16)
                if not chunk:
                    break
                b.sendall(chunk)
                if upstream:
                    moved += len(chunk)
                    with self._lock:
                        if (self.throttle_first_data and idx >= 1 and moved > 4096
                                and idx not in self.throttle):
                            self.throttle[idx] = self.throttle_first_data
                            self.throttle_first_data = None
                            t0, moved = time.monotonic(), 0
                        self.forwarded += len(chunk)
                        total = self.forwarded
                        if idx in self.throttle:
                            self.throttled_bytes[idx] = self.throttled_bytes.get(idx, 0) + len(chunk)
                    k = self._kill_at
                    if k is not None and total >= k[0] and self.killed_at is None:
                        self.killed_at = total
                        try:
                            os.kill(k[1], signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    if rate:
                        delay = t0 + moved / rate - time.monotonic()
                        if delay > 0:
                            self._stop.wait(delay)  # the throttle itself, not a wait for an event
        except OSError:
            pass
        finally:
            # one side closed: close both connections fully (a half-close would leave the other peer's
            # connection open in one direction, which neither real peer would see on a cut path)
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        try:
            self.sock.close()
        except OSError:
            pass
        for s in self._socks:
            try:
                s.close()
            except OSError:
                pass
