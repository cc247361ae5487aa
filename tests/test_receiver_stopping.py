"""A receiver that is stopping never refuses a file for good (found by issue 29's full run): the OPEN it takes while
its root is being closed is answered retryable, and stopping ends the control connections too, so no OPEN is taken
after ``stop()``. (A ``--watch`` stream gave a file up for ever after a terminal "Bad file descriptor" refusal.)"""

from __future__ import annotations

import socket
from pathlib import Path

from agentkit import start_receiver, wait_until
from transfer_agent.receiving.state import Session
from transfer_agent.wire.protocol import Frame


class _Control:
    def send(self, *a) -> None:
        pass


def test_an_open_taken_while_the_receiver_stops_is_refused_retryably(tmp_path: Path, secret: Path) -> None:
    rx = start_receiver(tmp_path / "dst", secret)
    session = Session("s" * 32, "job", 1, _Control(), "127.0.0.1:1")
    rx.stop()  # its root descriptor is closed now
    rtype, body = rx._open_reply(session, 1, {"path": "a.dat", "size": 10, "mtime_ns": 0, "algo": "blake3-keyed"})
    assert rtype == Frame.ERROR
    assert body["retryable"] is True and "stopping" in body["message"], body


def test_stopping_ends_the_control_connection_of_an_open_session(tmp_path: Path, secret: Path) -> None:
    rx = start_receiver(tmp_path / "dst", secret)
    a, b = socket.socketpair()
    session = Session("t" * 32, "job", 1, _Control(), "127.0.0.1:1")
    session.sock = b
    with rx._lock:
        rx._sessions[session.id] = session
    rx.stop()
    a.settimeout(5)
    assert a.recv(1) == b""  # the receiver's side shut down: the peer reads end of stream
    a.close()
    b.close()
