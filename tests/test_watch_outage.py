"""A watch stream outlives a receiver outage longer than a send's retry budget (issue 30, defect 2).

A real receiver is stopped while ``send --watch`` runs and, after more failed reconnects than a plain
send's budget allows, started again on the same port: the stream must still be running, must have
logged each retry with its reason and its next (capped, jittered) delay, and must deliver the files
written during and after the outage.
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from pathlib import Path

from agentkit import start_receiver, trees_identical, wait_until, write_file
from fstream_provider.model.spec import TransferSpec
from transfer_agent.receiving.receiver import Receiver
from transfer_agent.sending.sender import Transfer
from transfer_agent.sending.session_retry import SESSION_RETRY
from transfer_agent.wire.auth import load_secret

RETRY_LINE = re.compile(r"session failed \((?P<reason>.+)\); reconnecting in (?P<delay>[\d.]+) s \(try (?P<try>\d+)")


class Lines(logging.Handler):
    """The sender's log lines, as they are written."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def retries(self) -> list[re.Match]:
        return [m for m in map(RETRY_LINE.search, list(self.lines)) if m]


def test_watch_stream_keeps_retrying_through_an_outage_and_delivers(tmp_path: Path, secret: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    write_file(src / "before.dat", b"b" * 50_000)
    rx: Receiver | None = start_receiver(dst, secret)
    port = rx.port
    lines = Lines()
    log = logging.getLogger(f"test.watch_outage.{uuid.uuid4().hex}")
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    log.propagate = False
    spec = TransferSpec.from_options([str(src)], f"fstream://127.0.0.1:{port}/out", secret_file=str(secret),
                                     tuner="fixed", watch=True, interval="0.2s", connect_timeout="2s")
    budget = 1  # a plain send with this transfer's settings gives up after 2 tries
    cancel = threading.Event()
    transfer = Transfer(spec, cancel=cancel, log=log, max_session_retries=budget)
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", transfer.run()), name="watch-sender")
    thread.start()
    try:
        wait_until(lambda: (dst / "out" / "before.dat").exists(), 20, "the first file landed")
        rx.stop()
        rx = None
        write_file(src / "during.dat", b"d" * 70_000)  # written while the receiver is down
        wait_until(lambda: len(lines.retries()) >= budget + 2 or not thread.is_alive(), 30,
                   "more failed tries than the budget allows, or the stream's end")
        assert thread.is_alive(), f"the stream gave up: {box['result'].error}"
        rx = Receiver(listen=("127.0.0.1", port), root=str(dst), secret=load_secret(secret)).start()
        wait_until(lambda: (dst / "out" / "during.dat").exists(), 30, "the file written during the outage landed")
        write_file(src / "after.dat", b"a" * 30_000)
        wait_until(lambda: (dst / "out" / "after.dat").exists(), 20, "the file written after the outage landed")
        assert thread.is_alive()
    finally:
        cancel.set()
        thread.join(timeout=30)
        if rx is not None:
            rx.stop()
    assert not thread.is_alive()
    result = box["result"]
    assert result.cancelled and result.verified_files == 3 and result.failed_files == 0, result.to_dict()
    assert trees_identical(src, dst / "out")

    retries = lines.retries()
    assert len(retries) > budget + 1
    for m in retries:  # each retry says why, and when the next try comes: capped, jittered backoff
        n, delay = int(m["try"]), float(m["delay"])
        full = min(SESSION_RETRY.cap_s, SESSION_RETRY.base_s * 2 ** (n - 1))
        assert 0.5 * full - 0.05 <= delay <= full + 0.05, m.group(0)
        assert "watch stream retries until it is stopped" in m.string, m.string
    assert [int(m["try"]) for m in retries] == list(range(1, len(retries) + 1))  # one outage, counted through
    assert retries[0]["reason"].strip()  # the session the stop ended, in its own words
    for m in retries[1:]:  # the reconnects while the receiver is down: the address and the reason
        assert f"cannot connect to receiver 127.0.0.1:{port}: Connection refused" in m["reason"], m.group(0)
