"""Batched control frames (issue 29): OPENs, OPEN_OKs, COMMITs and COMMITTEDs many per frame, negotiated by the
"batch" capability, bounded, refused when malformed, and every per-file outcome kept."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentkit import make_files, part_files, send, start_receiver, trees_identical
from transfer_agent.errors import NetworkError, ProtocolError
from transfer_agent.receiving.receiver import Receiver
from transfer_agent.sending.connector import Connector
from transfer_agent.wire import auth
from transfer_agent.wire.auth import load_secret
from transfer_agent.wire.batch import BATCH_BYTES, BATCH_MAX, pack, unpack
from transfer_agent.wire.protocol import MAX_CONTROL, Frame, canonical
from transfer_agent.wire.secure import ControlLink, derive_keys

KiB = 1024
SMALL = {f"d{i % 5}/f{i}.dat": 1 + (i * 37) % (3 * KiB) for i in range(300)}


def _without_batch(caps: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(c for c in caps if c != "batch")


# -- loopback: real sender, real receiver ---------------------------------------------------------------------
def test_many_small_files_go_in_batches(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    src = make_files(tmp_path / "src", SMALL)
    res = send(src, rx.port, secret, cc=1, p=2, pp=16)
    assert res.ok, res.failures[:3]
    assert res.verified_files == len(SMALL) and res.failed_files == 0
    assert trees_identical(src, tmp_path / "dst" / "out")
    assert not part_files(tmp_path / "dst")
    st = rx.stats
    # the receiver took OPEN_BATCHes / COMMIT_BATCHes and answered with OPEN_OK_BATCHes / COMMITTED_BATCHes
    assert st["batches_received"] > 0 and st["batched_received"] >= 2 * st["batches_received"], dict(st)
    assert st["batches_sent"] > 0 and st["batched_sent"] >= 2 * st["batches_sent"], dict(st)
    # fewer frames than files each way: OPEN + COMMIT per file would be 600 requests
    frames_in = st["batches_received"] + (2 * len(SMALL) - st["batched_received"])
    assert frames_in < 1.5 * len(SMALL), dict(st)


def test_a_lone_file_goes_as_single_frames(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    """Nothing waits to fill a batch: one file is one OPEN and one COMMIT, answered by one OPEN_OK and one
    COMMITTED."""
    src = make_files(tmp_path / "src", {"one.bin": 10})
    res = send(src / "one.bin", rx.port, secret, cc=1, p=1, pp=8)
    assert res.ok and res.verified_files == 1
    assert rx.stats["batches_received"] == 0 and rx.stats["batches_sent"] == 0, dict(rx.stats)


def test_sealed_control_frames_are_batched_too(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    src = make_files(tmp_path / "src", SMALL)
    res = send(src, rx.port, secret, cc=1, p=1, pp=16, encrypt=True)
    assert res.ok, res.failures[:3]
    assert trees_identical(src, tmp_path / "dst" / "out")
    assert rx.stats["batches_received"] > 0 and rx.stats["batches_sent"] > 0


def test_a_receiver_without_batch_gets_single_frames(tmp_path: Path, secret: Path, rx: Receiver,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """An older receiver (it lists no "batch" capability) is sent, and answers, one frame per request."""
    monkeypatch.setattr(auth, "SERVER_CAPS", _without_batch(auth.SERVER_CAPS))
    src = make_files(tmp_path / "src", SMALL)
    res = send(src, rx.port, secret, cc=2, p=2, pp=16)
    assert res.ok and res.verified_files == len(SMALL), res.failures[:3]
    assert trees_identical(src, tmp_path / "dst" / "out")
    assert rx.stats["batches_received"] == 0 and rx.stats["batches_sent"] == 0, dict(rx.stats)


def test_a_sender_without_batch_gets_single_frames(tmp_path: Path, secret: Path, rx: Receiver,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "CLIENT_CAPS", _without_batch(auth.CLIENT_CAPS))
    src = make_files(tmp_path / "src", SMALL)
    res = send(src, rx.port, secret, cc=1, p=2, pp=16)
    assert res.ok and res.verified_files == len(SMALL), res.failures[:3]
    assert rx.stats["batches_received"] == 0 and rx.stats["batches_sent"] == 0, dict(rx.stats)


def test_per_file_outcomes_inside_batches(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    """A refusal in an OPEN_OK_BATCH fails that file only; a second send skips the identical files (existing
    copies answered in a batch) and sends the one that changed."""
    sizes = {f"f{i:03d}": 100 + i for i in range(60)}
    src = make_files(tmp_path / "src", sizes)
    (tmp_path / "dst" / "out" / "f007").mkdir(parents=True)  # a directory where a file should land
    res = send(src, rx.port, secret, cc=1, p=1, pp=16, max_session_retries=0)
    assert res.verified_files == 59 and res.failed_files == 1, res.failures
    assert res.failures[0]["path"].endswith("f007") and "directory of that name" in res.failures[0]["reason"]
    assert rx.stats["batches_sent"] > 0
    (tmp_path / "dst" / "out" / "f007").rmdir()
    (src / "f003").write_bytes(os.urandom(103))
    before = rx.stats["batched_sent"]
    res = send(src, rx.port, secret, cc=1, p=1, pp=16)
    assert res.ok and res.skipped_files == 58 and res.verified_files == 2, res.failures
    assert rx.stats["batched_sent"] > before
    assert trees_identical(src, tmp_path / "dst" / "out")
    assert not part_files(tmp_path / "dst")


class _CorruptOnce(Receiver):
    """Changes the digest of the first COMMIT it takes: that file's COMMITTED says "checksum", once."""

    corrupted = False

    def _request_commit(self, session, fid: int, body: dict[str, Any]) -> None:
        if not _CorruptOnce.corrupted and body.get("hash"):
            _CorruptOnce.corrupted = True
            sent = body["hash"]
            body = {**body, "hash": ("1" if sent[0] == "0" else "0") + sent[1:]}
        super()._request_commit(session, fid, body)


