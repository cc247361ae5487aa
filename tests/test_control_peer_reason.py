"""A data connection the receiver closed fails the session with the receiver's reason, not with the broken pipe
(issue 29's full run: under load a tampered sealed block's session failed "data stream lost: Broken pipe", the
receiver's "failed authentication" arriving on the control connection a moment later and being dropped)."""

from __future__ import annotations

import threading
import time

from transfer_agent.errors import ChecksumError, NetworkError
from transfer_agent.sending import control
from transfer_agent.sending.control import ControlSession


def _session() -> ControlSession:
    cs = ControlSession.__new__(ControlSession)  # no socket: only how the session's failure is decided
    cs.error, cs.failed = None, threading.Event()
    return cs


def test_the_receivers_reason_arriving_just_after_the_broken_pipe_is_what_the_session_fails_with() -> None:
    cs = _session()
    reason = ChecksumError("data block [0, 1048576) of 'a.bin' failed authentication", retryable=True)
    # the control reader delivers the receiver's ERROR 50 ms after the data stream saw its connection break
    threading.Timer(0.05, cs.fail, args=(reason,)).start()
    cs.data_lost(NetworkError("data stream of channel 1 lost: [Errno 32] Broken pipe"))
    assert cs.error is reason


def test_a_data_connection_lost_without_a_reason_fails_the_session_after_the_wait() -> None:
    cs = _session()
    lost = NetworkError("data stream of channel 1 lost: [Errno 104] Connection reset by peer")
    t0 = time.monotonic()
    cs.data_lost(lost)
    assert cs.error is lost and cs.failed.is_set()
    assert time.monotonic() - t0 >= control.PEER_REASON_WAIT_S * 0.9
