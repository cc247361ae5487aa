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
