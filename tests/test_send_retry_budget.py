"""``fstream send`` against an unreachable receiver gives up within its budget (issue 30, defect 1).

``--connect-timeout`` bounds one connection attempt (TCP connect, TLS, handshake); ``--max-attempts`` and
``--retry-for`` bound the session retries of one outage before exit 75. Measured here before the fix: a
closed port took 14-17 s to exit 75 (five tries, 0.75-12 s apart), a receiver that never answers the SYN
(an overflowing listen queue, as a blackholed address) 94 s, one that never answers the handshake 92 s,
and that last message did not name the receiver. The receivers are real sockets on loopback.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentkit import make_files, send
from fstream_provider.model.retry import RetryPolicy
from fstream_provider.model.spec import TransferSpec
from transfer_agent.cli.exits import EXIT_RETRY, EXIT_USAGE
from transfer_agent.errors import NetworkError
from transfer_agent.sending.session_retry import SessionRetries

FSTREAM = [sys.executable, "-m", "transfer_agent.cli"]
OLD_CLOSED_PORT_S = 13.8  # the fastest of three runs before the fix (default budget, closed port)


def _send(*args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run([*FSTREAM, "send", *args], capture_output=True, text=True, timeout=timeout)
    return r, time.monotonic() - t0


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:  # a port nothing listens on: connections are refused at once
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A port whose listen queue is full: the kernel drops further SYNs, so a connect hangs (no answer at all)."""
    lsock = socket.socket()
    fillers: list[socket.socket] = []
    try:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(0)
        port = lsock.getsockname()[1]
        for _ in range(4):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", port))
            fillers.append(c)
        probe = socket.socket()
        probe.settimeout(0.3)
        try:
            probe.connect(("127.0.0.1", port))
            pytest.skip("this kernel answers connections beyond a full listen queue: no blackhole here")
        except TimeoutError:
            pass  # the hole swallows SYNs
        finally:
            probe.close()
        yield port
    finally:
        for c in fillers:
            c.close()
        lsock.close()


@pytest.fixture
def mute_receiver() -> Iterator[int]:
    """A port that accepts TCP connections and never says a word (no CHALLENGE to our HELLO)."""
    lsock = socket.socket()
    try:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(16)
        yield lsock.getsockname()[1]
    finally:
        lsock.close()


@pytest.mark.serial  # a wall-time budget that includes a Python start-up: a busy core stretches it
def test_closed_port_exits_75_quickly_naming_address_and_reason(tmp_path: Path, secret: Path,
                                                                 closed_port: int) -> None:
    src = make_files(tmp_path / "s", {"a": 100})
    r, took = _send(str(src), "--to", f"fstream://127.0.0.1:{closed_port}/o", "--secret-file", str(secret),
                    "--connect-timeout", "1s", "--max-attempts", "2", "--json")
    assert r.returncode == EXIT_RETRY, r.stderr
    assert took < OLD_CLOSED_PORT_S / 2, took  # two tries and one backoff (0.75-1.5 s), plus start-up
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("fstream send: failed (retryable")
    assert f"cannot connect to receiver 127.0.0.1:{closed_port}: Connection refused" in last, last
    assert "gave up after 2 tries" in last and "max attempts 2" in last, last
    assert r.stderr.count("reconnecting in") == 1, r.stderr  # exactly one retry within the budget
    assert json.loads(r.stdout)["retryable"] is True


@pytest.mark.serial  # 2-8 s of wall time, a Python start-up included: a busy core stretches it
def test_blackholed_receiver_times_out_at_the_connect_timeout(tmp_path: Path, secret: Path, blackhole: int) -> None:
    src = make_files(tmp_path / "s", {"a": 100})
    r, took = _send(str(src), "--to", f"fstream://127.0.0.1:{blackhole}/o", "--secret-file", str(secret),
                    "--connect-timeout", "1s", "--max-attempts", "2")
    assert r.returncode == EXIT_RETRY, r.stderr
    assert 2.0 <= took < 8.0, took  # two 1-s connect timeouts, one backoff; was 92+ s
    last = r.stderr.strip().splitlines()[-1]
    assert (f"cannot connect to receiver 127.0.0.1:{blackhole}: no answer within the connect timeout (1 s)"
            in last), last


