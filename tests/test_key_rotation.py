"""Issue 30, "Key rotation without downtime": secret files with generations, the generation in the handshake,
receivers that re-read their files, ``fstream keys rotate`` during continuous transfers, and mixed protocol versions
(a protocol-2 sender against a protocol-3 receiver; protocol 1 refused naming both versions)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentkit import make_files, send, start_receiver, trees_identical, wait_until, write_secret
from fstream_provider.model.keyfile import KeyFileError
from fstream_provider.model.secret_ring import (Generation, RingError, SecretRing, dump_ring, parse_ring, read_ring,
                                                write_ring)
from transfer_agent.cli.keys import check_receiver
from transfer_agent.cli.main import main
from transfer_agent.errors import FStreamError, ProtocolError
from transfer_agent.receiving.receiver import Receiver
from transfer_agent.wire import auth
from transfer_agent.wire.protocol import HEADER, HEADER_SIZE, MAGIC, Frame, pack_control, recv_exact

KiB = 1024
HOUR = 3600.0
S = {n: (c * 48).encode() for n, c in (("0", "0"), ("g1", "a"), ("g2", "b"), ("g3", "c"), ("g7", "d"))}


def ring_file(path: Path, *gens: tuple[str, str, float | None]) -> Path:
    """A ring file of (id, state, accept_until) generations, each id with its fixed secret ``S[id]``."""
    now = time.time()
    write_ring(path, SecretRing(tuple(Generation(i, S[i], now - 60, st, until) for i, st, until in gens)))
    return path


def receiver_log(caplog: pytest.LogCaptureFixture, *words: str) -> list[str]:
    """The receiver's log lines that contain every one of ``words``."""
    return [r.getMessage() for r in caplog.records
            if r.name == "fstream.receiver" and all(w in r.getMessage() for w in words)]


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="fstream.receiver")
    return caplog


@pytest.fixture
def receivers() -> Iterator[list[Receiver]]:
    """Receivers a test starts (``start_receiver``), each stopped after it, even on failure."""
    started: list[Receiver] = []
    try:
        yield started
    finally:
        for r in started:
            r.stop()


# -- the file format -----------------------------------------------------------------------------------------
def test_one_line_file_is_generation_0_and_a_ring_round_trips(tmp_path: Path) -> None:
    legacy = parse_ring(b"  " + S["0"] + b"\n", "secret file x", mtime=1000.0)
    assert legacy.legacy and [(g.gen_id, g.state, g.secret, g.created) for g in legacy.generations] == [
        ("0", "current", S["0"], 1000.0)]
    now = 1_800_000_000.0
    ring = legacy.with_next(now, S["g1"]).promoted(now + 10, 3600).with_next(now + 20, S["g2"])
    assert [(g.gen_id, g.state) for g in ring.generations] == [("g2", "next"), ("g1", "current"), ("0", "previous")]
    assert ring.get("0").accept_until == now + 10 + 3600  # type: ignore[union-attr]
    text = dump_ring(ring)
    others = [line for line in text.splitlines() if not line.startswith("secret = ")]
    assert not any(s.decode() in line for line in others for s in S.values())  # secrets only on their own lines
    back = parse_ring(text.encode(), "secret file y")
    assert back.generations == ring.generations and not back.legacy
    p = tmp_path / "ring"
    write_ring(p, ring)
    assert os.stat(p).st_mode & 0o777 == 0o600 and read_ring(p).generations == ring.generations
    os.chmod(p, 0o640)
    with pytest.raises(KeyFileError, match="readable or writable by others"):
        read_ring(p)
    retired, gone = ring.retired(now + 10 + 3601)
    assert [g.gen_id for g in gone] == ["0"] and [g.gen_id for g in retired.generations] == ["g2", "g1"]


