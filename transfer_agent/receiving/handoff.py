"""Connections handed from a router to a receiver process (issue 43, "one port, several receiver processes").

``send_conn``/``recv_conn`` move one accepted TCP connection, with its peer address, over a ``SOCK_SEQPACKET``
unix socket pair (``SCM_RIGHTS``): the router (``receiving.router``) accepts and reads nothing but a peek of the
HELLO; the worker does everything else as if it had accepted the connection itself.

``HandoffReceiver`` is such a worker: a ``Receiver`` whose connections come from its router instead of a listening
socket. Everything after accept is the receiver's own (pre-auth caps, handshake deadline, authentication, the
session), so a worker trusts nothing the router read: the router's peek only chose the process. Its claims hold a
byte of a lock file the processes of one root share (``claims.ProcessClaims``): two jobs that name the same file
in two processes are "busy" to each other, as in one process.
"""

from __future__ import annotations

import array
import json
import logging
import socket
from collections.abc import Callable
from typing import Any

from transfer_agent.receiving.claims import ProcessClaims, default_claims_lock
from transfer_agent.receiving.receiver import Receiver

MSG_MAX = 512  # the address message: {"addr": [host, port]}


def send_conn(chan: socket.socket, conn: socket.socket, addr: tuple) -> None:
    """Hand ``conn`` (accepted from ``addr``) over ``chan``; the caller closes its own copy afterwards."""
    body = json.dumps({"addr": [str(addr[0]), int(addr[1])]}).encode()
    chan.sendmsg([body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [conn.fileno()]))])


def recv_conn(chan: socket.socket) -> tuple[socket.socket, tuple[str, int]] | None:
    """The next connection handed over ``chan`` with its peer address; None when the router closed ``chan``.
    A message whose descriptor did not arrive (this process is out of descriptors: ``MSG_CTRUNC``) is skipped:
    that one connection is lost, its sender retries."""
    while True:
        data, fds, flags, _addr = socket.recv_fds(chan, MSG_MAX, 1)
        if not data and not fds:
            return None
        if not fds:
            continue  # MSG_CTRUNC: the kernel closed the descriptor it could not install
        for extra in fds[1:]:
            socket.close(extra)
        conn = socket.socket(fileno=fds[0])
        try:
            host, port = json.loads(data)["addr"]
            return conn, (str(host), int(port))
        except (ValueError, KeyError, TypeError):
            conn.close()  # not from our router: never happens; nothing to serve


class HandoffReceiver(Receiver):
    """A receiver process behind a router: its connections arrive on ``chan`` (see the module).

    :param chan: this worker's end of the unix socket pair its router hands connections over.
    :param claims_lock: the lock file the processes of this root share for their claims.
    :param port: the router's port (what this worker's log lines and ``port`` name).
    :param worker: this worker's index (in its log lines).
    :param on_orphaned: called when the router closed the channel (it stopped or died): the process drains.
    """

    def __init__(self, *, chan: socket.socket, claims_lock: str, port: int, worker: int,
                 on_orphaned: Callable[[], object] | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self._chan, self._router_port, self.worker = chan, port, worker
        self._busy_parts = ProcessClaims(claims_lock)
        self._on_orphaned = on_orphaned

    def _listen(self) -> socket.socket:
        return self._chan

    @property
    def port(self) -> int:
        return self._router_port

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                got = recv_conn(self._chan)
            except OSError as exc:
                if self._stop.is_set():
                    return
                self.log.warning("worker %d: taking a connection from the router failed: %s", self.worker, exc)
                self._stop.wait(0.05)
                continue
            if got is None:  # the router is gone: no connection can reach this process any more
                if not self._stop.is_set():
                    self.log.warning("worker %d: the router closed its channel; draining", self.worker)
                    self.draining.set()
                    if self._on_orphaned is not None:
                        self._on_orphaned()
                return
            self._take(*got)

    def stop(self) -> None:
        super().stop()
        self._busy_parts.close()  # type: ignore[attr-defined]


def worker_receiver(args: Any, kw: dict[str, Any], on_orphaned: Callable[[], object]) -> HandoffReceiver:
    """The receiver of a ``receive --workers N`` worker (``--handoff-fd``, ``--worker-index``, ``--router-port``,
    set by its router) from the command's receiver arguments ``kw``: worker 0 sweeps orphaned parts, the others
    do not; quotas are counted in memory (one process per quota group: ``receiving.router``)."""
    index = int(args.worker_index or 0)
    kw = {**kw, "quota_state": None, "log": logging.getLogger(f"fstream.receiver.worker{index}")}
    if index:
        kw["part_max_age"] = None
    return HandoffReceiver(chan=socket.socket(fileno=args.handoff_fd), claims_lock=str(default_claims_lock(args.root)),
                           port=int(args.router_port or 0), worker=index, on_orphaned=on_orphaned, **kw)
