"""A session the receiver ended fails with the receiver's stated reason, not with the local consequences of it
(issue 29's full run: under load a tampered sealed block's session failed "data stream lost: Broken pipe", the
receiver's "failed authentication" arriving on the control connection a moment later and being dropped).

Issue 42 replaced the special case (a data stream that lost its connection waited 0.5 s for a reason) by the
session's rule: a reason the receiver states replaces whatever local failure was seen first, and a failed session
asks the receiver to finish (BYE) and hears it out before it settles why it failed (``ControlSession.failure``)."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

from agentkit import make_files, send, start_receiver
from transfer_agent.errors import ChecksumError, NetworkError, ProtocolError
from transfer_agent.receiving.receiver import Receiver
from transfer_agent.receiving.state import RecvFile
from transfer_agent.sending import control
from transfer_agent.sending.connector import Connector
from transfer_agent.sending.control import ControlSession
from transfer_agent.wire.auth import load_secret
from transfer_agent.wire.protocol import Frame

MiB = 1024 * 1024
REASON = "project quota exceeded: this receiver takes no more of b.bin"


class StatesThenDrops(Receiver):
    """A real receiver that ends the session at the first block of ``b.bin``: it states why on the control
    connection, then drops the data connection; it does so while the sender's control reader is busy (``busy``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.busy = threading.Event()

    def _claim(self, f: RecvFile, off: int, length: int) -> None:
        if f.relpath.endswith("b.bin"):
            assert self.busy.wait(30), "the sender never committed a.bin"
            f.session.reply(Frame.ERROR, {"kind": "refused", "message": REASON, "retryable": False})
            raise ProtocolError("test receiver: data connection dropped after stating its reason")
        super()._claim(f, off, length)


def test_the_receivers_reason_is_the_failure_although_the_dropped_data_stream_was_seen_long_before(
        tmp_path: Path, secret: Path) -> None:
    """The receiver states its reason, then drops the data connection, while the sender's control reader is held
    2 s by a slow event sink (an agent's, with Redis slow): the data stream sees the drop at once, the reason is
    read 2 s later. The session still fails with the receiver's reason (the old 0.5 s wait reported the broken
    connection, a retryable network error, instead of the receiver's terminal refusal)."""
    src = make_files(tmp_path / "src", {"a.bin": 1000, "b.bin": 32 * MiB})
    rx = start_receiver(tmp_path / "dst", secret, cls=StatesThenDrops, fsync=False)
    events: list[dict] = []

    def on_event(kind: str, data: dict) -> None:
        if kind == "file":
            events.append(data)
            if data["path"].endswith("a.bin") and data["status"] == "committed":  # on the control reader's thread
                rx.busy.set()
                threading.Event().wait(2.0)  # the slow sink: the reader handles nothing else meanwhile
    try:
        res = send(src, rx.port, secret, cc=1, p=1, pp=1, on_event=on_event, max_session_retries=0)
    finally:
        rx.stop()
    assert rx.busy.is_set() and res.verified_files == 1
    assert res.error is not None and REASON in res.error and "terminal: refused" in res.error, res.error
    assert "lost" not in res.error, res.error
    assert [f["reason"] for f in res.failures] == [res.error] and res.failures[0]["dest"].endswith("b.bin")


def _session(port: int, secret: Path) -> ControlSession:
    conn = Connector("127.0.0.1", port, load_secret(secret), None,
                     {"job": "peer-reason", "attempt": 1, "session": uuid.uuid4().hex})
    return ControlSession(conn, lambda f: None, hasher=None)


def test_a_stated_reason_replaces_a_local_failure_seen_first_and_a_later_local_one_does_not_replace_it(
        rx: Receiver, secret: Path) -> None:
    cs = _session(rx.port, secret)
    try:
        lost = NetworkError("data stream of channel 1 lost: [Errno 32] Broken pipe")
        reason = ChecksumError("data block [0, 1048576) of 'a.bin' failed authentication", retryable=True)
        cs.fail(lost)
        assert cs.error is lost and not cs.stated
        cs.fail(reason, stated=True)
        cs.fail(NetworkError("control connection lost: [Errno 104] Connection reset by peer"))
        assert cs.error is reason and cs.stated
        assert cs.failure(lost) is reason
    finally:
        cs.close(graceful=False)


def test_a_receiver_with_nothing_to_say_answers_the_bye_and_the_local_failure_stands(rx: Receiver,
                                                                                     secret: Path) -> None:
    cs = _session(rx.port, secret)
    try:
        lost = NetworkError("data stream of channel 1 lost: [Errno 104] Connection reset by peer")
        cs.fail(lost)
        assert cs.failure(lost) is lost
        assert cs.bye.is_set()  # heard out: the receiver answered the BYE, after everything it had sent before
    finally:
        cs.close(graceful=False)


class Mute(Receiver):
    """A real receiver that never answers a BYE (what a sender sees of a receiver behind a path cut for real)."""

    def _control_frame(self, session: Any, ftype: Frame, fid: int, body: dict[str, Any]) -> bool:
        return True if ftype == Frame.BYE else super()._control_frame(session, ftype, fid, body)


def test_a_silent_receiver_costs_the_silence_window_not_the_answer_bound(tmp_path: Path, secret: Path) -> None:
    rx = start_receiver(tmp_path / "dst", secret, cls=Mute, fsync=False)
    cs = _session(rx.port, secret)
    try:
        lost = NetworkError("data stream of channel 1 lost: [Errno 110] Connection timed out")
        cs.fail(lost)
        t0 = time.monotonic()
        assert cs.failure(lost) is lost and not cs.bye.is_set()
        took = time.monotonic() - t0
        assert control.PEER_SILENCE_S * 0.9 <= took < control.ANSWER_MAX_S / 2, took
    finally:
        cs.close(graceful=False)
        rx.stop()
