"""CPU-seconds of each side of a transfer (issue 13: "CPU per GB and per 1,000 files, both sides").

A side is a process tree. A client (``fstream send``, ``globus-url-copy``, ``iperf3 -c``) runs
start to finish, so its CPU is the kernel's own account at exit: ``wait4``'s rusage, user + system,
every thread and every reaped child; it includes the client's start-up, as a user pays it (the
benchmark's 1-byte run measures that part). A server (``fstream receive``, ``globus-gridftp-server``
and the child it forks per session) is already running when the client starts, so it is measured
as a difference: the tree's CPU (user + system of each live process and of its reaped children,
from ``/proc`` through psutil) just before the client starts and again once the tree has gone quiet
after the client ended; its start-up is outside the figure. ``iperf3 -s -1`` serves one test and
exits: its whole life, from ``wait4``.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass

import psutil


def tree_cpu(pid: int) -> float:
    """User + system CPU-seconds of ``pid``, its live descendants and the children they reaped."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def settled_cpu(pid: int, *, quiet: float = 0.005, step: float = 0.2, limit: float = 5.0) -> float:
    """``tree_cpu`` once it stops growing (less than ``quiet`` s of CPU in ``step`` s), at most ``limit`` s."""
    deadline = time.monotonic() + limit
    last = tree_cpu(pid)
    while time.monotonic() < deadline:
        time.sleep(step)
        now = tree_cpu(pid)
        if now - last < quiet:
            return now
        last = now
    return last


class ServerCpu:
    """The CPU a running server tree spends between ``start()`` and ``stop()``.

    ``start()`` reads the tree's CPU; ``stop()`` waits for the tree to settle and returns the
    difference in CPU-seconds (the server's share of the transfer that ran in between).
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = 0.0

    def start(self) -> "ServerCpu":
        self.before = tree_cpu(self.pid)
        return self

    def stop(self) -> float:
        return max(0.0, settled_cpu(self.pid) - self.before)


@dataclass
class Finished:
    """A client process that ran to completion: exit status, wall seconds, stdout, CPU-seconds."""

    status: int
    wall: float
    out: str
    cpu_s: float


def wait_with_usage(proc: subprocess.Popen, timeout: float) -> tuple[str, float]:
    """Read ``proc``'s stdout to the end and reap it with ``wait4``; return (stdout, user+sys CPU-s).

    Raises ``subprocess.TimeoutExpired`` (the process still running) after ``timeout`` seconds.
    """
    chunks: list[bytes] = []
    reader = None
    if proc.stdout is not None:
        def read() -> None:
            for chunk in iter(lambda: proc.stdout.read(65536), b""):  # type: ignore[union-attr]
                chunks.append(chunk)
        reader = threading.Thread(target=read, name="client-stdout", daemon=True)
        reader.start()
    deadline = time.monotonic() + timeout
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        time.sleep(0.005)
    if reader is not None:
        reader.join(5.0)
        proc.stdout.close()  # type: ignore[union-attr]
    return b"".join(chunks).decode(errors="replace"), ru.ru_utime + ru.ru_stime


def reap(proc: subprocess.Popen) -> float:
    """Wait for ``proc`` to exit (``wait4``, blocking), set its ``returncode`` and return its CPU-seconds (user +
    system, every thread and every child it reaped): a client's CPU as the kernel accounts it at its exit."""
    _pid, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return ru.ru_utime + ru.ru_stime