@pytest.mark.serial  # 0.5-3 s of wall time: a busy core stretches it
def test_mute_receiver_is_bounded_by_the_connect_timeout_and_named(tmp_path: Path, secret: Path,
                                                                   mute_receiver: int) -> None:
    """TCP connects, the handshake gets no answer: the same timeout ends it, and the message names the peer."""
    src = make_files(tmp_path / "s", {"a": 100})
    t0 = time.monotonic()
    res = send(src, mute_receiver, secret, connect_timeout="0.5s", max_attempts=1)
    took = time.monotonic() - t0
    assert not res.ok and res.retryable
    assert 0.5 <= took < 3.0, took  # was 15 s per try
    assert f"receiver 127.0.0.1:{mute_receiver}: no answer to the handshake within the connect timeout (0.5 s)" \
        in res.error, res.error


@pytest.mark.serial  # 2-4 s of wall time for a 2 s retry budget: a busy core stretches it
def test_retry_for_bounds_one_outage_in_time(tmp_path: Path, secret: Path, closed_port: int) -> None:
    src = make_files(tmp_path / "s", {"a": 100})
    events: list[dict] = []
    t0 = time.monotonic()
    res = send(src, closed_port, secret, retry_for="2s", connect_timeout="1s",
               on_event=lambda kind, data: events.append(data) if kind == "log" else None)
    took = time.monotonic() - t0
    assert not res.ok and res.retryable
    assert 2.0 <= took < 4.0, took  # the last try starts as the 2 s end; no attempt limit of its own
    retries = [e for e in events if str(e.get("message", "")).startswith("session failed")]
    assert len(retries) >= 2 and all(e["delay"] > 0 for e in retries), retries
    assert "retry for 2 s" in res.error and "Connection refused" in res.error, res.error


def test_budget_is_per_outage_a_session_that_landed_files_starts_a_new_one() -> None:
    """Two outages of two failed tries each, with a session that landed a file between them: within
    ``max_attempts=3`` because the landed file ended the first outage; the third failure in a row gives up."""
    spec = TransferSpec.from_options(["/x"], "fstream://127.0.0.1:9/o", secret_file="/s", max_attempts=3)
    landed, outcomes, logged = [0], iter("ffLff"), []
    fast = RetryPolicy(retryable=lambda exc: isinstance(exc, NetworkError), base_s=0.01, cap_s=0.02)

    def session() -> str:
        step = next(outcomes)
        if step == "L":  # this session landed a file, then lost its connection
            landed[0] += 1
        raise NetworkError(f"lost ({step})")

    retries = SessionRetries(spec, log=_Log(logged), on_event=lambda kind, data: None, stop=threading.Event(),
                             policy=fast)
    with pytest.raises(NetworkError) as err:
        retries.call(session, landed=lambda: landed[0])
    tries = [int(line.split("(try ")[1].split(" ")[0]) for line in logged]
    assert tries == [1, 2, 1, 2], logged
    assert "gave up after 3 tries" in str(err.value) and "max attempts 3" in str(err.value)


def test_retry_for_counts_the_outage_from_the_failure_not_from_the_session_start() -> None:
    """Regression (issue 30 review): ``--retry-for`` measured the outage from the start of the session that failed, so
    a session up longer than the budget gave up at its first failure without a single retry."""
    spec = TransferSpec.from_options(["/x"], "fstream://127.0.0.1:9/o", secret_file="/s", retry_for="1s")
    fast = RetryPolicy(retryable=lambda exc: isinstance(exc, NetworkError), base_s=0.01, cap_s=0.02)
    calls: list[int] = []
    retries = SessionRetries(spec, log=_Log([]), on_event=lambda kind, data: None, stop=threading.Event(),
                             policy=fast)

    def session() -> str:
        calls.append(1)
        if len(calls) == 1:
            retries.connected()
            time.sleep(1.5)  # the session is up longer than the budget, then its link drops
            raise NetworkError("link dropped")
        return "landed"

    assert retries.call(session, landed=lambda: 0) == "landed" and len(calls) == 2


class _Log:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def warning(self, msg: str, *args: object) -> None:
        self.lines.append(msg % args)