@pytest.mark.parametrize("body, says", [
    ('[[generation]]\nid = "g1"\nstate = "current"\ncreated = 2026-01-01T00:00:00Z\nsecret = "%s"\n'
     '[[generation]]\nid = "g2"\nstate = "current"\ncreated = 2026-01-01T00:00:00Z\nsecret = "%s"\n',
     "exactly one current generation, found 2"),
    ('[[generation]]\nid = "g1"\nstate = "previous"\ncreated = 2026-01-01T00:00:00Z\nsecret = "%s"\n',
     "generation 'g1': a previous generation needs accept_until"),
    ('[[generation]]\nid = "g1"\nstate = "current"\ncreated = 2026-01-01T00:00:00Z\nsecret = "%s"\ncolour = 1\n',
     r"generation\[0\].colour: unknown field"),
    ('[[generation]]\nid = "g 1"\nstate = "current"\ncreated = 2026-01-01T00:00:00Z\nsecret = "%s"\n',
     r"generation\[0\].id = 'g 1': not a generation id"),
    ('[[generation]]\nid = "g1"\nstate = "current"\ncreated = 2026-01-01T00:00:00\nsecret = "%s"\n',
     r"generation\[0\].created = .*: expected a date-time with its offset"),
    ('[[generation]]\nid = "g1"\nstate = "current"\ncreated = 2026-01-01T00:00:00Z\nsecret = "short"\n',
     "generation 'g1': secret too short"),
    ('[[generation]]\nid = "g1"\nstate = "retired"\ncreated = 2026-01-01T00:00:00Z\nsecret = "%s"\n',
     "state 'retired' is not one of"),
])
def test_bad_ring_is_refused_naming_file_and_reason(body: str, says: str) -> None:
    text = body.replace("%s", "x" * 40)
    with pytest.raises(RingError, match=f"secret file /etc/k: .*{says}"):
        parse_ring(text.encode(), "secret file /etc/k")


# -- the handshake: which generations a receiver accepts -----------------------------------------------------
@pytest.mark.parametrize("sender_gen, receiver_gens", [
    ("g1", [("g1", "current", None)]),                                            # current
    ("g2", [("g1", "current", None), ("g2", "next", None)]),                      # next
    ("g1", [("g2", "current", None), ("g1", "previous", time.time() + HOUR)]),    # previous, within its window
])
def test_accepted_generation_lands_a_transfer(tmp_path: Path, logs, receivers, sender_gen: str,
                                              receiver_gens: list) -> None:
    rfile = ring_file(tmp_path / "receiver-secret", *receiver_gens)
    sfile = ring_file(tmp_path / "sender-secret", (sender_gen, "current", None))
    rx = start_receiver(tmp_path / "dst", rfile)
    receivers.append(rx)
    src = make_files(tmp_path / "src", {f"f{i}.dat": 3 * KiB + i for i in range(5)})
    res = send(src, rx.port, sfile, job_id="landing")
    assert res.ok and res.verified_files == 5, res.error
    assert trees_identical(src, tmp_path / "dst" / "out")
    assert rx.generations == {("default", sender_gen): 1}
    assert receiver_log(logs, f"generation {sender_gen}", "job landing")


@pytest.mark.parametrize("sender_gen, receiver_gens, why", [
    ("g1", [("g2", "current", None), ("g1", "previous", time.time() - 5)], "is previous and its window ended"),
    ("g7", [("g1", "current", None), ("g2", "next", None)], "is unknown"),
])
def test_refused_generation_is_a_terminal_auth_error_naming_it(tmp_path: Path, logs, receivers, sender_gen: str,
                                                               receiver_gens: list, why: str) -> None:
    rfile = ring_file(tmp_path / "receiver-secret", *receiver_gens)
    sfile = ring_file(tmp_path / "sender-secret", (sender_gen, "current", None))
    rx = start_receiver(tmp_path / "dst", rfile)
    receivers.append(rx)
    res = send(make_files(tmp_path / "src", {"a.dat": 1000}), rx.port, sfile, max_session_retries=3)
    assert not res.ok and "(terminal: auth)" in (res.error or ""), res.error
    assert f"generation {sender_gen!r}" in (res.error or "")
    others = {g for g, _s, _u in receiver_gens} - {sender_gen}
    assert not any(repr(g) in (res.error or "") for g in others)  # never lists the others
    line = wait_until(lambda: receiver_log(logs, "authentication failed for key 'default'",
                                           f"generation {sender_gen!r} {why}"), what="the receiver's refusal")
    assert not any(repr(g) in line[0] for g in others)
    assert not any((tmp_path / "dst").rglob("*.dat")) and rx.stats["sessions"] == 0


