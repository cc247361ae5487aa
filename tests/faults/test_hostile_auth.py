"""Hostile peers and someone in the path (issue 8, defects 1, 2 and part of 7; fault-suite rows
"impostor receiver/sender" and "in-path proxy corrupts, truncates or rewrites data and hash").

Real receivers on loopback; impostors are small fake servers/clients speaking the wire protocol;
the in-path attacker is a threaded TCP forwarder that parses frames and rewrites them. After each
case: nothing wrong is visible under a final name, and the outcome is verified or a failure
naming the cause (checksum / authentication).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest

from agentkit import make_files, part_files, send, start_receiver, write_secret, wait_until
from transfer_agent.wire.auth import NONCE_BYTES, client_handshake, load_secret
from transfer_agent.errors import AuthError
from transfer_agent.wire.protocol import (HEADER, HEADER_SIZE, VERSION, ControlWriter, Frame, pack_control, pack_header,
                                     recv_exact, recv_frame)
from transfer_agent.receiving.receiver import Receiver

KiB, MiB = 1024, 1024 * 1024




def visible_files(root: Path) -> list[Path]:
    """Files under final names (no temp parts, no sidecars)."""
    return [p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")]


# -- impostor receiver -------------------------------------------------------------------------------
class FakeReceiver:
    """Accepts connections, answers HELLO with a CHALLENGE chosen by the test (without knowing the secret),
    then plays along (WELCOME, OPEN_OK...) and records every frame type it is sent after the CHALLENGE."""

    def __init__(self, challenge: Callable[[dict], dict]) -> None:
        self.challenge = challenge
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.after_challenge: list[str] = []
        self.connections = 0
        self._stop = False
        self._t = threading.Thread(target=self._serve, daemon=True)
        self._t.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()

    def _conn(self, c: socket.socket) -> None:
        w = ControlWriter(c)
        try:
            _t, _f, _o, _l, hello = recv_frame(c)
            w.send(Frame.CHALLENGE, self.challenge(hello or {}))
            while True:
                ftype, fid, _o, length, _body = recv_frame(c)
                self.after_challenge.append(ftype.name)
                if ftype == Frame.DATA:
                    recv_exact(c, length)
                elif ftype == Frame.AUTH:
                    w.send(Frame.WELCOME, {"session": "x", "root_free": 1 << 40})
                elif ftype == Frame.OPEN:
                    w.send(Frame.OPEN_OK, {"missing": [[0, 10]], "resumed": 0}, fid)
                elif ftype == Frame.COMMIT:
                    w.send(Frame.COMMITTED, {"ok": True}, fid)
                elif ftype == Frame.PING:
                    w.send(Frame.PONG, _body or {})
        except Exception:  # noqa: BLE001 - the sender hung up
            pass
        finally:
            c.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def _chal(auth: str | None, proof: str | None = None) -> Callable[[dict], dict]:
    def make(_hello: dict) -> dict:
        body = {"version": VERSION, "caps": [], "nonce": os.urandom(NONCE_BYTES).hex()}
        if auth is not None:
            body["auth"] = auth
        if proof is not None:
            body["proof"] = proof
        return body
    return make


@pytest.mark.parametrize("claim,proof", [("tls", None), ("none", None), (None, None), ("hmac", None),
                                         ("hmac", "00" * 32)])
def test_impostor_receiver_gets_nothing(tmp_path: Path, secret: Path, claim: str | None, proof: str | None) -> None:
    """A receiver that does not know the secret, whatever auth mode it claims, is refused: nothing sent."""
    src = make_files(tmp_path / "src", {"a.dat": 10})
    fake = FakeReceiver(_chal(claim, proof))
    try:
        res = send(src, fake.port, secret)
    finally:
        fake.close()
    assert not res.ok and res.verified_files == 0
    err = res.error or ""
    assert f"127.0.0.1:{fake.port}" in err and "terminal" in err and "authentication failed" in err, err
    assert fake.connections == 1  # terminal: not retried
    assert "OPEN" not in fake.after_challenge and "DATA" not in fake.after_challenge
    assert "AUTH" not in fake.after_challenge  # not even our proof


def test_impostor_receiver_cli_exit_code(tmp_path: Path, secret: Path) -> None:
    src = make_files(tmp_path / "src", {"a.dat": 10})
    fake = FakeReceiver(_chal("tls"))
    try:
        r = subprocess.run([sys.executable, "-m", "transfer_agent.cli", "send", str(src), "--to",
                            f"fstream://127.0.0.1:{fake.port}/o", "--secret-file", str(secret), "--tuner", "fixed",
                            "--json"], capture_output=True, text=True, timeout=60)
    finally:
        fake.close()
    assert r.returncode != 0
    out = json.loads(r.stdout)
    assert out["verified_files"] == 0 and f"127.0.0.1:{fake.port}" in out["error"]
    assert not fake.after_challenge


# -- impostor sender ---------------------------------------------------------------------------------
def _hello(role: str = "control", **kw: object) -> dict:
    return {"version": VERSION, "caps": [], "nonce": os.urandom(NONCE_BYTES).hex(), "role": role,
            "session": uuid.uuid4().hex, "job": "j", "attempt": 1, **kw}


def _refused(sock: socket.socket) -> dict:
    sock.settimeout(10)
    ftype, _f, _o, _l, body = recv_frame(sock)
    assert ftype == Frame.ERROR, ftype
    return body or {}


@pytest.mark.parametrize("claim,auth", [("tls", {}), ("hmac", {}), ("none", {"proof": ""}),
                                        ("hmac", {"proof": "ab" * 32})])
def test_impostor_sender_refused(tmp_path: Path, secret: Path, rx: Receiver, claim: str, auth: dict) -> None:
    with socket.create_connection(("127.0.0.1", rx.port)) as s:
        s.sendall(pack_control(Frame.HELLO, _hello(auth=claim)))
        _t, _f, _o, _l, chal = recv_frame(s)
        s.sendall(pack_control(Frame.AUTH, auth))
        body = _refused(s)
        assert body["kind"] == "auth" and "authentication failed" in body["message"]
        s.sendall(pack_control(Frame.OPEN, {"path": "evil", "size": 4, "mtime_ns": 1, "algo": "xxh3_128"}, 1))
    assert rx.stats["sessions"] == 0
    assert not any((tmp_path / "dst").rglob("*"))


def test_replayed_handshake_refused(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    """A recorded genuine HELLO+AUTH replayed on a new connection fails: the server's nonce is fresh."""
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
        client_handshake(Spy(s), load_secret(secret), {"role": "control", "session": "s1", "job": "j", "attempt": 1})
    hello, auth = sent[0], sent[1]
    wait_until(lambda: not rx._sessions)
    sessions = rx.stats["sessions"]
    with socket.create_connection(("127.0.0.1", rx.port)) as s:
        s.sendall(hello)
        recv_frame(s)
        s.sendall(auth)
        assert _refused(s)["kind"] == "auth"
    assert rx.stats["sessions"] == sessions


