"""Issue 43, "--encrypt as fast as the CPU allows": sealed connections use AES-256-GCM where both sides' CPUs have AES
instructions (each side lists ``aes-256-gcm`` only then), else ChaCha20-Poly1305; the lists are bound by the
handshake's proofs, so nobody in the path can pick the AEAD; and a sealed block is received and opened into buffers
the connection reuses, on a real receiver, without changing what is refused."""

from __future__ import annotations

import platform
import socket
import threading
import uuid
from pathlib import Path

import pytest

from agentkit import pump, wait_until
from transfer_agent.receiving.receiver import Receiver
from transfer_agent.errors import AuthError, FStreamError, ProtocolError
from transfer_agent.sending.connector import Connector
from transfer_agent.wire import auth
from transfer_agent.wire.auth import load_secret
from transfer_agent.wire.protocol import Frame, pack_control, pack_header, recv_raw
from transfer_agent.wire.secure import (AES_GCM, CHACHA, TAG_BYTES, DataSealer, SealedBuffers, Sealer, choose_aead,
                                        hardware_aes)

X86 = platform.machine() == "x86_64"


def _open(link, fid: int, body: dict) -> Frame:
    link.send(Frame.OPEN, body, fid)
    ftype, rfid, _reply = link.recv(plain_error=True)
    assert rfid == fid
    return ftype


def _cpuinfo(tmp_path: Path, flags: str) -> str:
    p = tmp_path / "cpuinfo"
    p.write_text(f"processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme {flags} avx2\n\nprocessor\t: 1\n")
    return str(p)


@pytest.mark.skipif(not X86, reason="the flags read are x86_64's (aarch64 reads aes and pmull)")
def test_hardware_aes_needs_both_the_aes_and_the_carry_less_multiply_flags(tmp_path: Path) -> None:
    read = hardware_aes.__wrapped__  # the cached function reads /proc/cpuinfo once; here other files
    assert read(_cpuinfo(tmp_path, "aes pclmulqdq")) is True
    assert read(_cpuinfo(tmp_path, "pclmulqdq")) is False
    assert read(_cpuinfo(tmp_path, "aes")) is False
    assert read(_cpuinfo(tmp_path, "vaes")) is False  # a flag that only contains "aes" is not "aes"
    assert read(str(tmp_path / "missing")) is False


def test_the_aead_is_aes_gcm_only_when_both_sides_list_it() -> None:
    both = auth.CAPABILITIES + (AES_GCM,)
    assert choose_aead(both, both) == AES_GCM
    assert choose_aead(both, auth.CAPABILITIES) == CHACHA
    assert choose_aead(list(auth.CAPABILITIES), list(both)) == CHACHA
    with pytest.raises(ValueError, match="unknown AEAD 'aes-128-ocb'"):
        Sealer(b"k" * 32, "aes-128-ocb")


def test_this_machine_lists_aes_gcm_when_its_cpu_has_aes_instructions() -> None:
    """What a receiver and a sender started here offer: AES-GCM exactly when /proc/cpuinfo shows the flags."""
    assert (AES_GCM in auth.SERVER_CAPS) == hardware_aes() == (AES_GCM in auth.CLIENT_CAPS)


def test_buffers_are_reused_up_to_their_cap_and_fresh_above_it() -> None:
    b = SealedBuffers()
    sealed, plain = b.views(1 << 20, (1 << 20) - TAG_BYTES)
    assert (len(sealed), len(plain)) == (1 << 20, (1 << 20) - TAG_BYTES)
    again, _ = b.views(4096, 4080)
    assert again.obj is sealed.obj  # the same buffer, not a new one per block
    big, _ = b.views(SealedBuffers.KEEP + 1, SealedBuffers.KEEP + 1 - TAG_BYTES)
    assert big.obj is not sealed.obj and b.views(10, 10)[0].obj is sealed.obj  # a big block is not kept


@pytest.mark.parametrize("sender_aes,receiver_aes", [(True, True), (False, True), (True, False)],
                         ids=["both", "sender-without", "receiver-without"])
