"""``fstream receive --workers N``: one port, N receiver processes (issue 43; ``transfer_agent.receiving.router``).

The process the user starts is the router: it binds the port, starts N workers (this same command, each given its
end of a unix socket pair as ``--handoff-fd``) and hands each accepted connection to one of them. A worker is an
ordinary ``fstream receive`` in every other respect (its own sessions, commits, fd budget and logs, whose lines
name it). The router:

- prints ``listening on HOST:PORT`` (and tells systemd it is ready) once every worker is;
- restarts a worker that dies (``RESTART_PAUSE``, doubled while it keeps dying at start; its senders' sessions
  were cut and resume);
- passes SIGHUP on to the workers (each reloads as one receiver does), re-reads the keyring for its routes and
  reloads its own caps on the connections it holds and their handshake time (``cli.reload.router_apply``);
- on SIGTERM tells the workers to drain (``--drain-grace``: open sessions finish, none starts) and keeps routing
  until they have exited; on SIGINT stops them at once.

With ``--metrics-listen`` the router serves ``/metrics`` and ``/readyz`` for all of them on that address, each
worker's samples labelled ``worker`` (``service.worker_metrics``). Refused, naming why: TLS (the HELLO a route is
chosen by is inside TLS). With a keyring whose keys have quotas, the one-process quota state is
marked in use and left unclean, so a later one-process receiver recounts what the workers changed; each worker
counts its keys' subtrees once per start (``receiving.quota``, in memory).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from transfer_agent.errors import FStreamError

log = logging.getLogger("fstream.receiver")
READY_TIMEOUT = 60.0  # a worker that has not said "listening" by then: the router gives up
RESTART_PAUSE = 1.0  # between restarts of one worker; doubled for each that died within STABLE s, up to the max
RESTART_PAUSE_MAX = 30.0
STABLE = 60.0
STOP_MARGIN = 15.0  # after the drain grace (SIGTERM) or at once (SIGINT): then workers are killed
CHILD_ENV_DROP = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID")


def refuse(args: argparse.Namespace, tls: Any) -> None:
    """The options ``--workers`` cannot run with, as an error naming the option and why."""
    if args.workers < 1:
        raise FStreamError(f"--workers {args.workers}: must be at least 1")
    if tls is not None:
        raise FStreamError("--workers > 1 needs the HMAC handshake (--secret-file or --keyring): with TLS the HELLO "
                           "that chooses a session's process is inside the TLS stream, which only a worker reads")


class _Worker:
    """One worker process and the router's end of its channel."""

    def __init__(self, index: int, argv: list[str], port: int, watch_metrics: bool = False) -> None:
        self.index, self.argv, self.port, self.watch_metrics = index, argv, port, watch_metrics
        self.proc: subprocess.Popen[str] | None = None
        self.chan: socket.socket | None = None
        self.started = 0.0
        self.quick = 0  # deaths in a row within STABLE seconds of a start
        self.died: float | None = None  # when the router saw it dead
        self.metrics: str | None = None  # its loopback metrics URL, from its stderr (``service.worker_metrics``)
        self.addressed = threading.Event()  # set once ``metrics`` is known for the running process
        self.restarts = 0

    def spawn(self) -> socket.socket:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in os.environ.items() if k not in CHILD_ENV_DROP}
        self.metrics = None  # before the process can print its new address
        self.addressed.clear()
        cmd = [sys.executable, "-m", "transfer_agent.cli", *self.argv, "--handoff-fd", str(theirs.fileno()),
               "--worker-index", str(self.index), "--router-port", str(self.port)]
        try:
            self.proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE if self.watch_metrics else None, text=True, env=env)
        finally:
            theirs.close()
        if self.watch_metrics:  # its log to ours, noting the metrics address it prints there
            threading.Thread(target=self._stderr, args=(self.proc.stderr,), daemon=True).start()
        self.chan, self.started, self.died = mine, time.monotonic(), None
        return mine

    def _stderr(self, err: Any) -> None:
        from transfer_agent.service.worker_metrics import WORKER_LINE

        for line in err:
            m = None if self.addressed.is_set() else WORKER_LINE.match(line)
            if m:
                self.metrics = m.group(1)
                self.addressed.set()
            sys.stderr.write(line)

    def wait_ready(self, deadline: float) -> None:
        """Read the worker's stdout until its "listening on" line (and, with metrics, until its address is known),
        then forward the rest to our stderr."""
        assert self.proc is not None and self.proc.stdout is not None
        out = self.proc.stdout
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(out.readline()), daemon=True)
        reader.start()
        reader.join(max(0.0, deadline - time.monotonic()))
        line = box[0] if box else ""
        if self.watch_metrics and line:  # printed before "listening on", on the other pipe
            self.addressed.wait(max(0.0, deadline - time.monotonic()))
        if not line.startswith("listening on") or (self.watch_metrics and not self.addressed.is_set()):
            self.proc.kill()
            raise FStreamError(f"receive --workers: worker {self.index} did not start (exit {self.proc.wait()}); "
                               "its error is above")
        threading.Thread(target=lambda: [sys.stderr.write(f"worker {self.index}: {x}") for x in out],
                         daemon=True).start()


