"""Helpers for data-plane tests: real receivers on loopback, a throttled receiver, tree comparison."""

from __future__ import annotations

import contextlib
import filecmp
import os
import secrets
import socket
import threading
from pathlib import Path
from typing import Any

from fstream_provider.model.spec import TransferSpec
from transfer_agent.receiving.receiver import Receiver
from transfer_agent.receiving.state import RecvFile
from transfer_agent.sending.result import TransferResult
from transfer_agent.sending.sender import Transfer


def wait_until(cond: Any, timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``cond`` (every 20 ms) until it is true and return what it gave; fail naming ``what`` after
    ``timeout`` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"{what} not reached in time"
        threading.Event().wait(0.02)
    return value


def write_secret(path: Path) -> Path:
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


def make_files(root: Path, sizes: dict[str, int], seed: int = 0) -> Path:
    """Create files with reproducible random content."""
    import random

    rnd = random.Random(seed)
    for rel, size in sizes.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rnd.randbytes(size))
    return root


def trees_identical(a: Path, b: Path) -> bool:
    """True when both trees hold the same regular files with the same bytes (ignores nothing)."""
    fa = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    fb = sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    if fa != fb:
        return False
    return all(filecmp.cmp(a / r, b / r, shallow=False) for r in fa)


def part_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".part")]


def send(src: Any, port: int, secret_file: Path, dest: str = "out", **opts: Any) -> TransferResult:
    sources = [str(s) for s in (src if isinstance(src, (list, tuple)) else [src])]
    kw = {k: v for k, v in opts.items() if k in ("job_id", "attempt", "on_event", "cancel", "stall_timeout",
                                                 "max_session_retries")}
    if not isinstance(opts.get("tuner", ""), str):
        kw["tuner"] = opts.pop("tuner")
    spec_opts = {k: v for k, v in opts.items() if k not in kw}
    if "tuner" not in kw:  # an injected tuner runs under the spec's default name, which takes every option
        spec_opts.setdefault("tuner", "fixed")
    spec = TransferSpec.from_options(sources, f"fstream://127.0.0.1:{port}/{dest}", secret_file=str(secret_file),
                                     **spec_opts)
    return Transfer(spec, **kw).run()


class GatedReceiver(Receiver):
    """A real receiver whose writes can be held at a gate once ``hold_after`` bytes arrived.

    Tests use it to stop a transfer at a known point (to kill the sender mid-file, or to
    modify a source while it is in flight) without sleeping or racing the network.
    """

    def __init__(self, *args: Any, hold_after: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hold_after = hold_after
        self.gate = threading.Event()
        self.reached = threading.Event()
        self._seen = 0
        self._seen_lock = threading.Lock()

    def _claim(self, f: RecvFile, off: int, length: int) -> None:  # runs before every data block is taken in
        with self._seen_lock:
            self._seen += length
            hold = self.hold_after is not None and self._seen > self.hold_after
        if hold:
            self.reached.set()
            self.gate.wait(60)
        super()._claim(f, off, length)


class PacedReceiver(Receiver):
    """A real receiver that writes at most ``rate`` bytes/s (a storage-speed limit), so tuning has time to act."""

    def __init__(self, *args: Any, rate: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rate = rate
        self._t0: float | None = None
        self._bytes = 0
        self._lock = threading.Lock()
        self._never = threading.Event()

    def _claim(self, f: RecvFile, off: int, length: int) -> None:
        import time

        with self._lock:
            if self._t0 is None:
                self._t0 = time.monotonic()
            self._bytes += length
            due = self._t0 + self._bytes / self.rate
        delay = due - time.monotonic()
        if delay > 0:
            self._never.wait(delay)  # a storage throttle, not a wait for an event
        super()._claim(f, off, length)


def start_receiver(root: Path, secret_file: Path, cls: type[Receiver] = Receiver, **kw: Any) -> Receiver:
    from transfer_agent.wire.auth import load_secret

    os.makedirs(root, exist_ok=True)
    return cls(listen=("127.0.0.1", 0), root=str(root), secret=load_secret(secret_file), **kw).start()


def write_file(path: Any, data: bytes, mtime: float | None = None) -> str:
    """Write ``data`` to ``path`` (parents created), optionally back-dating its mtime; return the path."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return str(path)


def transfer_swapping_after_listing(swap: Any) -> Any:
    """A ``Transfer`` factory (an agent's ``transfer_factory``) whose guard calls ``swap()`` right after the listed
    files passed it, before any is opened: what an attacker racing the agent between its listing and its open does."""
    from transfer_agent.sending.sender import Transfer

    class SwapAfterListing:
        def __init__(self, guard: Any) -> None:
            self.guard = guard

        def admit(self, files: Any, refused: Any) -> Any:
            admitted = self.guard.admit(files, refused)
            swap()
            return admitted

        def open(self, path: str) -> Any:
            return self.guard.open(path)

        def check_fd(self, fd: int, path: str) -> None:  # the guard's gate before issue 40 (tests run on that code too)
            self.guard.check_fd(fd, path)

    return lambda spec, **kw: Transfer(spec, **{**kw, "guard": SwapAfterListing(kw["guard"])})


def pump(a: socket.socket, b: socket.socket) -> None:
    """Copy ``a`` → ``b`` until ``a`` ends or fails, then shut both down (one direction of a test's relay)."""
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def jobs_on_workers(workers: int) -> list[str]:
    """One job name per worker of ``fstream receive --workers N``, each routed to that worker (the route is a hash
    of key and job: ``receiving.router.route``)."""
    from transfer_agent.receiving.router import route

    found: dict[int, str] = {}
    i = 0
    while len(found) < workers:
        job = f"job-{i}"
        found.setdefault(route({"role": "control", "key": "default", "job": job}, workers, {}, 0), job)
        i += 1
    return [found[w] for w in range(workers)]
