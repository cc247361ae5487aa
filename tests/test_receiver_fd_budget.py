"""A receiver holds up at its descriptor limit (issue 43): open parts stay within a budget from the limit, OPENs
beyond it wait (backpressure, not refusal), and running out of descriptors or memory is retryable, never terminal.

Found under load: on a 100,000-file ``--watch`` stream the receiver's descriptors climbed past 13,000 (files whose
COMMIT had left but whose commit had not run yet, each holding its part and its directory), and at the limit every
further file was refused as terminal; under ``ulimit -n 1024`` a data connection's ``os.pipe()`` failed with EMFILE
and 49,000 of 50,000 files failed for good. The real-process test here runs a receiver under a hard limit of 256
descriptors against a sender whose pipelines alone ask for more files than that.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agentkit import send, start_receiver, trees_identical
from transfer_agent.receiving import admission
from transfer_agent.receiving.admission import ADMIT, FULL, PARK, OpenGate

LOG = logging.getLogger("test.fd_budget")


def _gate(parts: int) -> OpenGate:
    """A gate whose budget is ``parts`` (a limit of the reserve plus two descriptors a part, nothing else held)."""
    limit = 64 + admission.FDS_PER_PART * parts
    return OpenGate(LOG, limit=lambda: limit, in_use=lambda: None)


def test_opens_beyond_the_budget_wait_and_are_admitted_in_order_as_parts_are_released() -> None:
    gate = _gate(3)
    a, b = object(), object()  # two sessions
    assert [gate.admit(a, i, {"path": f"a{i}"}) for i in range(3)] == [ADMIT] * 3
    # the budget is full: every later OPEN waits, whichever session sends it
    assert [gate.admit(s, i, {"path": f"{n}{i}"}) for s, n, i in ((b, "b", 0), (a, "a", 3), (b, "b", 1))] == [PARK] * 3
    admitted: list[list[tuple[Any, int, dict[str, Any]]]] = []
    got = threading.Event()

    def handle(batch: list[tuple[Any, int, dict[str, Any]]]) -> None:
        admitted.append(batch)
        got.set()

    stop = threading.Event()
    runner = threading.Thread(target=gate.run, args=(handle, stop), daemon=True)
    runner.start()
    try:
        gate.release(a, 0)
        assert got.wait(5)
        assert [(s, fid) for s, fid, _ in admitted[0]] == [(b, 0)]  # the first parked, alone: one slot was free
        got.clear()
        gate.forget(a, 3)  # aborted while it waited: never opened
        gate.release(a, 1)
        assert got.wait(5)
        assert [(s, fid, body["path"]) for s, fid, body in admitted[1]] == [(b, 1, "b1")]
        snap = gate.snapshot()
        assert snap["open"] == 3 and snap["parked"] == 0 and snap["parked_total"] == 3 and snap["peak_open"] == 3
        # while nothing waits, an OPEN within the budget is admitted at once again
        gate.release(b, 0)
        assert gate.admit(a, 9, {}) == ADMIT
    finally:
        stop.set()
        runner.join(5)


def test_a_deep_pipeline_does_not_keep_another_session_waiting_behind_it() -> None:
    """One session alone may use the whole budget; once another waits, freed slots go to the session holding the
    fewest, and the deep one's new OPENs wait their turn (each session's in the order it sent them)."""
    gate = _gate(4)
    a, b = object(), object()
    assert [gate.admit(a, i, {}) for i in range(4)] == [ADMIT] * 4  # nobody else: the whole budget
    assert [gate.admit(a, i, {}) for i in (4, 5)] == [PARK, PARK]
    assert [gate.admit(b, i, {}) for i in (0, 1)] == [PARK, PARK]
    assert gate.snapshot()["sessions_waiting"] == 2
    admitted: list[tuple[Any, int]] = []
    got = threading.Semaphore(0)

    def handle(batch: list[tuple[Any, int, dict[str, Any]]]) -> None:
        admitted.extend((s, fid) for s, fid, _ in batch)
        for _ in batch:
            got.release()

    stop = threading.Event()
    runner = threading.Thread(target=gate.run, args=(handle, stop), daemon=True)
    runner.start()
    try:
        for i in range(4):  # a's files commit one by one
            gate.release(a, i)
            assert got.acquire(timeout=5)
        # b (holding none, then one) gets the first two slots although a parked first; then a's, in its order
        assert admitted == [(b, 0), (b, 1), (a, 4), (a, 5)], admitted
        assert gate.snapshot()["parked"] == 0
        gate.release(b, 0)
        assert gate.admit(b, 2, {}) == ADMIT  # nobody waits now: a free slot goes to whoever asks
    finally:
        stop.set()
        runner.join(5)


def test_a_session_at_its_share_waits_while_another_session_waits() -> None:
    gate = _gate(4)
    a, b = object(), object()
    assert [gate.admit(a, i, {}) for i in range(3)] == [ADMIT] * 3
    assert gate.admit(b, 0, {}) == ADMIT
    assert gate.admit(b, 1, {}) == PARK  # the budget is full
    gate.release(a, 0)  # one slot free, b waits: a (3 held, share 2) does not take it, b does (via run)
    assert gate.admit(a, 3, {}) == PARK
    assert gate._next_parked()[:2] == (b, 1)


def test_a_release_of_a_file_that_never_held_a_slot_frees_nothing() -> None:
    gate = _gate(1)
    s = object()
    assert gate.admit(s, 1, {}) == ADMIT
    gate.release(s, 2)  # never admitted: not counted
    gate.release(s, 1)
    gate.release(s, 1)  # twice (a failed file, then its session's end): freed once
    assert gate.snapshot()["open"] == 0
    assert gate.admit(s, 3, {}) == ADMIT and gate.admit(s, 4, {}) == PARK


def test_parked_opens_are_bounded_per_session_and_overall(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "PARKED_PER_SESSION", 2)
    monkeypatch.setattr(admission, "PARKED_MAX", 3)
    gate = _gate(1)
    a, b = object(), object()
    assert gate.admit(a, 0, {}) == ADMIT
    assert [gate.admit(a, i, {}) for i in (1, 2, 3)] == [PARK, PARK, FULL]  # a session's cap
    assert [gate.admit(b, i, {}) for i in (1, 2)] == [PARK, FULL]  # the receiver's cap
    gate.forget(a)  # its session ended: its parked OPENs go, and so does its count
    assert gate.snapshot()["parked"] == 1 and gate.admit(a, 5, {}) == PARK


def test_the_budget_counts_what_else_the_process_holds() -> None:
    held = [100]
    gate = OpenGate(LOG, limit=lambda: 1024, in_use=lambda: held[0])
    assert gate.budget() == (1024 - 256 - 100) // 2  # reserve: max(64, 1024 / 4)
    s = object()
    for i in range(10):
        gate.admit(s, i, {})
    held[0] = 100 + 2 * 10  # the ten parts' descriptors are not "anything else"
    gate._measured = -1.0
    assert gate.budget() == (1024 - 256 - 100) // 2
    held[0] = 20 + 2 * 10  # connections closed: the budget keeps room for their peak of the last seconds
    gate._measured = -1.0
    assert gate.budget() == (1024 - 256 - 100) // 2
    gate._others[0] = (gate._others[0][0] - admission.OTHERS_HELD_S - 1, 100)  # ... and no longer
    gate._others[1] = (gate._others[1][0] - admission.OTHERS_HELD_S - 1, 100)
    gate._measured = -1.0
    assert gate.budget() == (1024 - 256 - 20) // 2


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOMEM])
def test_out_of_descriptors_or_memory_at_open_is_retryable(tmp_path: Path, secret: Path, code: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Before issue 43 an OSError at OPEN was a terminal refusal whatever it was: a --watch stream gave the file up."""
    rx = start_receiver(tmp_path / "dst", secret)
    try:
        def short(*_a: Any) -> dict[str, Any]:
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(rx, "_open", short)
        _rtype, body = rx._open_reply(None, 1, {"path": "x.bin"})
        assert body["retryable"] is True, body
        assert os.strerror(code) in body["message"] and "'x.bin'" in body["message"]
        monkeypatch.setattr(rx, "_open", lambda *_a: (_ for _ in ()).throw(OSError(errno.EACCES, "Permission denied")))
        assert rx._open_reply(None, 2, {"path": "y.bin"})[1]["retryable"] is False  # a real refusal stays terminal
    finally:
        rx.stop()