def run(args: argparse.Namespace, keyring: Any, quota_state: str, tls: Any, listen: tuple[str, int],
        stop: threading.Event, term: threading.Event) -> int:
    """The router process (see the module): ``stop`` is set by SIGINT and SIGTERM, ``term`` by SIGTERM."""
    from fstream_provider.model.units import parse_duration
    from transfer_agent.receiving.quota import Quotas
    from transfer_agent.receiving.router import Router
    from transfer_agent.service import sdnotify

    refuse(args, tls)
    keys = keyring.values() if keyring is not None else ()
    Quotas(os.path.abspath(args.root), state_path=quota_state, keys=lambda: keys).open()  # in use; never closed
    argv = list(args.argv if args.argv is not None else sys.argv[1:])
    if args.metrics_listen:  # each worker on a loopback port of its own; the router serves them all (on its address)
        argv += ["--metrics-listen", "127.0.0.1:0"]
    router = Router(listen=listen, workers=args.workers, keys=keys,
                    handshake_timeout=parse_duration(args.handshake_timeout), max_unauth=args.max_unauth,
                    max_unauth_per_addr=args.max_unauth_per_addr).bind()
    workers = [_Worker(i, argv, router.port, bool(args.metrics_listen)) for i in range(args.workers)]
    hup = threading.Event()
    signal.signal(signal.SIGHUP, lambda *_: hup.set())
    service = None
    try:
        for w in workers:
            router.set_worker(w.index, w.spawn())
        router.start()
        deadline = time.monotonic() + READY_TIMEOUT
        for w in workers:
            w.wait_ready(deadline)
        service = _serve_metrics(args, router, workers)
        host = router.listen_addr[0]
        print(f"listening on {host}:{router.port}", flush=True)
        log.info("router on %s:%d: %d worker processes (pids %s)", host, router.port, len(workers),
                 ", ".join(str(w.proc.pid) for w in workers if w.proc is not None))
        sdnotify.ready(f"listening on {host}:{router.port}, root {args.root}, {len(workers)} worker processes")
        _supervise(workers, router, stop, hup, args, service)
    finally:
        if service is not None:
            service.stop()
        _stop_workers(workers, term.is_set(), parse_duration(args.drain_grace))
        router.stop()
    return 0


def _serve_metrics(args: argparse.Namespace, router: Any, workers: list[_Worker]) -> Any:
    """``--metrics-listen``: the router's ``/metrics`` and ``/readyz``, its workers' under ``worker`` labels
    (``service.worker_metrics.RouterService``, started); None without it (the workers serve none either)."""
    if not args.metrics_listen:
        return None
    from transfer_agent.service.worker_metrics import RouterService

    service = RouterService(args, router, lambda: [(w.index, w.metrics, w.restarts) for w in workers])
    service.start()
    return service


def _supervise(workers: list[_Worker], router: Any, stop: threading.Event, hup: threading.Event,
               args: argparse.Namespace, service: Any = None) -> None:
    from transfer_agent.service import sdnotify

    wd = sdnotify.Watchdog.from_env()
    if wd is not None:
        wd.own()
    reloader = None
    while not stop.wait(0.2):
        if wd is not None:
            wd.kick()
        if hup.is_set():
            hup.clear()
            for w in workers:
                if w.proc is not None and w.proc.poll() is None:
                    w.proc.send_signal(signal.SIGHUP)
            if args.keyring:
                from transfer_agent.receiving.keyring import load_keyring
                try:
                    router.set_keys(load_keyring(args.keyring).values())
                except FStreamError as exc:
                    log.warning("router: keyring %s not re-read (%s): routes unchanged", args.keyring, exc)
            if reloader is None:  # the router's own caps and handshake time (cli.reload, imported on the first HUP)
                from transfer_agent.cli.reload import RECEIVER_LIVE, Reloader, router_apply
                reloader = Reloader(args, RECEIVER_LIVE, router_apply(router, args, service))
            reloader.reload()
        for w in workers:
            if w.proc is None or w.proc.poll() is None or stop.is_set():
                continue
            now = time.monotonic()
            if w.died is None:
                w.died = now
                w.quick = 0 if now - w.started > STABLE else w.quick + 1
            if now - w.died < min(RESTART_PAUSE_MAX, RESTART_PAUSE * 2 ** max(0, w.quick - 1)):
                continue  # a worker that keeps dying soon after its start is restarted ever less often
            log.warning("router: worker %d (pid %d) exited with %s; restarting it", w.index, w.proc.pid,
                        w.proc.returncode)
            router.set_worker(w.index, w.spawn())
            w.restarts += 1
            threading.Thread(target=_ready_or_log, args=(w,), daemon=True).start()  # the loop goes on meanwhile


def _ready_or_log(w: _Worker) -> None:
    try:
        w.wait_ready(time.monotonic() + READY_TIMEOUT)
    except FStreamError as exc:
        log.warning("router: %s", exc)


def _stop_workers(workers: list[_Worker], drain: bool, grace: float) -> None:
    """SIGTERM (drain: the router keeps routing meanwhile, so open sessions can still open channels) or SIGINT;
    killed after ``STOP_MARGIN`` more seconds."""
    sig = signal.SIGTERM if drain else signal.SIGINT
    for w in workers:
        if w.proc is not None and w.proc.poll() is None:
            w.proc.send_signal(sig)
    end = time.monotonic() + (grace if drain else 0.0) + STOP_MARGIN
    for w in workers:
        if w.proc is None:
            continue
        try:
            w.proc.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("router: worker %d (pid %d) did not stop; killing it", w.index, w.proc.pid)
            w.proc.kill()
            w.proc.wait()