def test_receiver_rereads_its_file_and_keeps_the_last_good_keys(tmp_path: Path, logs, receivers) -> None:
    shared = write_secret(tmp_path / "secret")
    rx = start_receiver(tmp_path / "dst", shared)
    receivers.append(rx)
    new = Generation("g1", S["g1"], time.time(), "next")
    with pytest.raises(FStreamError, match="did not accept generation 'g1'"):  # not in its file yet
        check_receiver(("127.0.0.1", rx.port), new, "default", timeout=0.3)
    write_ring(shared, read_ring(shared).with_next(time.time(), S["g1"]))
    # one try, at once: a generation it does not accept makes the receiver look at its file again (no restart, and
    # no wait for its once-a-second look), unless it looked out of turn in the last 250 ms (the checks above did)
    wait_until(rx._keys.forced_look_ready, what="a look out of turn allowed again")
    assert check_receiver(("127.0.0.1", rx.port), new, "default", timeout=0) < 5
    assert receiver_log(logs, "keys re-read", "key default: g1 next, 0 current")
    wait_until(lambda: receiver_log(logs, "key check from", "generation g1 accepted"), what="the check's log line")
    shared.write_text("[[generation]]\nid = 'g9'\n")  # broken: no state, no secret
    # connections make the receiver look (at most once a second); the last good keys still accept g1 meanwhile
    wait_until(lambda: check_receiver(("127.0.0.1", rx.port), new, "default", timeout=5) is not None and
               receiver_log(logs, "key 'default': keeping its last good secret", str(shared), "state is missing"),
               what="the error naming the file and the reason")
    src = make_files(tmp_path / "src", {"b.dat": 2000})
    good = ring_file(tmp_path / "sender-secret", ("g1", "current", None))
    assert send(src, rx.port, good).ok  # the last good keys still accept g1
    assert list(rx.keyring) == ["default"] and rx.generations[("default", "g1")] == 1


def test_sender_uses_the_current_generation_as_each_session_opens(tmp_path: Path, receivers) -> None:
    """A secret loaded once (as a transfer does at its start) is read again by each session's ``Connector``; the
    HELLO names the generation, the secret never travels."""
    from transfer_agent.sending.connector import Connector

    shared = ring_file(tmp_path / "secret", ("g1", "current", None))
    rx = start_receiver(tmp_path / "dst", shared)
    receivers.append(rx)
    loaded = auth.load_secret(shared)
    hello = {"session": uuid.uuid4().hex, "job": "j", "attempt": 1}
    first = Connector("127.0.0.1", rx.port, loaded, None, hello).connect_link(role="check")
    first.link.sock.close()
    write_ring(shared, read_ring(shared).with_next(time.time(), S["g2"]).promoted(time.time(), HOUR))
    second = Connector("127.0.0.1", rx.port, loaded, None, hello)  # the next session: same loaded secret object
    hs = second.connect_link(role="check")
    hs.link.sock.close()
    assert (first.generation, hs.generation, hs.peer["generation"]) == ("g1", "g2", "g2")
    sent: list[bytes] = []

    class Spy:
        def __init__(self, s: socket.socket) -> None:
            self.s = s

        def sendall(self, b: bytes, *a: int) -> None:
            sent.append(bytes(b))
            self.s.sendall(b, *a)

        def __getattr__(self, name: str):
            return getattr(self.s, name)

    with socket.create_connection(("127.0.0.1", rx.port)) as s:
        auth.client_handshake(Spy(s), second.secret, {**hello, "role": "check"})
    assert b'"kgen":"g2"' in sent[0] and not any(S[g] in b for b in sent for g in ("g1", "g2"))
    os.chmod(shared, 0o644)  # unusable now: a new session keeps the generation it had, and says why
    with caplog_at(logging.WARNING, "fstream.auth") as records:
        third = Connector("127.0.0.1", rx.port, second.secret, None, hello)
    assert third.secret.generation == "g2"  # type: ignore[union-attr]
    assert any(str(shared) in m and "mode 644" in m and "keeping generation 'g2'" in m for m in records)