def test_a_real_receiver_opens_blocks_with_the_aead_both_listed_and_refuses_the_other(
        tmp_path: Path, secret: Path, rx: Receiver, monkeypatch, caplog, sender_aes: bool, receiver_aes: bool) -> None:
    """Both sides list AES-GCM: the receiver opens AES-GCM blocks and refuses a ChaCha20-Poly1305 block under the
    same key and nonce; one side without it: the other way round. A refused block is never written; the next data
    connection carries the file whole (the positive observation: its bytes are in the part)."""
    caps = auth.CAPABILITIES  # the lists are what the test sets, whatever this CPU is
    monkeypatch.setattr(auth, "CLIENT_CAPS", caps + (AES_GCM,) if sender_aes else caps)
    monkeypatch.setattr(auth, "SERVER_CAPS", caps + (AES_GCM,) if receiver_aes else caps)
    want = AES_GCM if sender_aes and receiver_aes else CHACHA
    other = CHACHA if want == AES_GCM else AES_GCM
    sid = uuid.uuid4().hex
    caplog.set_level("INFO", logger=rx.log.name)
    conn = Connector("127.0.0.1", rx.port, load_secret(secret), None,
                     {"session": sid, "job": "aeadjob", "attempt": 1}, encrypt=True)
    link = conn.connect_link(role="control").link
    size = 3 * 4096 + 17
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)

    def file1():
        s = rx._sessions.get(sid)
        return s and s.files.get(1)

    with link.sock:
        assert link.keys is not None and link.keys.aead == want
        # the receiver's log says which AEAD the session is sealed with
        wait_until(lambda: f"{sid[:8]} from" in caplog.text, what="the session's log line")
        assert f"sealed with {want}): job aeadjob" in caplog.text, caplog.text
        assert _open(link, 1, {"path": "a/sealed.bin", "size": size, "mtime_ns": 1,
                               "algo": "blake3-keyed"}) == Frame.OPEN_OK
        # a block sealed with the AEAD the handshake did not choose: refused before anything is written
        hs = conn.connect_link(role="data", channel=0, stream=0)
        assert hs.keys.aead == want
        header = pack_header(Frame.DATA, 1, 0, size + TAG_BYTES)
        wrong = Sealer(hs.keys.aead_c2s, other).seal(payload, header)
        hs.link.sock.sendall(header + wrong)
        hs.link.sock.settimeout(10)
        try:
            closed = hs.link.sock.recv(1) == b""
        except ConnectionResetError:
            closed = True
        hs.link.sock.close()
        assert closed, "a block sealed with the other AEAD did not close the data connection"
        _ftype, _fid, err = link.recv()
        assert err.get("kind") == "checksum" and "failed authentication" in err.get("message", ""), err
        assert file1() is not None and file1().ranges.total() == 0
        # the AEAD both listed: the block lands
        hs = conn.connect_link(role="data", channel=0, stream=1)
        sealer = DataSealer(hs.keys)
        assert sealer.aead == want
        sealed, plain = sealer.buffers.views(size + TAG_BYTES, size)
        plain[:] = payload
        sealer.seal_into(header, plain, sealed)
        hs.link.sock.sendall(header + bytes(sealed))
        wait_until(lambda: file1() is not None and file1().ranges.total() == size, what="the sealed block written")
        hs.link.sock.close()
        parts = [p for p in (tmp_path / "dst" / "a").iterdir() if p.name.startswith(".sealed.bin.")
                 and p.suffix == ".part"]
        assert len(parts) == 1 and parts[0].read_bytes()[:size] == payload


def _relay_stripping_aes(client: socket.socket, server: socket.socket) -> threading.Thread:
    """Someone in the path: forwards the client's HELLO without ``aes-256-gcm`` in its caps (re-framed, so it still
    parses), then everything as it is, both ways."""

    def run() -> None:
        import json

        ftype, fid, _off, _len, raw = recv_raw(client)
        hello = json.loads(raw)
        hello["caps"] = [c for c in hello["caps"] if c != AES_GCM]
        server.sendall(pack_control(ftype, hello, fid))
        back = threading.Thread(target=pump, args=(server, client), daemon=True)
        back.start()
        pump(client, server)
        back.join(10)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_stripping_aes_gcm_from_the_hello_in_transit_fails_the_handshake(monkeypatch) -> None:
    """A downgrade to the other AEAD needs the caps changed in transit; the proofs bind them, so the sender refuses
    the receiver's proof and nothing is sealed with an AEAD either side did not choose."""
    monkeypatch.setattr(auth, "CLIENT_CAPS", auth.CAPABILITIES + (AES_GCM,))
    monkeypatch.setattr(auth, "SERVER_CAPS", auth.CAPABILITIES + (AES_GCM,))
    secret = b"s" * 32
    cli, mid_c = socket.socketpair()
    mid_s, srv = socket.socketpair()
    relay = _relay_stripping_aes(mid_c, mid_s)
    result: dict[str, object] = {}

    def serve() -> None:
        try:
            result["hs"] = auth.server_handshake(srv, secret, peer="test")
        except FStreamError as exc:
            result["error"] = exc

    t = threading.Thread(target=serve)
    t.start()
    with cli, srv, mid_c, mid_s:
        with pytest.raises(AuthError, match="does not know our shared secret.*altered in transit"):
            auth.client_handshake(cli, secret, {"role": "control"}, encrypt=True)
        cli.shutdown(socket.SHUT_RDWR)
        t.join(10)
    relay.join(10)
    assert "hs" not in result  # the receiver never completed a handshake either
    # without the relay the same two sides agree on AES-GCM
    a, b = socket.socketpair()

    def serve_and_welcome() -> None:
        result["ok"] = hs = auth.server_handshake(b, secret, peer="test")
        hs.link.send(Frame.WELCOME, {})  # what the receiver sends once the handshake is done

    t = threading.Thread(target=serve_and_welcome)
    t.start()
    with a, b:
        hs = auth.client_handshake(a, secret, {"role": "control"}, encrypt=True)
        t.join(10)
    assert hs.keys.aead == AES_GCM and result["ok"].keys.aead == AES_GCM


def test_a_tampered_sealed_block_is_refused_by_open_into_and_counts_no_nonce() -> None:
    """``open_into`` refuses a tampered block (its buffer then holds bytes nobody may use) and does not advance the
    nonce, so the genuine block that follows still opens."""
    for aead in (AES_GCM, CHACHA):
        tx, rx_ = Sealer(b"k" * 32, aead), Sealer(b"k" * 32, aead)
        sealed = tx.seal(b"hello, sealed world", b"hdr")
        out = memoryview(bytearray(len(sealed) - TAG_BYTES))
        bad = bytearray(sealed)
        bad[0] ^= 1
        with pytest.raises(ProtocolError, match="block 1 failed authentication"):
            rx_.open_into(memoryview(bad), b"hdr", "block 1", out)
        rx_.open_into(memoryview(sealed), b"hdr", "block 1", out)
        assert bytes(out) == b"hello, sealed world"