def test_a_data_connection_without_descriptors_for_its_pipe_receives_through_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from transfer_agent.receiving import data

    def no_fds() -> tuple[int, int]:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(data.os, "pipe", no_fds)
    assert data._pipe() is None  # was: the OSError ended the connection, and its files were refused as terminal


def _peak_fds(pid: int, stop: threading.Event, out: list[int]) -> None:
    while not stop.is_set():
        try:
            out.append(len(os.listdir(f"/proc/{pid}/fd")))
        except OSError:
            return
        time.sleep(0.005)


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, f"{name} not in the metrics"
    return float(m.group(1))


def test_a_receiver_at_256_descriptors_takes_every_file_of_a_wide_pipeline(tmp_path: Path, secret: Path) -> None:
    """3,000 files of 1 KiB, 4 channels × 2 streams, pipelining 200 files each (800 OPENs ahead, ~1,600
    descriptors asked for), into a receiver whose hard limit is 256: every file lands and verifies, the
    receiver's descriptors stay under its limit, and OPENs waited (counted by its metrics)."""
    import resource

    limit = 256

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    n = 3000
    src = tmp_path / "src"
    for i in range(n):
        d = src / f"d{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:05d}.dat").write_bytes(i.to_bytes(4, "big") * 256)
    (tmp_path / "dst").mkdir()
    err = open(tmp_path / "receiver.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "transfer_agent.cli", "receive", "--listen", "127.0.0.1:0",
                             "--root", str(tmp_path / "dst"), "--secret-file", str(secret),
                             "--metrics-listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=err, text=True, preexec_fn=low_limit)
    stop, samples = threading.Event(), []
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        port = int(line.rsplit(":", 1)[1])
        log = (tmp_path / "receiver.log").read_text
        deadline = time.monotonic() + 10
        while not (m := re.search(r"metrics on (http://\S+/metrics)", log())) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert m, log()
        sampler = threading.Thread(target=_peak_fds, args=(proc.pid, stop, samples), daemon=True)
        sampler.start()
        res = send(src, port, secret, cc=4, p=2, pp=200, max_session_retries=1)
        stop.set()
        sampler.join(5)
        assert res.failed_files == 0, res.failures[:3]
        assert res.verified_files == n
        assert trees_identical(src, tmp_path / "dst" / "out")
        assert samples and max(samples) < limit, f"peak {max(samples)} descriptors at a limit of {limit}"
        text = urllib.request.urlopen(m.group(1), timeout=10).read().decode()
        parked = _metric(text, "fstream_receiver_opens_parked_total")
        budget = _metric(text, "fstream_receiver_open_parts_budget")
        assert parked > 0, "no OPEN waited: the test did not reach the budget"
        assert 0 < budget < limit // 2
        assert _metric(text, "fstream_receiver_open_parts") == 0
        assert "open parts at the budget" in log()
        LOG.info("peak %d descriptors (limit %d), budget %d parts, %d OPENs parked", max(samples), limit, budget,
                 parked)
    finally:
        stop.set()
        proc.terminate()
        proc.wait(15)
        proc.stdout.close()
        err.close()


def test_the_benchmark_is_found_by_its_name_without_a_line_in_the_bench_cli() -> None:
    """``fstream bench fd-budget`` needs no entry in bench/cli.py (whose every change staled every result)."""
    from fstream_bench import cli
    from fstream_bench.datapath import fd_budget

    assert cli._by_name("fd-budget") is fd_budget
    assert cli._by_name("fd_budget") is None  # the module's own COMMAND names it, not its file name
    assert cli._by_name("no-such-bench") is None and cli._by_name("../datapath") is None
    out = subprocess.run([sys.executable, "-m", "transfer_agent.cli", "bench", "fd-budget", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--fd-limit" in out.stdout, out.stderr


def test_a_second_sender_is_not_kept_waiting_behind_a_deep_pipeline(tmp_path: Path, secret: Path) -> None:
    """Two real senders into one real receiver whose budget is 8 open files, its writes held at a gate: A's
    pipeline (2 channels, 40 files ahead each) fills the budget and parks the rest; B arrives with 3 files. Once
    the writes go on, the slots A's files free go to B first (it holds none), before A's OPENs that were waiting
    already: B is not kept behind A's queue. Both transfers land every file."""
    from agentkit import GatedReceiver, make_files

    src_a = make_files(tmp_path / "a", {f"f{i:03d}.dat": 64 * 1024 for i in range(120)})
    src_b = make_files(tmp_path / "b", {f"g{i}.dat": 4096 for i in range(3)}, seed=2)
    rx = start_receiver(tmp_path / "dst", secret, cls=GatedReceiver, hold_after=256 * 1024)
    gate = rx._gate
    gate._limit, gate._in_use, gate._measured = (lambda: 64 + admission.FDS_PER_PART * 8), (lambda: None), -1.0
    who: dict[Any, str] = {}
    order: list[tuple[str, int]] = []  # (sender, file id) in the order slots were taken
    waiting_for_b: list[tuple[str, int]] = []  # A's OPENs parked when B's first OPEN came
    admit, hold = gate.admit, gate._hold

    def admit_recorded(session: Any, fid: int, body: dict[str, Any]) -> str:
        who.setdefault(session, body["path"].split("/")[0])
        if who[session] == "b" and not waiting_for_b:
            with gate._cond:
                waiting_for_b.extend(("a", f) for s, q in gate._parked.items() for f in q)
        return admit(session, fid, body)

    def hold_recorded(key: tuple[Any, int]) -> None:
        order.append((who.get(key[0], "?"), key[1]))
        hold(key)

    gate.admit, gate._hold = admit_recorded, hold_recorded
    results: dict[str, Any] = {}
    ta = threading.Thread(target=lambda: results.setdefault("a", send(src_a, rx.port, secret, dest="a", cc=2, p=1,
                                                                      pp=40)), daemon=True)
    tb = threading.Thread(target=lambda: results.setdefault("b", send(src_b, rx.port, secret, dest="b", cc=1, p=1,
                                                                      pp=4)), daemon=True)
    try:
        ta.start()
        deadline = time.monotonic() + 30
        while gate.snapshot()["parked"] < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gate.snapshot()["parked"] >= 20 and rx.reached.wait(30), gate.snapshot()
        tb.start()
        deadline = time.monotonic() + 60  # B's own wait: a loaded host may have spent A's 30 s already
        while gate.snapshot()["sessions_waiting"] < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gate.snapshot()["sessions_waiting"] == 2, (gate.snapshot(), order)
        rx.gate.set()  # the writes go on: A's files commit and free their slots
        ta.join(60)
        tb.join(60)
        assert not ta.is_alive() and not tb.is_alive(), gate.snapshot()
    finally:
        rx.gate.set()
        rx.stop()
    assert results["a"].ok and results["a"].verified_files == 120, (results["a"].error, gate.snapshot())
    assert results["b"].ok and results["b"].verified_files == 3, (results["b"].error, gate.snapshot())
    assert trees_identical(src_a, tmp_path / "dst" / "a") and trees_identical(src_b, tmp_path / "dst" / "b")
    first_b = next(i for i, (s, _) in enumerate(order) if s == "b")
    overtaken = [k for k in waiting_for_b if k in order[first_b:]]
    assert waiting_for_b and overtaken, (waiting_for_b, order)  # B took a slot before A's OPENs that waited first
