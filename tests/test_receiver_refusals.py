"""A hostile or broken peer: escapes, absurd sizes, malformed and truncated frames, stale attempts, TLS."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from pathlib import Path

import pytest

from agentkit import make_files, part_files, send, start_receiver, write_secret, wait_until
from transfer_agent.wire.auth import TLSConfig, load_secret
from transfer_agent.sending.connector import Connector
from transfer_agent.errors import AuthError, FStreamError, RefusedError
from transfer_agent.wire.protocol import HEADER, VERSION, Frame, pack_header
from transfer_agent.receiving.receiver import Receiver
from transfer_agent.wire.secure import ControlLink

MiB = 1024 * 1024


def control(port: int, secret: Path, job: str = "job", attempt: int = 1) -> tuple[ControlLink, Connector]:
    """An authenticated control connection; frames go through its link (MAC'd: raw frames are refused)."""
    conn = Connector("127.0.0.1", port, load_secret(secret), None,
                     {"session": uuid.uuid4().hex, "job": job, "attempt": attempt})
    return conn.connect_link(role="control").link, conn




def closed_by_peer(sock: socket.socket) -> bool:
    """True when the peer closed the connection (FIN, or RST when our bytes were left unread)."""
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def open_file(link: ControlLink, fid: int, path: str, size: int, mtime_ns: int = 1) -> tuple[Frame, dict]:
    link.send(Frame.OPEN, {"path": path, "size": size, "mtime_ns": mtime_ns, "algo": "blake3-keyed"}, fid)
    ftype, rfid, body = link.recv()
    assert rfid == fid
    return ftype, body


@pytest.mark.parametrize("path,why", [
    ("../escape.txt", "escapes"), ("/etc/passwd", "absolute"), ("a/\uff0e\uff0e/\uff0e\uff0e/x", "escapes"),
    ("ok/\x00nul", "NUL"), ("tab\there", "control"),
])
def test_escaping_names_refused(tmp_path: Path, secret: Path, rx: Receiver, path: str, why: str) -> None:
    sock, _ = control(rx.port, secret)
    with sock.sock:
        ftype, body = open_file(sock, 1, path, 10)
    assert ftype == Frame.ERROR and body["kind"] == "refused" and why in body["message"]
    assert not any((tmp_path / "dst").rglob("*"))
    assert not (tmp_path / "escape.txt").exists()


def test_symlink_in_destination_refused(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "dst" / "link").symlink_to(outside)
    sock, _ = control(rx.port, secret)
    with sock.sock:
        ftype, body = open_file(sock, 1, "link/file.dat", 10)
    assert ftype == Frame.ERROR and "symlink" in body["message"]
    assert not any(outside.iterdir())


def test_size_beyond_free_space_refused_before_writing(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    sock, _ = control(rx.port, secret)
    with sock.sock:
        ftype, body = open_file(sock, 1, "huge.bin", free + 1024**3)
        assert ftype == Frame.ERROR and "no space left" in body["message"] and body["retryable"] is False
        ftype, body = open_file(sock, 2, "absurd.bin", 1 << 60)
        assert ftype == Frame.ERROR and "not a valid file size" in body["message"]
        ftype, _ = open_file(sock, 3, "fine.bin", 10)  # the session is still usable
        assert ftype == Frame.OPEN_OK
    assert not (tmp_path / "dst" / "huge.bin").exists()
    assert not list((tmp_path / "dst").glob(".huge.bin*"))


def test_malformed_frame_closes_only_that_connection(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    sock, conn = control(rx.port, secret)
    data = conn.connect(role="data", channel=1, stream=0)
    with sock.sock, data:
        data.sendall(HEADER.pack(b"ZZ", VERSION, Frame.DATA, 1, 0, 10))
        assert closed_by_peer(data)  # closed by the receiver
        ftype, _ = open_file(sock, 1, "still.bin", 5)  # control of the same session still served
        assert ftype == Frame.OPEN_OK
    src = make_files(tmp_path / "src", {"other.dat": 5000})
    assert send(src, rx.port, secret).ok  # and other sessions too


def test_truncated_block_leaves_resumable_part(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    size = 4 * MiB
    src = make_files(tmp_path / "src", {"t.bin": size})
    st = os.stat(src / "t.bin")
    sock, conn = control(rx.port, secret, job="j1")
    payload = (src / "t.bin").read_bytes()
    with sock.sock:
        ftype, body = open_file(sock, 1, "out/t.bin", size, st.st_mtime_ns)
        assert ftype == Frame.OPEN_OK and body["missing"] == [[0, size]]
        data = conn.connect(role="data", channel=1, stream=0)
        data.sendall(pack_header(Frame.DATA, 1, 0, 2 * MiB) + payload[:MiB])  # promise 2 MiB, send 1
        data.close()
        wait_until(lambda: rx.stats["errors"] >= 1)  # the receiver saw the truncated frame and kept the bytes
    wait_until(lambda: not rx._sessions)  # the receiver persists the ranges as the session closes
    res = send(src / "t.bin", rx.port, secret)
    assert res.ok and res.resumed_bytes == MiB and res.bytes_sent == size - MiB
    assert (tmp_path / "dst" / "out" / "t.bin").read_bytes() == payload
    assert not part_files(tmp_path / "dst")


def test_block_overlapping_received_bytes_refused(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    """Every byte is written once: a second copy of a block (which could change bytes already hashed) is refused."""
    sock, conn = control(rx.port, secret)
    with sock.sock:
        ftype, _ = open_file(sock, 1, "o.bin", 8192)
        assert ftype == Frame.OPEN_OK
        data = conn.connect(role="data", channel=1, stream=0)
        with data:
            data.sendall(pack_header(Frame.DATA, 1, 0, 4096) + b"a" * 4096)
            data.sendall(pack_header(Frame.DATA, 1, 2048, 4096) + b"b" * 4096)
            assert closed_by_peer(data)
    wait_until(lambda: rx.stats["errors"] >= 1)
    assert not (tmp_path / "dst" / "o.bin").exists()


def test_data_for_unopened_file_refused(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    sock, conn = control(rx.port, secret)
    data = conn.connect(role="data", channel=1, stream=0)
    with sock.sock, data:
        data.sendall(pack_header(Frame.DATA, 42, 0, 4) + b"evil")
        assert closed_by_peer(data)
    assert not any(p.is_file() for p in (tmp_path / "dst").rglob("*"))


def test_stale_attempt_is_fenced(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    new, _ = control(rx.port, secret, job="J", attempt=2)
    with new.sock:
        with pytest.raises(RefusedError, match="stale attempt 1 of job J"):
            control(rx.port, secret, job="J", attempt=1)


def _make_certs(d: Path) -> dict[str, str]:
    def run(*a: str) -> None:
        subprocess.run(["openssl", *a], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
        "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(d / f"{name}.key"),
            "-out", str(d / f"{name}.csr"))
        run("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
            "-CAcreateserial", "-days", "2", "-out", str(d / f"{name}.pem"))
    return {k: str(d / k) for k in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


@pytest.mark.skipif(subprocess.run(["which", "openssl"], capture_output=True).returncode != 0,
                    reason="openssl CLI not installed (needed to make test certificates)")
def test_mutual_tls(tmp_path: Path) -> None:
    from fstream_provider.model.spec import TransferSpec
    from transfer_agent.sending.sender import Transfer

    c = _make_certs(tmp_path)
    rx = Receiver(listen=("127.0.0.1", 0), root=str(tmp_path / "dst"),
                  tls=TLSConfig(c["server.pem"], c["server.key"], c["ca.pem"])).start()
    try:
        src = make_files(tmp_path / "src", {"a.dat": 24 * MiB, "b.dat": 1000})  # several blocks per stream
        spec = TransferSpec.from_options([str(src)], f"fstream://127.0.0.1:{rx.port}/o", tuner="fixed", cc=2, p=4,
                                         tls_cert=c["client.pem"], tls_key=c["client.key"], tls_ca=c["ca.pem"])
        events: list = []
        res = Transfer(spec, on_event=lambda kind, data: events.append((kind, data))).run()
        assert res.ok and res.verified_files == 2
        assert (tmp_path / "dst" / "o" / "a.dat").read_bytes() == (src / "a.dat").read_bytes()
        # with TLS the checksum is a plain xxh3_128: the file events (and so the Airflow XCom) carry it
        from transfer_agent.storage.checksum import hash_fd

        for kind, data in events:
            if kind == "file":
                fd = os.open(data["source"], os.O_RDONLY)
                try:
                    assert data["algo"] == "xxh3_128" and data["checksum"] == hash_fd(fd, data["size"], "xxh3_128")
                finally:
                    os.close(fd)
        assert sum(kind == "file" for kind, _ in events) == 2
        # a client with a certificate from another CA is refused, nothing written
        other = tmp_path / "other"
        other.mkdir()
        o = _make_certs(other)
        spec2 = TransferSpec.from_options([str(src)], f"fstream://127.0.0.1:{rx.port}/bad", tuner="fixed",
                                          tls_cert=o["client.pem"], tls_key=o["client.key"], tls_ca=c["ca.pem"])
        res2 = Transfer(spec2, max_session_retries=0).run()
        assert not res2.ok and "TLS" in (res2.error or "")
        assert not (tmp_path / "dst" / "bad").exists()
    finally:
        rx.stop()


def test_hmac_handshake_never_sends_the_secret(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    """Capture what the client writes during the handshake: the secret must not appear in it."""
    raw = socket.create_connection(("127.0.0.1", rx.port))
    sent: list[bytes] = []

    class Spy:
        def __init__(self, s: socket.socket) -> None:
            self.s = s

        def sendall(self, b: bytes) -> None:
            sent.append(bytes(b))
            self.s.sendall(b)

        def __getattr__(self, name: str):
            return getattr(self.s, name)

    from transfer_agent.wire.auth import client_handshake

    with raw:
        client_handshake(Spy(raw), load_secret(secret), {"role": "control", "session": "s", "job": "j", "attempt": 1})
    assert sent and not any(load_secret(secret) in b for b in sent)


def test_client_detects_receiver_with_other_secret(tmp_path: Path, secret: Path) -> None:
    other = write_secret(tmp_path / "other-secret")
    rx = start_receiver(tmp_path / "dst", other)
    try:
        with pytest.raises(AuthError, match="does not know our shared secret"):
            control(rx.port, secret)
        # a whole transfer: the refusal reaches the sender's result as a terminal auth error, not retried
        res = send(make_files(tmp_path / "src", {"a.dat": 1000}), rx.port, secret, max_session_retries=3)
        assert not res.ok and "does not know our shared secret" in (res.error or ""), res.error
        assert "(terminal: auth)" in (res.error or ""), res.error
        assert [f["retryable"] for f in res.failures] == [False], res.failures
        assert not any((tmp_path / "dst").rglob("*"))
    finally:
        rx.stop()
