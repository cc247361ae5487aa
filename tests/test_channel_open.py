"""Channels open at once (issue 44): one after another, a layout of 28 one-stream channels and 4 of five streams cost
48 handshakes in a row, 5.8 s of a 0.5 GB transfer on a 40 ms path while the sender's loop waited. A real transfer to
a real receiver on loopback, its connector's handshakes observed."""

from __future__ import annotations

import threading

from agentkit import make_files, send, start_receiver, trees_identical, write_secret

from transfer_agent.sending.channels import OPEN_AT_ONCE
from transfer_agent.sending.connector import Connector


def test_a_layout_opens_its_channels_at_once_and_no_more_than_open_at_once(tmp_path, monkeypatch):
    secret = write_secret(tmp_path / "secret")
    src = make_files(tmp_path / "src", {f"f{i}": 64 * 1024 for i in range(40)})
    rx = start_receiver(tmp_path / "dst", secret)
    real = Connector.connect_link
    lock = threading.Lock()
    state = {"now": 0, "most": 0, "data": 0}
    two = threading.Barrier(2, timeout=20)  # the first two data handshakes meet here: both in progress at once

    def observed(self, **extra):
        data = extra.get("role") == "data"
        if data:
            with lock:
                state["now"] += 1
                state["data"] += 1
                state["most"] = max(state["most"], state["now"])
                first_two = state["data"] <= 2
            if first_two:
                try:
                    two.wait()
                except threading.BrokenBarrierError:  # one after another: the second never came while we waited
                    pass
        try:
            return real(self, **extra)
        finally:
            if data:
                with lock:
                    state["now"] -= 1

    monkeypatch.setattr(Connector, "connect_link", observed)
    try:
        result = send(src, rx.port, secret, cc=12, p=2, pp=4)
    finally:
        rx.stop()
    assert result.ok and result.verified_files == 40
    assert trees_identical(src, tmp_path / "dst" / "out")
    assert state["data"] == 24  # 12 channels of 2 streams
    assert not two.broken, "the first two data handshakes were never in progress at the same time"
    assert 2 <= state["most"] <= OPEN_AT_ONCE, state


def test_after_a_failed_open_no_further_channel_starts():
    """The channels open 8 at a time; once one fails (a receiver gone: here a port nobody listens on, refused at
    once) the rest do not start: 12 channels are at most 8 connection attempts, not 12 (with a receiver that answers
    with connect timeouts instead, 12 would be two rounds of the timeout before the session could retry)."""
    import socket

    import pytest

    from transfer_agent.errors import NetworkError
    from transfer_agent.sending.channels import ChannelPool

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: connections to it are refused
    connector = Connector("127.0.0.1", port, b"k" * 32, None, {}, timeout=5.0)
    attempts = []
    real = connector.connect_link

    def counted(**extra):
        attempts.append(extra.get("channel"))
        return real(**extra)

    connector.connect_link = counted
    pool = ChannelPool(None, connector, 1 << 20)
    with pytest.raises(NetworkError, match="cannot connect to receiver"):
        pool.apply({"small": (12, 1, 0)})
    assert 1 <= len(attempts) <= OPEN_AT_ONCE, attempts
    assert not pool.channels