@contextlib.contextmanager
def caplog_at(level: int, name: str) -> Iterator[list[str]]:
    """The messages logged to ``name`` at ``level`` or above inside the block."""
    got: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record.getMessage())

    logger, handler = logging.getLogger(name), Keep(level)
    logger.addHandler(handler)
    try:
        yield got
    finally:
        logger.removeHandler(handler)


# -- a rotation during continuous transfers -----------------------------------------------------------------
def test_rotation_during_continuous_transfers_loses_nothing(tmp_path: Path, logs, receivers) -> None:
    """A sender loops ``send`` of small file sets to a real receiver sharing one secret file while ``fstream keys
    rotate`` runs on it: every transfer lands, 0 failed files, and sessions opened after the rotation use g1."""
    shared = write_secret(tmp_path / "secret")  # a one-line file: generation "0"
    rx = start_receiver(tmp_path / "dst", shared)
    receivers.append(rx)
    stop, results, errors = threading.Event(), [], []

    def loop() -> None:
        n = 0
        try:
            while not stop.is_set():
                src = make_files(tmp_path / f"src{n}", {f"d/f{i}.dat": 2 * KiB + 37 * i for i in range(6)}, seed=n)
                started = time.time()
                res = send(src, rx.port, shared, dest=f"out{n}", job_id=f"rot-{n}", cc=2, p=1, pp=4)
                results.append((n, started, res, src))
                n += 1
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    t = threading.Thread(target=loop, name="rotation-sender")
    t.start()
    try:
        wait_until(lambda: len(results) >= 3, what="transfers before the rotation")
        assert main(["keys", "rotate", str(shared), "--window", "1h",
                     "--check-receiver", f"fstream://127.0.0.1:{rx.port}"]) == 0
        rotated = time.time()
        before = len(results)
        wait_until(lambda: len(results) >= before + 3, what="transfers after the rotation")
    finally:
        stop.set()
        t.join(60)
    assert not errors and not t.is_alive(), errors
    assert all(r.ok and r.failed_files == 0 for _n, _t, r, _s in results), [r.error for *_x, r, _s in results]
    assert all(trees_identical(s, tmp_path / "dst" / f"out{n}") for n, _t, _r, s in results)
    assert [g.gen_id for g in read_ring(shared).generations] == ["g1", "0"]
    gen_of = {}  # job -> the generation its session used, from the receiver's log
    for line in receiver_log(logs, "(key default generation"):
        gen_of[line.split("job ")[1].split()[0]] = line.split("generation ")[1].split(",")[0]
    assert {gen_of[f"rot-{n}"] for n, t0, _r, _s in results if t0 > rotated} == {"g1"}
    assert gen_of["rot-0"] == "0" and rx.generations[("default", "0")] >= 3 and rx.generations[("default", "g1")] >= 3


# -- protocol versions ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("encrypt", [False, True])
def test_protocol_2_sender_lands_on_a_protocol_3_receiver(tmp_path: Path, logs, receivers, monkeypatch,
                                                          encrypt: bool) -> None:
    shared = ring_file(tmp_path / "secret", ("g2", "current", None), ("g1", "previous", time.time() + HOUR))
    rx = start_receiver(tmp_path / "dst", shared)
    receivers.append(rx)
    monkeypatch.setattr(auth, "CLIENT_VERSION", 2)  # the documented way to run a sender as protocol 2
    src = make_files(tmp_path / "src", {f"f{i}.dat": 40 * KiB + i for i in range(8)} | {"big.bin": 3 << 20})
    res = send(src, rx.port, shared, job_id="old-sender", encrypt=encrypt, cc=2, p=2, block_size=256 * KiB)
    assert res.ok and res.verified_files == 9, res.error
    assert trees_identical(src, tmp_path / "dst" / "out")
    assert receiver_log(logs, "generation g2, protocol 2", "job old-sender")  # no kgen: the current generation


