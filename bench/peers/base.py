"""Shared pieces for peer tools: where each end runs, process start/stop, results, dest sampling."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from fstream_bench.core.cpu_meter import Finished, wait_with_usage


class PeerError(RuntimeError):
    """A peer tool could not be started or its transfer failed (the message names the tool and why)."""


@dataclass(frozen=True)
class Sites:
    """Where the two ends of a transfer run and how to reach them.

    On loopback both prefixes are empty and both hosts are 127.0.0.1. On the emulated WAN the
    prefixes are ``ip netns exec NS`` for the source and destination namespaces.

    :param src_host: address of the source site (iperf3 client, sender, source server).
    :param dst_host: address of the destination site (receiver, servers).
    :param src_prefix: argv prefix that runs a command at the source site.
    :param dst_prefix: argv prefix that runs a command at the destination site.
    :param name: short name for reports ("loopback", "wan").
    """

    src_host: str = "127.0.0.1"
    dst_host: str = "127.0.0.1"
    src_prefix: tuple[str, ...] = ()
    dst_prefix: tuple[str, ...] = ()
    name: str = "loopback"

    def argv(self, side: str, argv: Sequence[str]) -> list[str]:
        """Return ``argv`` wrapped so it runs at ``side`` ("src" or "dst")."""
        if side not in ("src", "dst"):
            raise ValueError(f"site {side!r}: expected 'src' or 'dst'")
        prefix = self.src_prefix if side == "src" else self.dst_prefix
        return [*prefix, *argv]

    def host(self, side: str) -> str:
        return self.src_host if side == "src" else self.dst_host


@dataclass
class PeerResult:
    """One transfer by one tool.

    :param tool: tool label as shown in reports ("fstream-fixed", "gridftp-globus", "iperf3").
    :param settings: the knobs the tool ran with (cc, p, pp, ...).
    :param files: files moved (0 for memory-to-memory tools).
    :param bytes: payload bytes moved.
    :param seconds: wall time from start to the last byte landing.
    :param ok: the tool exited 0 and (for file tools) every file arrived with the right size.
    :param verified: the tool checked content end to end (checksums).
    :param error: why it failed (empty when ok).
    :param intervals: ``{t, throughput_bps, cc, p, pp}`` samples over time.
    :param extra: tool-specific numbers (self-reported seconds, retransmits, ...).
    :param cpu_src_s: CPU-seconds (user + system) of the source side, when measured.
    :param cpu_dst_s: CPU-seconds of the destination side, when measured.
    """

    tool: str
    settings: dict = field(default_factory=dict)
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    ok: bool = False
    verified: bool = False
    error: str = ""
    intervals: list[dict] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    cpu_src_s: float | None = None
    cpu_dst_s: float | None = None

    @property
    def throughput_bps(self) -> float:
        return self.bytes * 8.0 / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["throughput_bps"] = self.throughput_bps
        return d


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now (bind to port 0 and release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_listening(sites: Sites, side: str, port: int, proc: subprocess.Popen | None,
                   what: str, timeout: float = 15.0) -> None:
    """Poll ``ss`` at ``side`` until something listens on ``port``; fail if ``proc`` dies first."""
    deadline = time.monotonic() + timeout
    argv = sites.argv(side, ["ss", "-Hltn", f"sport = :{port}"])
    delay = 0.02
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise PeerError(f"{what}: exited with status {proc.returncode} before listening on port {port}"
                            f"{_tail(proc)}")
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
        if out.strip():
            return
        threading.Event().wait(delay)
        delay = min(delay * 2, 0.2)
    raise PeerError(f"{what}: nothing listening on port {port} after {timeout:.0f} s")


def wait_logged(log_path: Path, pattern: re.Pattern, proc: subprocess.Popen, what: str,
                timeout: float = 30.0) -> re.Match:
    """Poll ``log_path`` until ``pattern`` is in it and return the match; fail if ``proc`` exits first, or after
    ``timeout`` seconds, naming ``what`` and the log's tail."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        m = pattern.search(log_path.read_text(errors="replace")) if log_path.exists() else None
        if m:
            return m
        if proc.poll() is not None:
            raise PeerError(f"{what}: exited with status {proc.returncode}: {log_tail(log_path)}")
        time.sleep(0.02)  # polling a log file with a deadline
    raise PeerError(f"{what}: not seen within {timeout:.0f} s: {log_tail(log_path)}")


def _tail(proc: subprocess.Popen) -> str:
    log = getattr(proc, "log_path", None)
    if log and Path(log).exists():
        text = Path(log).read_text(errors="replace").strip()
        if text:
            return ": " + text[-600:]
    return ""


