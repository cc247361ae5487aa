"""An idle data stream notices at once that the receiver closed its connection (issue 8, fault row "source
modified mid-send": the sender used to wait 60 s for its stall detector when a data connection died idle)."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace

import pytest

from transfer_agent.sending.channel import Channel
from transfer_agent.errors import NetworkError
from transfer_agent.wire.protocol import Frame
from transfer_agent.wire.secure import ControlLink


class _Control:
    def __init__(self) -> None:
        self.failed = threading.Event()
        self.error: Exception | None = None

    def fail(self, exc: Exception) -> None:
        self.error = exc
        self.failed.set()

    def flush_commits(self, age: float = 0.0) -> None:  # an idle stream sends the COMMITs it held (issue 29): none here
        pass


def _fails_when_closed(theirs: socket.socket, control: _Control, t: threading.Thread, who: str) -> None:
    """The receiver's end closes: ``who`` fails the session within 2 s with a lost data stream, and its thread ends."""
    t0 = time.monotonic()
    theirs.close()
    assert control.failed.wait(5), f"{who} did not notice the receiver closed its connection"
    assert time.monotonic() - t0 < 2.0
    assert isinstance(control.error, NetworkError) and "lost" in str(control.error), control.error
    t.join(5)
    assert not t.is_alive()


@pytest.mark.parametrize("how", ["close", "reset"])
def test_idle_stream_fails_the_session_when_the_receiver_closes(how: str) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) if how == "close" else (None, None)
    if how == "reset":
        srv = socket.create_server(("127.0.0.1", 0))
        ours = socket.create_connection(srv.getsockname())
        theirs, _ = srv.accept()
        srv.close()
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    control = _Control()
    pool = SimpleNamespace(control=control, stopping=threading.Event())
    ch = Channel(0, 1, pool)  # type: ignore[arg-type]
    t = threading.Thread(target=ch._stream_loop, args=(ours,), daemon=True)
    t.start()
    try:
        assert not control.failed.wait(0.6), "an idle stream with a live connection failed the session"
        _fails_when_closed(theirs, control, t, "the idle stream")
    finally:
        ours.close()
        theirs.close()


def test_idle_stream_of_a_closing_channel_fails_nothing() -> None:
    ours, theirs = socket.socketpair()
    control = _Control()
    pool = SimpleNamespace(control=control, stopping=threading.Event())
    ch = Channel(0, 1, pool)  # type: ignore[arg-type]
    t = threading.Thread(target=ch._stream_loop, args=(ours,), daemon=True)
    t.start()
    try:
        ch.closing = True
        theirs.close()
        t.join(5)
        assert not t.is_alive() and not control.failed.is_set()
    finally:
        ours.close()


class _KeptCommits(_Control):
    """A session whose kept COMMITs go on a real control connection (``ControlLink``) the receiver has closed."""

    def __init__(self, link: ControlLink) -> None:
        super().__init__()
        self.link = link

    def flush_commits(self, age: float = 0.0) -> None:
        self.link.send(Frame.COMMIT, {"hash": None}, 7)


@pytest.mark.parametrize("stopping", [False, True])
def test_a_stream_whose_kept_commits_cannot_go_fails_the_session_not_its_thread(stopping: bool) -> None:
    """CI, a fenced agent: its control connection closed while a data stream went idle and sent the COMMITs it kept;
    the NetworkError escaped the stream thread ("Exception in thread fstream-ch1-s0") instead of failing the session."""
    data, data_peer = socket.socketpair()
    ctl, ctl_peer = socket.socketpair()
    ctl_peer.close()  # the control connection is gone: sending on it is a broken pipe
    control = _KeptCommits(ControlLink(ctl, None, client=True))
    pool = SimpleNamespace(control=control, stopping=threading.Event())
    if stopping:
        pool.stopping.set()  # the session is ending: its control connection closing is no news
    uncaught: list[threading.ExceptHookArgs] = []
    hook, threading.excepthook = threading.excepthook, uncaught.append
    try:
        ch = Channel(1, 1, pool)  # type: ignore[arg-type]
        t = threading.Thread(target=ch._stream_loop, args=(data,), name="fstream-ch1-s0", daemon=True)
        t.start()
        t.join(5)
        assert not t.is_alive(), "the stream did not end"
        assert not uncaught, [str(a.exc_value) for a in uncaught]
        if stopping:
            assert not control.failed.is_set(), control.error
        else:
            assert control.failed.is_set()
            assert isinstance(control.error, NetworkError), control.error
            assert "connection lost while sending COMMIT" in str(control.error)
    finally:
        threading.excepthook = hook
        for s in (data, data_peer, ctl):
            s.close()


class _IdlePool(SimpleNamespace):
    """A pool with no files for the channel's driver (its cluster is None): the driver waits for work."""

    def wait_for_work(self, timeout: float) -> None:
        self.stopping.wait(min(timeout, 0.05))


@pytest.mark.parametrize("how", ["close", "reset"])
def test_an_idle_driver_with_its_own_stream_fails_the_session_when_the_receiver_closes(how: str) -> None:
    """A channel of one stream is sent on by its driver (issue 43: no stream thread, no hand-off per file); while it
    waits for work it watches that connection as an idle stream does."""
    srv = socket.create_server(("127.0.0.1", 0))
    ours = socket.create_connection(srv.getsockname())
    theirs, _ = srv.accept()
    srv.close()
    if how == "reset":
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    control = _Control()
    pool = _IdlePool(control=control, stopping=threading.Event())
    ch = Channel(0, 1, pool)  # type: ignore[arg-type]
    ch._direct = (ours, None)  # what ``start`` sets for p = 1 after connecting
    t = threading.Thread(target=ch._drive, daemon=True)
    t.start()
    try:
        assert ch.threads == [] and not control.failed.wait(0.6), "an idle driver with a live connection failed"
        _fails_when_closed(theirs, control, t, "the idle driver")
    finally:
        pool.stopping.set()
        ours.close()
        theirs.close()