def test_a_checksum_mismatch_in_a_batch_is_retried_alone(tmp_path: Path, secret: Path) -> None:
    src = make_files(tmp_path / "src", SMALL)
    _CorruptOnce.corrupted = False
    r = start_receiver(tmp_path / "dst", secret, cls=_CorruptOnce)
    try:
        res = send(src, r.port, secret, cc=1, p=2, pp=16)
        assert res.ok and res.verified_files == len(SMALL), res.failures[:3]
        assert r.stats["files_checksum_mismatch"] == 1 and r.stats["batches_received"] > 0
    finally:
        r.stop()
    assert trees_identical(src, tmp_path / "dst" / "out")


# -- hostile batches on a real receiver -----------------------------------------------------------------------
def _control(port: int, secret: Path) -> ControlLink:
    conn = Connector("127.0.0.1", port, load_secret(secret), None,
                     {"session": uuid.uuid4().hex, "job": "hostile", "attempt": 1})
    link = conn.connect_link(role="control").link
    link.read_ahead()
    return link


def _open(i: int) -> list[Any]:
    return [int(Frame.OPEN), i, {"path": f"h/x{i}", "size": 1, "mtime_ns": 1, "algo": "blake3-keyed"}]


HOSTILE = [
    ({"frames": [_open(i) for i in range(1, BATCH_MAX + 2)]}, f"at most {BATCH_MAX} in one batch"),
    ({"frames": [_open(1), [int(Frame.COMMIT), 2, {"hash": "00"}]]}, "holds only OPEN frames"),
    ({"frames": [_open(1), _open(2), _open(1)]}, "file id 1 appears twice"),
    ({"frames": [_open(1), {"type": 10}]}, "entry 1 is not [type, file id, body]"),
    ({"frames": [[int(Frame.OPEN), True, {}]]}, "file id True"),
    ({"frames": [[int(Frame.OPEN), 1 << 32, {}]]}, "file id 4294967296"),
    ({"frames": [[int(Frame.OPEN), 3, ["path"]]]}, "body that is not an object"),
    ({"frames": []}, "no frames in it"),
    ({"files": [_open(1)]}, "no list of frames"),
]