def _raw_hello(version: int) -> bytes:
    body = pack_control(Frame.HELLO, {"role": "control", "version": version, "nonce": os.urandom(32).hex(),
                                      "auth": "hmac", "session": "s", "job": "j"}, version=version)
    return body


@pytest.mark.parametrize("old", [1, 4])
def test_peer_of_another_version_is_refused_naming_both(tmp_path: Path, secret: Path, rx: Receiver, old: int) -> None:
    with socket.create_connection(("127.0.0.1", rx.port), timeout=10) as s:
        s.sendall(_raw_hello(old))
        head = recv_exact(s, HEADER_SIZE)
        magic, version, ftype, _fid, _off, length = HEADER.unpack(head)
        body = json.loads(recv_exact(s, length))
    assert (magic, version, ftype) == (MAGIC, old, Frame.ERROR)  # in the peer's version, so it can read it
    assert body["kind"] == "protocol"
    assert body["message"] == f"sender speaks protocol {old}; this receiver speaks 3 and 2"
    assert rx.stats["sessions"] == 0


def test_sender_refuses_a_receiver_of_protocol_1() -> None:
    srv, cli = socket.socketpair()

    def old_receiver() -> None:
        with srv:
            recv_exact(srv, HEADER_SIZE)
            srv.sendall(pack_control(Frame.CHALLENGE, {"version": 1, "nonce": os.urandom(32).hex(), "auth": "hmac"},
                                     version=1))
            srv.recv(1)

    t = threading.Thread(target=old_receiver)
    t.start()
    with cli, pytest.raises(ProtocolError, match=r"speaks protocol 1; this sender speaks 3"):
        auth.client_handshake(cli, S["g1"], {"role": "control", "session": uuid.uuid4().hex, "job": "j"}, peer="old")
    t.join(10)


# -- the command ---------------------------------------------------------------------------------------------
def test_keys_command_stages_show_and_refusals(tmp_path: Path, secret: Path, rx: Receiver, capsys) -> None:
    shared = write_secret(tmp_path / "shared")
    secret_text = shared.read_text().strip()
    assert main(["keys", "rotate", str(shared), "--stage", "next"]) == 0
    assert "1/1 next: generation g1 is next" in capsys.readouterr().out
    assert main(["keys", "rotate", str(shared), "--stage", "next"]) == 2  # one next at a time
    assert "generation 'g1' is already next" in capsys.readouterr().err
    # a receiver that does not hold g1 (its own file): the check fails, nothing is promoted
    assert main(["keys", "rotate", str(shared), "--stage", "promote", "--check-receiver",
                 f"fstream://127.0.0.1:{rx.port}", "--check-timeout", "0.5s"]) == 2
    assert "did not accept generation 'g1'" in capsys.readouterr().err
    assert read_ring(shared).current.gen_id == "0"
    assert main(["keys", "rotate", str(shared), "--stage", "promote", "--window", "1s"]) == 0
    assert "generation g1 is current" in capsys.readouterr().out
    assert main(["keys", "show", str(shared)]) == 0
    shown = capsys.readouterr().out
    assert "g1           current" in shown and "0            previous" in shown
    assert secret_text not in shown and read_ring(shared).current.secret.decode() not in shown  # never a secret
    wait_until(lambda: time.time() > (read_ring(shared).get("0").accept_until or 0) + 1, what="the window to pass")
    assert main(["keys", "rotate", str(shared), "--stage", "retire"]) == 0
    assert "retire: dropped 0" in capsys.readouterr().out
    assert [g.gen_id for g in read_ring(shared).generations] == ["g1"]
    os.chmod(shared, 0o644)
    assert main(["keys", "show", str(shared)]) == 2
    assert "readable or writable by others (mode 644)" in capsys.readouterr().err
    assert main(["keys", "rotate", str(shared), "--window", "0s"]) == 2
    assert "--window '0s': must be longer than 0" in capsys.readouterr().err