def spawn(sites: Sites, side: str, argv: Sequence[str], log_path: Path | None = None,
          env: dict | None = None, stdout=None) -> subprocess.Popen:
    """Start ``argv`` at ``side`` in its own process group; stderr (and stdout) go to ``log_path``."""
    full = sites.argv(side, argv)
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=stdout if stdout is not None else log,
                                stderr=log, env=env, start_new_session=True)
    except FileNotFoundError as e:
        raise PeerError(f"{argv[0]}: not installed ({e})") from e
    finally:
        if log_path:
            log.close()
    proc.log_path = log_path  # type: ignore[attr-defined]
    proc.cmdline = shlex.join(full)  # type: ignore[attr-defined]
    return proc


def stop(proc: subprocess.Popen | None, grace: float = 5.0) -> None:
    """Terminate ``proc``'s process group, then kill it if it does not exit within ``grace``."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def tree_bytes(root: Path) -> tuple[int, int]:
    """Return (bytes on disk, capped at each file's size; regular files with no leading dot)
    and the count of such complete-named files under ``root``.

    Temp files (leading dot: rsync, fstream ``.part``) count towards bytes but not files, so
    the byte curve shows progress while the file count shows only committed names.
    """
    total, names = 0, 0
    stack = [str(root)]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except FileNotFoundError:
            continue
        with it:
            for e in it:
                try:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        total += min(st.st_size, st.st_blocks * 512)
                        if not e.name.startswith("."):
                            names += 1
                except FileNotFoundError:
                    continue
    return total, names


class DestSampler:
    """Samples bytes landed under a destination directory every ``period`` seconds in a thread.

    Gives every file tool the same yardstick: the throughput curve is the growth of bytes on
    the destination disk, and completion is the first sample where all expected files exist
    under their final names with all their bytes.

    :param root: destination directory to watch.
    :param expect_bytes: total bytes expected (0: unknown).
    :param expect_files: total files expected (0: unknown).
    :param period: seconds between samples.
    :param clock: time source (monotonic seconds).
    """

    def __init__(self, *, root: Path, expect_bytes: int = 0, expect_files: int = 0, period: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root = Path(root)
        self.expect_bytes = expect_bytes
        self.expect_files = expect_files
        self.period = period
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = 0.0
        self.samples: list[tuple[float, int, int]] = []
        self.complete_at: float | None = None

    def start(self, t0: float | None = None) -> "DestSampler":
        self.t0 = self._clock() if t0 is None else t0
        self._thread = threading.Thread(target=self._run, name="dest-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.period):
                break
        self.sample()

    def sample(self) -> None:
        b, n = tree_bytes(self.root)
        t = self._clock() - self.t0
        self.samples.append((t, b, n))
        if (self.complete_at is None and (self.expect_bytes or self.expect_files)
                and b >= self.expect_bytes and n >= self.expect_files):
            self.complete_at = t

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)

    def intervals(self, cc: int = 0, p: int = 0, pp: int = 0) -> list[dict]:
        """Per-sample throughput (bits/s) derived from the byte curve."""
        out = []
        for (t0, b0, _), (t1, b1, _) in zip(self.samples, self.samples[1:]):
            if t1 <= t0:
                continue
            out.append({"t": round(t1, 3), "throughput_bps": (b1 - b0) * 8.0 / (t1 - t0),
                        "cc": cc, "p": p, "pp": pp, "bytes": b1})
            if self.complete_at is not None and t1 >= self.complete_at:
                break
        return out


def dataset_stats(paths: Sequence[Path]) -> tuple[int, int]:
    """Return (files, bytes) of regular files under ``paths`` (files or directories)."""
    files = size = 0
    for p in paths:
        p = Path(p)
        if p.is_dir():
            for dirpath, _dirs, names in os.walk(p):
                for n in names:
                    files += 1
                    size += os.stat(os.path.join(dirpath, n)).st_size
        else:
            files += 1
            size += p.stat().st_size
    return files, size


def run_timed(argv: list[str], timeout: float, log_path: Path | None = None,
              env: dict | None = None) -> tuple[int, float, str]:
    """Run ``argv`` to completion; return (status, wall seconds, captured stdout)."""
    done = run_client(argv, timeout, log_path, env)
    return done.status, done.wall, done.out


def run_client(argv: list[str], timeout: float, log_path: Path | None = None,
               env: dict | None = None) -> Finished:
    """Run ``argv`` to completion; its status, wall seconds, stdout and CPU-seconds (``wait4``)."""
    t0 = time.monotonic()
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                env=env, start_new_session=True)
    except FileNotFoundError as e:
        raise PeerError(f"{argv[0]}: not installed ({e})") from e
    finally:
        if log_path:
            log.close()
    try:
        out, cpu = wait_with_usage(proc, timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise PeerError(f"{shlex.join(argv[:3])}...: did not finish within {timeout:.0f} s")
    except BaseException:
        stop(proc)
        raise
    return Finished(proc.returncode, time.monotonic() - t0, out, cpu)


def log_tail(log_path: Path | None, n: int = 600) -> str:
    if log_path and Path(log_path).exists():
        return Path(log_path).read_text(errors="replace").strip()[-n:]
    return ""