@pytest.mark.parametrize("body,why", HOSTILE, ids=[w.split()[0] + str(i) for i, (_b, w) in enumerate(HOSTILE)])
def test_a_malformed_batch_ends_the_session_saying_why(tmp_path: Path, secret: Path, rx: Receiver,
                                                       body: dict[str, Any], why: str) -> None:
    link = _control(rx.port, secret)
    try:
        link.send(Frame.OPEN_BATCH, body)
        ftype, _fid, reply = link.recv()
        assert ftype == Frame.ERROR and reply["kind"] == "protocol", reply
        assert why in reply["message"] and "OPEN_BATCH" in reply["message"], reply
        with pytest.raises(NetworkError):  # and the session is closed
            link.recv()
    finally:
        link.sock.close()
    assert not list((tmp_path / "dst").rglob("*")), "nothing of a refused batch was created"


def test_a_batch_frame_beyond_max_control_is_refused_before_it_is_read(tmp_path: Path, secret: Path,
                                                                       rx: Receiver) -> None:
    link = _control(rx.port, secret)
    try:
        big = {"frames": [[int(Frame.OPEN), i, {"path": "p" * 4000 + str(i), "size": 1}] for i in range(1, 270)]}
        with pytest.raises(ProtocolError, match="too large"):  # our own side will not even send it
            link.send(Frame.OPEN_BATCH, big)
        raw = json.dumps(big).encode()
        assert len(raw) > MAX_CONTROL
        from transfer_agent.wire.protocol import pack_header

        link.sock.sendall(pack_header(Frame.OPEN_BATCH, 0, 0, len(raw)))  # a header that announces it
        ftype, _fid, reply = link.recv()
        assert ftype == Frame.ERROR and "control body" in reply["message"], reply
    finally:
        link.sock.close()