# -- review fixes (issue 30): sessions that outlive a generation, one keyring per handshake, fail-closed re-reads --
def test_a_session_outliving_its_generation_opens_later_data_connections_with_the_new_one(tmp_path: Path, logs,
                                                                                          receivers, monkeypatch) -> None:
    """A session opened on g1; g2 is promoted and g1's window passes while it runs; the data connections its
    retuning opens then authenticate with g2 (the receiver asks only that they use the session's key), so the
    transfer lands in that one session instead of failing on a refused g1."""
    from agentkit import PacedReceiver
    from fstream_provider.tuning.base import ClusterLayout, FileInfo, Observation, Suggestion
    from transfer_agent.sending.connector import Connector

    shared = ring_file(tmp_path / "secret", ("g1", "current", None))
    rx = start_receiver(tmp_path / "dst", shared, cls=PacedReceiver, rate=2 << 20)  # slow enough to retune mid-way
    receivers.append(rx)
    opened: list[tuple[str, str | None]] = []  # (role, generation) of every connection the sender opened
    connect_link = Connector.connect_link

    def spy(self: Connector, **extra):
        hs = connect_link(self, **extra)
        opened.append((extra.get("role"), hs.generation))
        return hs

    monkeypatch.setattr(Connector, "connect_link", spy)

    def rotate_under_the_session() -> None:
        ring = read_ring(shared).with_next(time.time(), S["g2"]).promoted(time.time(), 0.5)
        write_ring(shared, ring)
        until = ring.get("g1").accept_until  # type: ignore[union-attr]
        wait_until(lambda: time.time() > until + 0.1, what="g1's window to pass")
        wait_until(lambda: rx.keyring["default"].generations().startswith("g2 current, g1 previous"),
                   what="the receiver to read the promoted file")

    class Scripted:
        """One channel; on its second observation the rotation happens, then three channels (new connections)."""

        name = "scripted"

        def __init__(self) -> None:
            self.n = 0

        def update(self, observation: Observation) -> None:
            self.n += 1
            if self.n == 2:
                rotate_under_the_session()

        def suggest(self) -> Suggestion:
            if self.n == 1:
                return Suggestion((ClusterLayout("all", 1, 1, 2),), "start small", True)
            if self.n == 2:
                return Suggestion((ClusterLayout("all", 3, 1, 2),), "cc 1->3 after the rotation", True)
            return Suggestion((ClusterLayout("all", 3, 1, 2),), "", False)

        def cluster_of(self, file: FileInfo) -> str:
            return "all"

    src = make_files(tmp_path / "src", {f"f{i}.dat": (1 << 20) + i for i in range(8)})
    res = send(src, rx.port, shared, tuner=Scripted(), profile_interval="0.2s", sample_interval="0.1s",
               job_id="long-session")
    assert res.ok and res.verified_files == 8, res.error
    assert trees_identical(src, tmp_path / "dst" / "out")
    assert rx.generations == {("default", "g1"): 1} and rx.stats["sessions"] == 1  # one session, opened on g1
    assert opened[:2] == [("control", "g1"), ("data", "g1")]
    assert opened[2:] == [("data", "g2"), ("data", "g2")], opened  # the retuned channels, after the window
    assert any(iv["cc"] == 3 and iv["bytes"] > 0 for iv in res.intervals)  # and they carried files


def _keyring_receiver(tmp_path: Path, body: str, names: tuple[str, ...] = ("a", "b", "c")) -> tuple[Receiver, Path]:
    from transfer_agent.receiving.keyring import load_keyring

    keys = tmp_path / "keys"
    keys.mkdir()
    for name in names:
        write_secret(keys / name)
    ring = keys / "ring.toml"
    ring.write_text(body)
    return Receiver(listen=("127.0.0.1", 0), root=str(tmp_path / "dst"), keyring=load_keyring(ring)).start(), keys