def test_options_reach_the_spec_and_old_agents_still_read_jobs_without_them(tmp_path: Path) -> None:
    from transfer_agent.cli.main import build_parser
    from transfer_agent.cli.options import spec_from_args

    base = ["send", str(tmp_path), "--to", "fstream://h:9/o", "--secret-file", str(tmp_path / "s")]
    args = build_parser({}).parse_args([*base, "--connect-timeout", "3s", "--max-attempts", "4", "--retry-for", "5m"])
    spec = spec_from_args(args)
    assert (spec.connect_timeout_s, spec.max_attempts, spec.retry_for_s) == (3.0, 4, 300.0)
    assert TransferSpec.from_json(spec.to_json()) == spec  # the job on Redis carries them to the agent
    plain = spec_from_args(build_parser({}).parse_args(base))
    assert plain.connect_timeout_s == 10.0
    assert not {"connect_timeout_s", "max_attempts", "retry_for_s"} & set(json.loads(plain.to_json()))


@pytest.mark.parametrize("option, value, says", [
    ("--connect-timeout", "0s", "connect_timeout_s 0.0: must be a positive number of seconds"),
    ("--connect-timeout", "soon", "connect_timeout: duration 'soon'"),
    ("--max-attempts", "0", "max_attempts 0: must be between 1 and"),
    ("--retry-for", "0s", "retry_for_s 0.0: must be a positive number of seconds"),
])
def test_bad_budget_options_exit_2_naming_the_option(tmp_path: Path, secret: Path, option: str, value: str,
                                                     says: str) -> None:
    src = make_files(tmp_path / "s", {"a": 1})
    r, _ = _send(str(src), "--to", "fstream://127.0.0.1:9/o", "--secret-file", str(secret), option, value)
    assert r.returncode == EXIT_USAGE and says in r.stderr and r.stderr.startswith("fstream send: error:"), r.stderr


def test_a_watch_stream_with_idle_exit_gives_up_after_an_outage_that_long() -> None:
    """A watch stream retries while it is asked to run: with ``--idle-exit`` (end after so long with nothing new)
    an outage longer than that ends it, as retryable, after retries (the operator's watch tasks fail and Airflow
    retries them); without it, it retries until stopped (tests/test_watch_outage.py)."""
    spec = TransferSpec.from_options(["/x"], "fstream://127.0.0.1:9/o", secret_file="/s", watch=True, idle_exit="0.3s")
    fast = RetryPolicy(retryable=lambda exc: isinstance(exc, NetworkError), base_s=0.1, cap_s=0.1)
    logged: list[str] = []
    retries = SessionRetries(spec, log=_Log(logged), on_event=lambda kind, data: None, stop=threading.Event(),
                             policy=fast)
    t0 = time.monotonic()
    with pytest.raises(NetworkError) as err:
        retries.call(lambda: (_ for _ in ()).throw(NetworkError("refused")), landed=lambda: 0)
    assert len(logged) >= 2 and 0.3 <= time.monotonic() - t0 < 5
    assert "an outage of --idle-exit (0.3 s)" in str(err.value)


def test_idle_exit_is_the_watch_streams_seconds_budget_its_last_try_starts_as_that_outage_ends() -> None:
    """Issue 42's mend: ``--idle-exit`` was a special case of the retry loop that waited out whole backoffs past it (a
    15 s backoff after an outage of 0.3 s); now it is the seconds of the stream's ``Budget``, cut like ``--retry-for``."""
    spec = TransferSpec.from_options(["/x"], "fstream://127.0.0.1:9/o", secret_file="/s", watch=True, idle_exit="0.3s")
    slow = RetryPolicy(retryable=lambda exc: isinstance(exc, NetworkError), base_s=8.0, cap_s=8.0)  # 4-8 s waits
    events: list[dict] = []
    retries = SessionRetries(spec, log=_Log([]), on_event=lambda kind, data: events.append(data),
                             stop=threading.Event(), policy=slow)
    t0 = time.monotonic()
    with pytest.raises(NetworkError) as err:
        retries.call(lambda: (_ for _ in ()).throw(NetworkError("refused")), landed=lambda: 0)
    delays = [e["delay"] for e in events]
    assert delays and all(0 < d <= 0.3 for d in delays), delays  # never a backoff past the budget's end
    assert 0.3 <= time.monotonic() - t0 < 3.0  # the old loop waited at least 4 s
    assert "an outage of --idle-exit (0.3 s)" in str(err.value)