def test_a_batch_is_answered_in_one_frame_with_per_file_errors(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    link = _control(rx.port, secret)
    try:
        frames = [_open(1), [int(Frame.OPEN), 2, {"path": "../escape", "size": 1, "algo": "blake3-keyed"}], _open(3)]
        link.send(Frame.OPEN_BATCH, {"frames": frames})
        ftype, fid, reply = link.recv()
        assert (ftype, fid) == (Frame.OPEN_OK_BATCH, 0), reply
        subs = unpack(ftype, reply)
        assert [(t, i) for t, i, _b in subs] == [(Frame.OPEN_OK, 1), (Frame.ERROR, 2), (Frame.OPEN_OK, 3)]
        assert subs[0][2]["missing"] == [[0, 1]] and subs[1][2]["kind"] == "refused"
        link.send(Frame.PING, {"n": 1})  # the session goes on
        assert link.recv() == (Frame.PONG, 0, {"n": 1})
    finally:
        link.sock.close()


# -- the codec --------------------------------------------------------------------------------------------------
def test_pack_batches_consecutive_frames_and_leaves_a_lone_one_alone() -> None:
    subs = [(Frame.COMMIT, i, {"hash": f"{i:032x}"}) for i in range(1, 4)]
    assert pack(subs[:1]) == [(Frame.COMMIT, subs[0][2], 1)]
    assert pack(subs, batch=False) == [(Frame.COMMIT, b, i) for _t, i, b in subs]
    ((ftype, body, fid),) = pack(subs)
    assert (ftype, fid) == (Frame.COMMIT_BATCH, 0)
    assert isinstance(body, bytes) and body == canonical(json.loads(body))  # what the link MACs as it is
    assert unpack(ftype, json.loads(body)) == subs
    mixed = pack([(Frame.OPEN_OK, 1, {}), (Frame.ERROR, 2, {"kind": "refused"}), (Frame.COMMITTED, 3, {"ok": True}),
                  (Frame.COMMITTED, 4, {"ok": True}), (Frame.PONG, 0, {})])
    assert [t for t, _b, _i in mixed] == [Frame.OPEN_OK_BATCH, Frame.COMMITTED_BATCH, Frame.PONG]


def test_pack_bounds_count_and_bytes() -> None:
    many = [(Frame.COMMIT, i, {"hash": "ab" * 32}) for i in range(1, 3 * BATCH_MAX + 2)]
    out = pack(many)
    assert [t for t, _b, _i in out] == [Frame.COMMIT_BATCH] * 3 + [Frame.COMMIT]
    assert all(len(unpack(t, json.loads(b))) == BATCH_MAX for t, b, _i in out[:3])
    wide = [(Frame.OPEN, i, {"path": "w" * 4000 + str(i), "size": 1}) for i in range(1, 201)]
    out = pack(wide)
    assert len(out) > 1 and all(len(b) <= BATCH_BYTES + 16 for _t, b, _i in out if isinstance(b, bytes))
    assert [s for t, b, _i in out for s in unpack(t, json.loads(b))] == wide
    huge = (Frame.OPEN_OK, 5, {"missing": [[i, i + 1] for i in range(0, 120_000, 2)]})
    assert pack([(Frame.OPEN_OK, 4, {}), huge]) == [(Frame.OPEN_OK, {}, 4), (Frame.OPEN_OK, huge[2], 5)]


@pytest.mark.parametrize("encrypt", [False, True])
def test_batches_through_an_authenticated_link(encrypt: bool) -> None:
    keys = derive_keys(os.urandom(32), b"c" * 16, b"s" * 16, b"transcript", encrypt=encrypt)
    a, b = socket.socketpair()
    with a, b:
        tx, rx = ControlLink(a, keys, client=True), ControlLink(b, keys, client=False)
        rx.read_ahead()
        subs = [(Frame.OPEN, i, {"path": f"p/{i}", "size": i}) for i in range(1, 40)]
        tx.send_frames(pack(subs) + [(Frame.PING, {"n": 7}, 0)])
        ftype, fid, body = rx.recv()
        assert (ftype, fid) == (Frame.OPEN_BATCH, 0) and unpack(ftype, body) == subs
        assert rx.recv() == (Frame.PING, 0, {"n": 7})  # sequence numbers advanced frame by frame


@pytest.mark.skipif(subprocess.run(["which", "openssl"], capture_output=True).returncode != 0,
                    reason="openssl CLI not installed (needed to make test certificates)")
def test_batches_under_tls_only_and_small_files_hashed_inline(tmp_path: Path) -> None:
    """TLS without a shared secret: batch bodies go as they are (no MAC); the checksums of small files, now
    computed by the channel's driver, are the files' (the file events carry them under TLS)."""
    from fstream_provider.model.spec import TransferSpec
    from test_receiver_refusals import _make_certs
    from transfer_agent.sending.sender import Transfer
    from transfer_agent.storage.checksum import hash_fd
    from transfer_agent.wire.auth import TLSConfig

    c = _make_certs(tmp_path)
    r = Receiver(listen=("127.0.0.1", 0), root=str(tmp_path / "dst"),
                 tls=TLSConfig(c["server.pem"], c["server.key"], c["ca.pem"])).start()
    try:
        src = make_files(tmp_path / "src", SMALL)
        spec = TransferSpec.from_options([str(src)], f"fstream://127.0.0.1:{r.port}/o", tuner="fixed", cc=1, p=2,
                                         pp=16, tls_cert=c["client.pem"], tls_key=c["client.key"],
                                         tls_ca=c["ca.pem"])
        events: list = []
        res = Transfer(spec, on_event=lambda kind, data: events.append((kind, data))).run()
        assert res.ok and res.verified_files == len(SMALL), res.failures[:3]
        assert r.stats["batches_received"] > 0 and r.stats["batches_sent"] > 0
    finally:
        r.stop()
    assert trees_identical(src, tmp_path / "dst" / "o")
    files = [data for kind, data in events if kind == "file"]
    assert len(files) == len(SMALL)
    for data in files[:50]:
        fd = os.open(data["source"], os.O_RDONLY)
        try:
            assert data["algo"] == "xxh3_128" and data["checksum"] == hash_fd(fd, data["size"], "xxh3_128")
        finally:
            os.close(fd)