def _knock(port: int, key_id: str, secret: bytes) -> bool:
    """Whether the receiver accepts ``key_id`` with ``secret`` now (a ``check`` connection: WELCOME or AuthError)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            auth.client_handshake(s, bytes(secret), {"role": "check", "session": uuid.uuid4().hex, "job": "knock",
                                                     "attempt": 1}, key_id=key_id)
            return True
        except auth.AuthError:
            return False


@pytest.mark.parametrize("change", ["key removed", "subtree changed"])
def test_one_keyring_snapshot_serves_a_whole_handshake(tmp_path: Path, logs, receivers, change: str) -> None:
    """The keyring changes between the receiver's CHALLENGE and the sender's AUTH: the handshake finishes on the keys
    it started with (authentication, subtree and quota from one snapshot), not on a mix (nor a KeyError without an
    ERROR frame when the key went away)."""
    rx, keys = _keyring_receiver(tmp_path, '[keys.a]\nsecret_file = "a"\nsubtree = "lab"\n[keys.b]\nsecret_file = "b"\n')
    receivers.append(rx)
    edited = ('[keys.b]\nsecret_file = "b"\n' if change == "key removed" else
              '[keys.a]\nsecret_file = "a"\nsubtree = "other"\n[keys.b]\nsecret_file = "b"\n')
    sends: list[int] = []

    class ChangeBeforeAuth:
        """The sender's socket; before its second frame (AUTH) the keyring file changes and the receiver reads it."""

        def __init__(self, s: socket.socket) -> None:
            self.s = s

        def sendall(self, b: bytes, *a: int) -> None:
            sends.append(len(b))
            if len(sends) == 2:
                (keys / "ring.toml").write_text(edited)
                wait_until(lambda: (rx.keyring.lookup("a") is None) if change == "key removed" else
                           rx.keyring["a"].subtree == "other", what="the receiver to read the edited keyring")
            self.s.sendall(b, *a)

        def __getattr__(self, name: str):
            return getattr(self.s, name)

    sid = uuid.uuid4().hex
    with socket.create_connection(("127.0.0.1", rx.port), timeout=10) as s:
        hs = auth.client_handshake(ChangeBeforeAuth(s), auth.load_secret(keys / "a"),
                                   {"role": "control", "session": sid, "job": "snap", "attempt": 1}, key_id="a")
        assert hs.peer["session"] == sid  # WELCOME: the session opened
        assert rx._sessions[sid].key.key_id == "a" and rx._sessions[sid].key.subtree == "lab"  # the snapshot's key
    assert len(sends) >= 2
    if change == "key removed":  # a new handshake starts from the keys now: a is gone
        assert not _knock(rx.port, "a", auth.load_secret(keys / "a"))  # type: ignore[arg-type]
    else:
        assert rx.keyring["a"].subtree == "other"


def test_looks_out_of_turn_are_rate_limited_whoever_asks(tmp_path: Path, receivers, monkeypatch) -> None:
    """HELLOs naming unknown keys or generations make the receiver look at its files out of turn at most once per
    250 ms, however many arrive; one that comes after that window still gets its look (a legit rotation)."""
    from transfer_agent.receiving import keyring as keyring_mod

    shared = write_secret(tmp_path / "secret")
    rx = start_receiver(tmp_path / "dst", shared)
    receivers.append(rx)
    stamps: list[float] = []
    real_stamp = keyring_mod.file_stamp

    def counting(path):
        if str(path) == str(shared):
            stamps.append(time.monotonic())
        return real_stamp(path)

    monkeypatch.setattr(keyring_mod, "file_stamp", counting)
    wait_until(rx._keys.forced_look_ready, what="a look out of turn allowed")
    t0 = time.monotonic()
    refused = sum(not _knock(rx.port, key_id, S["g1"]) for key_id in ["default", "nobody"] * 20)
    elapsed = time.monotonic() - t0
    assert refused == 40  # every one got the decoy: a wrong secret, or an unknown key
    allowed = (elapsed / 0.25 + 1) + (elapsed / 1.0 + 1)  # looks out of turn, plus the once-a-second looks
    assert 1 <= len(stamps) <= allowed, (len(stamps), elapsed)
    # after the window, a rotated generation still gets its look at once: no refusal for want of one
    write_ring(shared, read_ring(shared).with_next(time.time(), S["g1"]))
    wait_until(rx._keys.forced_look_ready, what="a look out of turn allowed again")
    assert check_receiver(("127.0.0.1", rx.port), Generation("g1", S["g1"], time.time(), "next"), "default",
                          timeout=0) < 5


