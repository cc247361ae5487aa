"""Framing: round trips, and every kind of malformed header is refused with a reason."""

from __future__ import annotations

import socket
import struct

import pytest

from transfer_agent.errors import NetworkError, ProtocolError
from transfer_agent.wire.protocol import (HEADER, MAX_BLOCK, MAX_CONTROL, VERSION, Frame, pack_control, pack_header,
                                     parse_header, recv_frame)


def test_control_round_trip() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(pack_control(Frame.OPEN, {"path": "x/y", "size": 5}, file_id=7))
        ftype, fid, off, length, body = recv_frame(b)
        assert (ftype, fid, body) == (Frame.OPEN, 7, {"path": "x/y", "size": 5})


def test_data_header_leaves_payload() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(pack_header(Frame.DATA, 3, 4096, 5) + b"hello")
        ftype, fid, off, length, body = recv_frame(b)
        assert (ftype, fid, off, length, body) == (Frame.DATA, 3, 4096, 5, None)
        assert b.recv(5) == b"hello"


@pytest.mark.parametrize("raw,msg", [
    (HEADER.pack(b"XX", VERSION, Frame.OPEN, 0, 0, 0), "bad magic"),
    (HEADER.pack(b"FS", VERSION + 1, Frame.OPEN, 0, 0, 0), "unsupported protocol version"),
    (HEADER.pack(b"FS", VERSION, 99, 0, 0, 0), "unknown frame type"),
    (HEADER.pack(b"FS", VERSION, Frame.DATA, 1, 0, MAX_BLOCK + 1), "data block"),
    (HEADER.pack(b"FS", VERSION, Frame.DATA, 1, 0, 0), "data block"),
    (HEADER.pack(b"FS", VERSION, Frame.OPEN, 1, 0, MAX_CONTROL + 1), "control body"),
])
def test_malformed_headers_refused(raw: bytes, msg: str) -> None:
    with pytest.raises(ProtocolError, match=msg):
        parse_header(raw)


def test_truncated_frame_is_protocol_error() -> None:
    a, b = socket.socketpair()
    with b:
        a.sendall(pack_control(Frame.OPEN, {"path": "p"})[:-2])
        a.close()
        with pytest.raises(ProtocolError, match="truncated"):
            recv_frame(b)


def test_clean_close_is_network_error() -> None:
    a, b = socket.socketpair()
    a.close()
    with b, pytest.raises(NetworkError, match="closed"):
        recv_frame(b)


def test_body_must_be_json_object() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(pack_header(Frame.OPEN, 1, 0, 3) + b"[1]")
        with pytest.raises(ProtocolError, match="not an object"):
            recv_frame(b)


def test_header_is_twenty_bytes_network_order() -> None:
    raw = pack_header(Frame.DATA, 1, 2, 3)
    assert len(raw) == 20
    assert struct.unpack("!2sBBIQI", raw) == (b"FS", VERSION, Frame.DATA, 1, 2, 3)


def test_nested_json_refused_before_decoding() -> None:
    """Deep nesting is a ProtocolError naming the cause, never a RecursionError (issue 8, defect 7)."""
    from transfer_agent.wire.protocol import MAX_JSON_DEPTH, decode_body, json_depth_exceeds

    for deep in (b'{"a":' + b"[" * 100000 + b"]" * 100000 + b"}", b"{" * 5000):
        with pytest.raises(ProtocolError, match="nested too deeply"):
            decode_body(Frame.HELLO, deep)
    ok = b'{"a":' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}"
    assert decode_body(Frame.HELLO, ok)
    assert not json_depth_exceeds(b'{"s":"' + b"[" * 1000 + b'\\"{{{"}')  # brackets in strings do not count


def test_max_control_parameter() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(pack_control(Frame.HELLO, {"x": "y" * 5000}))
        with pytest.raises(ProtocolError, match="control body of .* bytes \\(limit 4096\\)"):
            recv_frame(b, 4096)


def test_mac_spliced_into_the_canonical_body() -> None:
    """The sender encodes a body once and adds the MAC as the last member (issue 13); the frame decodes to
    the body plus ``mac``, and the receiver's check over the canonical body accepts it."""
    import hmac as hmac_mod
    import json

    from transfer_agent.wire.protocol import canonical
    from transfer_agent.wire.secure import ControlLink, with_mac

    body = {"z": [1, "é"], "a": {"b": None}, "path": 'x"y'}
    spliced = with_mac(canonical(body), "00ff")
    assert json.loads(spliced) == {**body, "mac": "00ff"}
    assert json.loads(with_mac(canonical({}), "ab")) == {"mac": "ab"}

    key = bytes(range(32))
    link = ControlLink.__new__(ControlLink)
    by_bytes = link._mac(key, 7, int(Frame.OPEN), 3, canonical(body))
    assert by_bytes == link._mac(key, 7, int(Frame.OPEN), 3, body)
    expected = hmac_mod.new(key, ControlLink._aad(7, int(Frame.OPEN), 3) + canonical(body), "sha256").digest()[:16]
    assert by_bytes == expected.hex()  # the MAC every earlier sender computed: the wire format is unchanged