def test_receiver_requires_proof_even_if_sender_claims_tls(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    """Mode from the receiver's own configuration: with a secret, a HELLO claiming TLS still needs a proof."""
    with socket.create_connection(("127.0.0.1", rx.port)) as s:
        s.sendall(pack_control(Frame.HELLO, _hello(auth="tls")))
        _t, _f, _o, _l, chal = recv_frame(s)
        assert chal and chal["auth"] == "hmac" and chal.get("proof")
        s.sendall(pack_control(Frame.AUTH, {}))
        assert "no proof" in _refused(s)["message"]


# -- in-path proxy -----------------------------------------------------------------------------------
Hook = Callable[[int, int, int, int, int, bytes], "tuple[bytes, bytes] | None"]


class Proxy:
    """A threaded TCP forwarder between sender and receiver that parses frames in both directions.

    ``c2s``/``s2c`` hooks get (connection number, frame type, file id, offset, length, payload) and
    return (header, payload) to forward (possibly rewritten) or None to cut the connection there.
    """

    def __init__(self, target_port: int, c2s: Hook | None = None, s2c: Hook | None = None) -> None:
        self.target = target_port
        self.c2s, self.s2c = c2s, s2c
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.n = 0
        self.wire = bytearray()  # everything the sender put on the wire (for confidentiality checks)
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                c.close()
                continue
            with self._lock:
                self.n += 1
                n = self.n
                self._socks += [c, u]
            threading.Thread(target=self._pump, args=(n, c, u, self.c2s, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(n, u, c, self.s2c, False), daemon=True).start()

    def _pump(self, n: int, a: socket.socket, b: socket.socket, hook: Hook | None, record: bool) -> None:
        try:
            while True:
                head = recv_exact(a, HEADER_SIZE)
                _m, _v, ftype, fid, off, length = HEADER.unpack(head)
                payload = recv_exact(a, length) if length else b""
                if record:
                    with self._lock:
                        self.wire += head + payload
                out = (head, payload) if hook is None else hook(n, ftype, fid, off, length, payload)
                if out is None:
                    b.sendall(head + payload[: len(payload) // 2])
                    break
                b.sendall(out[0] + out[1])
        except Exception:  # noqa: BLE001 - either side hung up
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass


def _once(pred: Callable[[int, int], bool]) -> Callable[[int, int], bool]:
    """A predicate true for the first frame matching ``pred`` only."""
    done = threading.Event()

    def f(ftype: int, n: int) -> bool:
        if not done.is_set() and pred(ftype, n):
            done.set()
            return True
        return False
    return f


def _rejson(ftype: int, fid: int, body: dict) -> tuple[bytes, bytes]:
    payload = json.dumps(body, separators=(",", ":")).encode()
    return pack_header(ftype, fid, 0, len(payload)), payload


@pytest.fixture
def proxied(tmp_path: Path, secret: Path):
    """(receiver, proxy factory); both stopped after the test."""
    rx = start_receiver(tmp_path / "dst", secret)
    proxies: list[Proxy] = []

    def make(c2s: Hook | None = None, s2c: Hook | None = None) -> Proxy:
        p = Proxy(rx.port, c2s, s2c)
        proxies.append(p)
        return p
    try:
        yield rx, make
    finally:
        for p in proxies:
            p.close()
        rx.stop()


def test_flipped_data_bytes_detected_and_resent(tmp_path: Path, secret: Path, proxied) -> None:
    rx, make = proxied
    src = make_files(tmp_path / "src", {"a.bin": 3 * MiB, "b.bin": 64 * KiB})
    hit = _once(lambda t, n: t == Frame.DATA)

    def flip(n, ftype, fid, off, length, payload):
        if hit(ftype, n):
            payload = bytes([payload[0] ^ 0xFF]) + payload[1:]
        return pack_header(ftype, fid, off, length), payload

    p = make(c2s=flip)
    res = send(src, p.port, secret, cc=1, p=2)
    assert res.ok, res.error
    assert res.bytes_sent > 3 * MiB + 64 * KiB  # the tampered file was refused at commit and sent again
    assert all((tmp_path / "dst" / "out" / n).read_bytes() == (src / n).read_bytes()
                                   for n in ("a.bin", "b.bin"))
    assert not part_files(tmp_path / "dst")


def test_always_flipped_data_fails_with_checksum_reason(tmp_path: Path, secret: Path, proxied) -> None:
    rx, make = proxied
    src = make_files(tmp_path / "src", {"a.bin": 64 * KiB})

    def flip(n, ftype, fid, off, length, payload):
        if ftype == Frame.DATA:
            payload = bytes([payload[0] ^ 0xFF]) + payload[1:]
        return pack_header(ftype, fid, off, length), payload

    res = send(src, make(c2s=flip).port, secret)
    reason = res.failures[0]["reason"] if res.failures else ""
    # every retry meets the same tampering: the file fails for the checksum, never "busy" (defect 6: the receiver
    # releases a mismatched file before it answers)
    assert not res.ok and "checksum" in reason and "busy" not in reason, reason
    assert "checksum mismatch" in str(res.failures)
    assert not visible_files(tmp_path / "dst")


def test_data_and_digest_rewritten_together_detected(tmp_path: Path, secret: Path, proxied) -> None:
    """The attacker replaces the content and recomputes the COMMIT digest (unkeyed: it does not know the key)."""
    import blake3
    import xxhash

    rx, make = proxied
    size = 64 * KiB
    src = make_files(tmp_path / "src", {"a.bin": size})
    evil = b"\0" * size

    def rewrite(n, ftype, fid, off, length, payload):
        if ftype == Frame.DATA:
            payload = evil[off: off + length]
        elif ftype == Frame.COMMIT:
            body = json.loads(payload)
            body["hash"] = (xxhash.xxh3_128(evil).hexdigest() if len(body["hash"]) == 32
                            else blake3.blake3(evil).hexdigest())
            return _rejson(ftype, fid, body)
        return pack_header(ftype, fid, off, length), payload

    res = send(src, make(c2s=rewrite).port, secret, max_session_retries=1)
    assert not res.ok
    assert "failed authentication" in (res.error or "") or "checksum" in str(res.failures), res.error
    out = tmp_path / "dst" / "out" / "a.bin"
    assert not out.exists() or out.read_bytes() == (src / "a.bin").read_bytes()
    assert not [p for p in visible_files(tmp_path / "dst") if p.read_bytes() == evil]


def test_truncated_block_resumed(tmp_path: Path, secret: Path, proxied) -> None:
    rx, make = proxied
    src = make_files(tmp_path / "src", {"a.bin": 4 * MiB})
    hit = _once(lambda t, n: t == Frame.DATA)

    def cut(n, ftype, fid, off, length, payload):
        if hit(ftype, n):
            return None  # half the block, then the connection is cut
        return pack_header(ftype, fid, off, length), payload

    # the sender may have every block in its socket buffers already (its streams see nothing): the receiver
    # tells it on the control connection, the session restarts and resumes from the receiver's ranges
    t0 = time.monotonic()
    res = send(src, make(c2s=cut).port, secret, cc=1, p=1, block_size=MiB)
    assert time.monotonic() - t0 < 15  # not the 60 s stall timer
    assert res.ok, res.error
    assert (tmp_path / "dst" / "out" / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    assert not part_files(tmp_path / "dst")


@pytest.mark.parametrize("encrypt", [False, True])
@pytest.mark.parametrize("direction", ["c2s", "s2c"])
def test_tampered_control_frame_detected(tmp_path: Path, secret: Path, proxied, direction: str,
                                         encrypt: bool) -> None:
    """An OPEN redirected to another path (c2s), or an OPEN_OK claiming nothing is missing (s2c): MAC fails."""
    rx, make = proxied
    src = make_files(tmp_path / "src", {"a.bin": 64 * KiB})

    def c2s(n, ftype, fid, off, length, payload):
        if ftype == Frame.OPEN:
            body = json.loads(payload)
            body["path"] = "out/evil.bin"
            return _rejson(ftype, fid, body)
        return pack_header(ftype, fid, off, length), payload

    def s2c(n, ftype, fid, off, length, payload):
        if ftype == Frame.OPEN_OK:
            body = json.loads(payload)
            body["missing"] = []
            return _rejson(ftype, fid, body)
        return pack_header(ftype, fid, off, length), payload

    p = make(**{direction: c2s if direction == "c2s" else s2c})
    res = send(src, p.port, secret, encrypt=encrypt)  # sealed bodies: the fields added beside "sealed" are refused
    assert not res.ok and "failed authentication" in (res.error or ""), res.error
    assert "terminal" in (res.error or "")
    assert not visible_files(tmp_path / "dst")


def test_unkeyed_digest_refused_with_secret(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    from transfer_agent.sending.connector import Connector

    conn = Connector("127.0.0.1", rx.port, load_secret(secret), None, {"session": "s", "job": "j", "attempt": 1})
    link = conn.connect_link(role="control").link
    with link.sock:
        link.send(Frame.OPEN, {"path": "x.bin", "size": 10, "mtime_ns": 1, "algo": "xxh3_128"}, 1)
        ftype, _fid, body = link.recv()
    assert ftype == Frame.ERROR and body["kind"] == "refused" and "not keyed" in body["message"]
    assert not any((tmp_path / "dst").rglob("*"))


# -- encryption --------------------------------------------------------------------------------------
def test_encrypted_round_trip_is_confidential(tmp_path: Path, secret: Path) -> None:
    rx = start_receiver(tmp_path / "dst", secret, require_encryption=True)
    proxy = Proxy(rx.port)
    try:
        src = make_files(tmp_path / "src", {"big.bin": 9 * MiB + 7, **{f"s/{i}.dat": 3 * KiB for i in range(20)}})
        res = send(src, proxy.port, secret, encrypt=True, cc=2, p=3, block_size=MiB)
        assert res.ok, res.error
        assert res.verified_files == 21
        for p in src.rglob("*"):
            if p.is_file():
                assert (tmp_path / "dst" / "out" / p.relative_to(src)).read_bytes() == p.read_bytes()
        sample = (src / "big.bin").read_bytes()[MiB: MiB + 64]
        assert sample not in bytes(proxy.wire)  # no plaintext block on the wire
        assert b"big.bin" not in bytes(proxy.wire)  # control bodies sealed too (names hidden)
    finally:
        proxy.close()
        rx.stop()


def test_encrypted_payload_tampering_detected(tmp_path: Path, secret: Path, proxied) -> None:
    rx, make = proxied
    src = make_files(tmp_path / "src", {"a.bin": 3 * MiB})
    hit = _once(lambda t, n: t == Frame.DATA)
    seen = []

    def flip(n, ftype, fid, off, length, payload):
        if hit(ftype, n):
            seen.append(off)
            payload = payload[:100] + bytes([payload[100] ^ 1]) + payload[101:]
        return pack_header(ftype, fid, off, length), payload

    events: list[tuple[str, dict]] = []
    res = send(src, make(c2s=flip).port, secret, encrypt=True, cc=1, p=2, block_size=MiB,
               on_event=lambda kind, data: events.append((kind, data)))
    assert seen and res.ok, res.error
    logs = [d.get("message", "") for k, d in events if k == "log"]
    assert any("failed authentication" in m for m in logs), logs  # told at once, not found by the stall timer
    assert (tmp_path / "dst" / "out" / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    assert rx.stats["errors"] >= 1  # the tampered block was refused (connection closed), then re-sent


def test_plain_sender_refused_by_receiver_requiring_encryption(tmp_path: Path, secret: Path) -> None:
    rx = start_receiver(tmp_path / "dst", secret, require_encryption=True)
    try:
        src = make_files(tmp_path / "src", {"a.dat": 100})
        res = send(src, rx.port, secret)
        assert not res.ok and "requires encryption" in (res.error or "") and "terminal" in (res.error or "")
        assert not any((tmp_path / "dst").rglob("*"))
    finally:
        rx.stop()


def test_stripping_encrypt_from_hello_detected(tmp_path: Path, secret: Path, proxied) -> None:
    rx, make = proxied
    src = make_files(tmp_path / "src", {"a.dat": 100})

    def strip(n, ftype, fid, off, length, payload):
        if ftype == Frame.HELLO:
            body = json.loads(payload)
            body["encrypt"] = False
            return _rejson(ftype, fid, body)
        return pack_header(ftype, fid, off, length), payload

    res = send(src, make(c2s=strip).port, secret, encrypt=True)
    assert not res.ok and "authentication failed" in (res.error or ""), res.error
    assert not any((tmp_path / "dst").rglob("*"))


def test_encrypt_cli_end_to_end(tmp_path: Path, secret: Path) -> None:
    rx = start_receiver(tmp_path / "dst", secret, require_encryption=True)
    try:
        src = make_files(tmp_path / "src", {"a.bin": 300 * KiB})
        r = subprocess.run([sys.executable, "-m", "transfer_agent.cli", "send", str(src), "--to",
                            f"fstream://127.0.0.1:{rx.port}/o", "--secret-file", str(secret), "--tuner", "fixed",
                            "--encrypt", "--json"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr[-2000:]
        out = json.loads(r.stdout)
        assert out["verified_files"] == 1 and out["checksum"] == "blake3-keyed"
        assert (tmp_path / "dst" / "o" / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    finally:
        rx.stop()


# -- plaintext against TLS, secret file modes, pre-auth bodies ------------------------------------------
needs_openssl = pytest.mark.skipif(subprocess.run(["which", "openssl"], capture_output=True).returncode != 0,
                                   reason="openssl CLI not installed")


def _self_signed(d: Path) -> None:
    """One self-signed certificate, used as both sides' certificate and as the CA."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=t",
                    "-keyout", str(d / "k.pem"), "-out", str(d / "c.pem")], check=True, capture_output=True)


@needs_openssl
def test_tls_with_secret_uses_keyed_digest(tmp_path: Path, secret: Path) -> None:
    from transfer_agent.wire.auth import TLSConfig

    d = tmp_path
    _self_signed(d)
    rx = Receiver(listen=("127.0.0.1", 0), root=str(d / "dst"), secret=load_secret(secret),
                  tls=TLSConfig(str(d / "c.pem"), str(d / "k.pem"), str(d / "c.pem"))).start()
    try:
        src = make_files(d / "src", {"a.bin": 2 * MiB})
        res = send(src, rx.port, secret, tls_cert=str(d / "c.pem"), tls_key=str(d / "k.pem"),
                   tls_ca=str(d / "c.pem"), p=2)
        assert res.ok and res.checksum == "blake3-keyed", res.error
        assert (d / "dst" / "out" / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    finally:
        rx.stop()


@needs_openssl
def test_plaintext_client_against_tls_receiver_fails_at_once(tmp_path: Path, secret: Path) -> None:
    from transfer_agent.wire.auth import TLSConfig

    d = tmp_path
    _self_signed(d)
    rx = Receiver(listen=("127.0.0.1", 0), root=str(d / "dst"),
                  tls=TLSConfig(str(d / "c.pem"), str(d / "k.pem"), str(d / "c.pem"))).start()
    try:
        src = make_files(d / "src", {"a.dat": 10})
        t0 = time.monotonic()
        res = send(src, rx.port, secret)  # default session retries: a terminal error is not retried
        assert time.monotonic() - t0 < 5
        assert not res.ok and "requires TLS" in (res.error or "") and "terminal" in (res.error or ""), res.error
    finally:
        rx.stop()


@pytest.mark.parametrize("mode,ok", [(0o600, True), (0o400, True), (0o640, False), (0o644, False), (0o602, False)])
def test_load_secret_refuses_shared_file(tmp_path: Path, mode: int, ok: bool) -> None:
    p = write_secret(tmp_path / "s")
    p.chmod(mode)
    if ok:
        assert load_secret(p)
    else:
        with pytest.raises(AuthError, match=r"chmod 600 .*s"):
            load_secret(p)


def test_deeply_nested_hello_refused_without_traceback(tmp_path: Path, secret: Path, rx: Receiver, caplog) -> None:
    import logging

    caplog.set_level(logging.DEBUG, logger="fstream.receiver")  # junk from unauthenticated peers: debug, not warning
    deep = b'{"a":' + b"[" * 1500 + b"]" * 1500 + b"}"
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", rx.port)) as s:
            s.sendall(pack_header(Frame.HELLO, 0, 0, len(deep)) + deep)
            s.settimeout(10)
            try:
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
    wait_until(lambda: rx.stats["errors"] >= 3)
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert any("nested too deeply" in r.getMessage() for r in caplog.records)


def test_pre_auth_body_limit(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    """A HELLO declaring a 1 MiB body is refused on its header, before the body is read."""
    with socket.create_connection(("127.0.0.1", rx.port)) as s:
        s.sendall(pack_header(Frame.HELLO, 0, 0, 1 << 20))
        s.settimeout(10)
        assert s.recv(1) == b""  # closed without waiting for the megabyte
    wait_until(lambda: rx.stats["errors"] >= 1)