def test_revoking_a_key_fails_closed_and_a_broken_keyring_file_keeps_the_last_keys(tmp_path: Path, logs,
                                                                                   receivers) -> None:
    rx, keys = _keyring_receiver(tmp_path, "".join(f'[keys.{k}]\nsecret_file = "{k}"\n' for k in "abc"))
    receivers.append(rx)
    secret = {k: bytes(auth.load_secret(keys / k)) for k in "abc"}  # type: ignore[arg-type]
    assert all(_knock(rx.port, k, secret[k]) for k in "abc")
    # the operator revokes c (removed from the keyring file) and a (its secret file deleted) at once
    (keys / "ring.toml").write_text('[keys.a]\nsecret_file = "a"\n[keys.b]\nsecret_file = "b"\n')
    (keys / "a").unlink()
    wait_until(lambda: not _knock(rx.port, "a", secret["a"]) and not _knock(rx.port, "c", secret["c"]),
               what="a and c refused")
    assert _knock(rx.port, "b", secret["b"]) and list(rx.keyring) == ["b"]  # the others stay
    assert receiver_log(logs, "key 'a' dropped", str(keys / "a"), "does not exist")
    assert [r.levelname for r in logs.records if "key 'a' dropped" in r.getMessage()] == ["ERROR"]
    # b's file made readable by others: b is dropped too (fail closed), and comes back once it is private again
    os.chmod(keys / "b", 0o644)
    wait_until(lambda: not _knock(rx.port, "b", secret["b"]), what="b refused")
    assert receiver_log(logs, "key 'b' dropped", str(keys / "b"), "mode 644")
    os.chmod(keys / "b", 0o600)
    wait_until(lambda: _knock(rx.port, "b", secret["b"]), what="b accepted again")
    # a keyring file that no longer parses is an edit gone wrong, not a revocation: the last good keys stay
    (keys / "ring.toml").write_text("[keys.b\n")
    wait_until(lambda: _knock(rx.port, "b", secret["b"]) and  # connections make the receiver look
               receiver_log(logs, "keeping the last good keys", str(keys / "ring.toml")),
               what="the error naming the keyring file")
    assert _knock(rx.port, "b", secret["b"]) and not _knock(rx.port, "a", secret["a"])


def test_deleting_a_receivers_only_secret_refuses_everyone_until_it_is_back(tmp_path: Path, logs, receivers) -> None:
    shared = write_secret(tmp_path / "secret")
    rx = start_receiver(tmp_path / "dst", shared)
    receivers.append(rx)
    secret = shared.read_bytes().strip()
    assert _knock(rx.port, "default", secret)
    shared.unlink()
    wait_until(lambda: not _knock(rx.port, "default", secret), what="the deleted secret refused")
    assert receiver_log(logs, "key 'default' dropped", str(shared), "does not exist") and not list(rx.keyring)
    shared.write_bytes(secret + b"\n")
    shared.chmod(0o600)
    wait_until(lambda: _knock(rx.port, "default", secret), what="the restored secret accepted")


def test_check_receiver_asks_for_encryption(tmp_path: Path, receivers, capsys) -> None:
    """``fstream keys rotate --check-receiver`` against a receiver that requires encryption (like ``send
    --encrypt``): the check passes and the rotation goes on to promote."""
    shared = write_secret(tmp_path / "secret")
    rx = start_receiver(tmp_path / "dst", shared, require_encryption=True)
    receivers.append(rx)
    assert check_receiver(("127.0.0.1", rx.port), read_ring(shared).current, "default", timeout=0) < 5
    assert main(["keys", "rotate", str(shared), "--check-receiver", f"fstream://127.0.0.1:{rx.port}",
                 "--check-timeout", "5s"]) == 0, capsys.readouterr().err
    assert "3/3 promote: generation g1 is current" in capsys.readouterr().out