def _links(buffered: bool):
    import os as os_mod

    from transfer_agent.wire.secure import ControlLink, derive_keys

    keys = derive_keys(os_mod.urandom(32), b"c" * 16, b"s" * 16, b"transcript", encrypt=False)
    a, b = socket.socketpair()
    tx, rx = ControlLink(a, keys, client=True), ControlLink(b, keys, client=False)
    if buffered:
        rx.read_ahead()
    return a, b, tx, rx


@pytest.mark.parametrize("buffered", [False, True])
def test_many_pipelined_frames_in_one_read(buffered: bool) -> None:
    """Frames queued together come out one by one, in order, authenticated, through the buffer or not."""
    import threading

    a, b, tx, rx = _links(buffered)
    with a, b:
        sender = threading.Thread(target=lambda: [tx.send(Frame.OPEN_OK, {"missing": [[0, i]], "n": i} if i % 3 else {},
                                                          file_id=i) for i in range(300)])
        sender.start()
        for i in range(300):
            assert rx.recv() == (Frame.OPEN_OK, i, {"missing": [[0, i]], "n": i} if i % 3 else {})
        sender.join()


def test_buffered_frames_split_byte_by_byte() -> None:
    from transfer_agent.wire.protocol import FrameBuffer

    a, b = socket.socketpair()
    with a, b:
        data = b"".join(pack_control(Frame.COMMIT, {"hash": "ab" * i}, file_id=i) for i in range(1, 6))
        data += pack_header(Frame.DATA, 9, 0, 3) + b"xyz"
        fb = FrameBuffer(b)
        for i in range(len(data)):
            a.sendall(data[i:i + 1])
        for i in range(1, 6):
            ftype, fid, raw = fb.frame()
            assert (ftype, fid) == (Frame.COMMIT, i) and raw == b'{"hash":"' + b"ab" * i + b'"}'
        assert fb.frame()[:2] == (Frame.DATA, 9)  # a DATA frame's payload is not taken as a body


def test_buffered_reader_truncation_and_close() -> None:
    from transfer_agent.wire.protocol import FrameBuffer

    a, b = socket.socketpair()
    fb = FrameBuffer(b)
    a.sendall(pack_control(Frame.OPEN, {"path": "x"})[:-2])
    a.close()
    with pytest.raises(ProtocolError, match="truncated frame"):
        fb.frame()
    b.close()
    a, b = socket.socketpair()
    a.close()
    with b, pytest.raises(NetworkError, match="closed by peer"):
        FrameBuffer(b).frame()


def test_old_style_mac_still_accepted_and_tampering_refused() -> None:
    """A sender that put the MAC among the fields (dict order, not canonical) is still understood; a body
    changed after the MAC was computed is refused in both forms."""
    from transfer_agent.wire.protocol import canonical

    a, b, tx, rx = _links(True)
    with a, b:
        body = {"path": "z/a", "size": 3, "algo": "blake3-keyed"}
        mac = tx._mac(tx._mac_out, 0, int(Frame.OPEN), 1, body)
        a.sendall(pack_control(Frame.OPEN, {**body, "mac": mac}, 1))  # insertion order: not canonical
        assert rx.recv() == (Frame.OPEN, 1, body)
        mac = tx._mac(tx._mac_out, 1, int(Frame.OPEN), 2, body)
        forged = canonical({**body, "size": 4})[:-1] + b',"mac":"' + mac.encode() + b'"}'
        a.sendall(pack_header(Frame.OPEN, 2, 0, len(forged)) + forged)
        with pytest.raises(ProtocolError, match="failed authentication"):
            rx.recv()


def test_non_ascii_mac_is_an_authentication_failure() -> None:
    """A MAC field that is not ASCII is refused as a failed MAC (``hmac.compare_digest`` raised TypeError on
    it, which ended the connection as an unexpected error rather than a refusal)."""
    a, b, tx, rx = _links(True)
    with a, b:
        a.sendall(pack_control(Frame.OPEN, {"path": "x", "mac": "é" * 32}, 1))
        with pytest.raises(ProtocolError, match="failed authentication"):
            rx.recv()
