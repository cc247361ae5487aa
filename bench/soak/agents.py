"""The soak's agents: the ``fstream send --watch`` and ``fstream receive`` processes, their restarts and reports."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

CLI = [sys.executable, "-m", "transfer_agent.cli"]


class Agents:
    """Starts, restarts, samples and stops the soak's sender and receiver (subprocesses; in namespaces on the WAN).

    Callers that act on a process hold ``lock`` (the monitor and the fault injector both do).

    :param args: the soak's parsed arguments (``cc``, ``p``, ``pp``, ``stall_timeout``).
    :param src: the source directory the sender watches.
    :param dst: the receiver's root.
    :param logs: where each process's log (and each sender's ``--json``) goes, numbered in start order.
    :param path: the emulated WAN path, or None on loopback.
    """

    def __init__(self, args: argparse.Namespace, *, work: Path, src: Path, dst: Path, logs: Path,
                 path: Any = None) -> None:
        self.args, self.src, self.dst, self.logs, self.path = args, src, dst, logs, path
        from transfer_agent.wire.auth import create_secret_file

        self.secret = create_secret_file(work / "secret")
        self.env = {**os.environ, "FSTREAM_STATE_DIR": str(work / "state")}
        self.env.pop("FSTREAM_FAULTPOINT", None)
        self.env.pop("FSTREAM_REDIS_URL", None)
        self.host = path.dst_ip if path is not None else "127.0.0.1"
        self.port = 0
        self.lock = threading.Lock()
        self.rx: subprocess.Popen | None = None
        self.tx: subprocess.Popen | None = None
        self.tx_out: Path | None = None
        self.n = 0
        self.sender_runs: list[dict] = []
        self.restarts = {"sender_exited": 0, "receiver_exited": 0}
        self.peak = {"sender": {"rss": 0, "fds": 0}, "receiver": {"rss": 0, "fds": 0}}

    def _popen(self, ns: str, argv: list[str], **kw: Any) -> subprocess.Popen:
        if self.path is not None:
            return self.path.exec(ns, argv, env=self.env, **kw)
        return subprocess.Popen(argv, env=self.env, **kw)

    def start_receiver(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            self.n += 1
            log = open(self.logs / f"{self.n:03d}-receive.log", "wb")  # noqa: SIM115 - handed to the child
            p = self._popen("dst", [*CLI, "-v", "receive", "--listen", f"{self.host}:{self.port}", "--root",
                                    str(self.dst), "--secret-file", str(self.secret)],
                            stdout=subprocess.PIPE, stderr=log)
            log.close()
            assert p.stdout is not None
            line = p.stdout.readline().decode().strip()
            p.stdout.close()
            if line.startswith("listening on"):
                self.port = int(line.rsplit(":", 1)[1])
                self.rx = p
                return
            p.wait()
            if time.monotonic() > deadline:
                raise RuntimeError(f"fstream receive did not restart on {self.host}:{self.port}: "
                                   f"{(self.logs / f'{self.n:03d}-receive.log').read_text()[-800:]}")
            time.sleep(0.5)  # the port may still be held for a moment after the SIGKILL

    def sender_argv(self, watch: bool) -> list[str]:
        a = self.args
        argv = [*CLI, "-v", "send", str(self.src), "--to", f"fstream://{self.host}:{self.port}/soak",
                "--secret-file", str(self.secret), "--json", "--tuner", "fixed", "--cc", str(a.cc), "--p", str(a.p),
                "--pp", str(a.pp), "--stall-timeout", a.stall_timeout]
        return argv + (["--watch", "--interval", "1s"] if watch else [])

    def start_sender(self) -> None:
        self.n += 1
        self.tx_out = self.logs / f"{self.n:03d}-send.json"
        out = open(self.tx_out, "wb")  # noqa: SIM115 - handed to the child, closed below
        log = open(self.logs / f"{self.n:03d}-send.log", "wb")  # noqa: SIM115
        self.tx = self._popen("src", self.sender_argv(True), stdout=out, stderr=log)
        out.close()
        log.close()

    def reap_sender(self, how: str) -> None:
        """Record the finished sender run (its --json, if it printed one)."""
        assert self.tx is not None and self.tx_out is not None
        rc = self.tx.wait()
        res = last_json(self.tx_out)
        self.sender_runs.append({"pid": self.tx.pid, "end": how, "rc": rc, "result": slim(res)})

    def restart_exited(self) -> None:
        """Restart a sender or receiver that exited on its own (counted); the caller holds ``lock``."""
        if self.tx is not None and self.tx.poll() is not None:
            self.reap_sender("exited by itself")
            self.restarts["sender_exited"] += 1
            self.start_sender()
        if self.rx is not None and self.rx.poll() is not None:
            self.restarts["receiver_exited"] += 1
            self.start_receiver()

    def stop_watching_sender(self) -> None:
        """After the drain: SIGTERM the watching sender (SIGKILL after 30 s); a receiver must be up for the final
        send."""
        with self.lock:
            if self.tx is not None and self.tx.poll() is None:
                self.tx.send_signal(signal.SIGTERM)
                try:
                    self.tx.wait(30)
                except subprocess.TimeoutExpired:
                    self.kill(self.tx)
            if self.tx is not None:
                self.reap_sender("stopped after the drain")
            if self.rx is not None and self.rx.poll() is not None:
                self.start_receiver()

    def final_send(self, timeout: float) -> tuple[int | None, dict | None]:
        """One ``fstream send`` over the whole source (no --watch): its exit status (None: timed out) and --json."""
        self.n += 1
        out = self.logs / f"{self.n:03d}-send-final.json"
        with open(out, "wb") as fo, open(self.logs / f"{self.n:03d}-send-final.log", "wb") as fl:
            final = self._popen("src", self.sender_argv(False), stdout=fo, stderr=fl)
            try:
                final_rc = final.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill(final)
                final_rc = None
        final_res = last_json(out)
        self.sender_runs.append({"pid": final.pid, "end": "final send", "rc": final_rc, "result": slim(final_res)})
        return final_rc, final_res

    def stop_receiver(self) -> None:
        if self.rx is not None:
            self.rx.send_signal(signal.SIGTERM)
            try:
                self.rx.wait(30)
            except subprocess.TimeoutExpired:
                self.kill(self.rx)

    def close(self) -> None:
        """SIGKILL whatever still runs (on any exit, also an exception or Ctrl-C)."""
        for p in (self.tx, self.rx):
            self.kill(p)

    def kill(self, p: subprocess.Popen | None) -> None:
        if p is not None and p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if p is not None:
            p.wait()

    def sample(self) -> None:
        """Fold the agents' current RSS and open fds (with their children) into ``peak``."""
        import psutil

        for role, p in (("sender", self.tx), ("receiver", self.rx)):
            if p is None or p.poll() is not None:
                continue
            try:
                ps = psutil.Process(p.pid)
                procs = [ps, *ps.children(recursive=True)]
                rss = sum(q.memory_info().rss for q in procs)
                fds = sum(q.num_fds() for q in procs)
            except (psutil.Error, OSError):
                continue
            pk = self.peak[role]
            pk["rss"], pk["fds"] = max(pk["rss"], rss), max(pk["fds"], fds)


def last_json(path: Path) -> dict | None:
    """The last JSON line a ``fstream send --json`` wrote to ``path`` (None: it printed none, e.g. killed)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    for line in reversed(text.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def slim(res: dict | None) -> dict | None:
    """The parts of a send report the soak keeps (the first 20 failures, with their reasons)."""
    if not res:
        return None
    keep = ("ok", "files", "bytes", "bytes_sent", "resumed_bytes", "verified_files", "skipped_files", "seconds",
            "throughput_bps")
    out = {k: res[k] for k in keep if k in res}
    out["failures"] = [{"dest": f.get("dest"), "reason": f.get("reason")} for f in res.get("failures", [])][:20]
    return out
