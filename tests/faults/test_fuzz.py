"""Fuzzing (issue 8): frame-header parser, frame reader/control decoder, path validator, the receiver's OPEN.

Hypothesis, bounded for CI: ``derandomize=True`` (the same examples on every run, no flakes),
``deadline=None`` (shared CI machines), at most ~200 examples per property. Properties:

- ``parse_header``: returns a valid frame type and in-limit length, or raises ``ProtocolError``.
- ``recv_frame`` over a socketpair fed arbitrary bytes: only ``ProtocolError``/``NetworkError`` escape.
- ``safe_relpath``: refuses with ``RefusedError`` or returns a relative, NFKC-normal, ``..``-free,
  control-free path inside the root; idempotent.
- a real receiver after a real handshake, fed arbitrary OPEN bodies: always answers (OPEN_OK or
  ERROR), never drops the session, leaks no descriptor, leaves no ``.part`` once the file is aborted.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import unicodedata
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from transfer_agent.errors import FStreamError, NetworkError, ProtocolError, RefusedError
from transfer_agent.storage.paths import safe_relpath
from transfer_agent.wire.protocol import HEADER, HEADER_SIZE, MAGIC, MAX_BLOCK, MAX_CONTROL, VERSION, Frame, pack_header, \
    parse_header, recv_frame

BOUNDED = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- frame header ----------------------------------------------------------------------------------------
_types = st.one_of(st.sampled_from([int(t) for t in Frame]), st.integers(0, 255))
_headers = st.one_of(
    st.binary(min_size=HEADER_SIZE, max_size=HEADER_SIZE),
    st.builds(lambda m, v, t, fid, off, ln: HEADER.pack(m, v, t, fid, off, ln),
              st.sampled_from([MAGIC, b"FX", b"\x00\x00"]), st.sampled_from([VERSION, 0, 2, 255]), _types,
              st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1),
              st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, MAX_CONTROL, MAX_CONTROL + 1, MAX_BLOCK,
                                                                     MAX_BLOCK + 1]))),
)


@BOUNDED
@given(_headers)
def test_parse_header_accepts_only_valid_headers(raw):
    try:
        ftype, fid, off, length = parse_header(raw)
    except ProtocolError:
        return
    assert isinstance(ftype, Frame)
    assert (0 < length <= MAX_BLOCK) if ftype == Frame.DATA else (length <= MAX_CONTROL)
    assert pack_header(ftype, fid, off, length) == raw  # nothing was accepted that we would not send


# -- frame reader / control decoder ----------------------------------------------------------------------
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                     max_leaves=20)


def _control(ftype: int, payload: bytes, declared: int | None = None) -> bytes:
    return HEADER.pack(MAGIC, VERSION, ftype, 0, 0, len(payload) if declared is None else declared) + payload


_streams = st.one_of(
    st.binary(max_size=4096),
    st.builds(lambda t, body: _control(t, json.dumps(body).encode()), _types, _json),
    st.builds(lambda t, raw, d: _control(t, raw, d), _types, st.binary(max_size=512),
              st.one_of(st.none(), st.integers(0, 4096))),
    st.lists(st.builds(lambda t, body: _control(t, json.dumps(body).encode()), _types, _json), max_size=5).map(
        b"".join),
)


def _read_all(data: bytes, **kw) -> list:
    """Feed ``data`` to ``recv_frame`` over a socketpair until it raises; return the frames read."""
    a, b = socket.socketpair()
    try:
        a.sendall(data)
        a.shutdown(socket.SHUT_WR)
        b.settimeout(5)
        frames = []
        while True:
            try:
                frames.append(recv_frame(b, **kw))
            except (ProtocolError, NetworkError):
                return frames
            if len(frames) > 10_000:
                raise AssertionError("recv_frame never stopped")
    finally:
        a.close()
        b.close()


@BOUNDED
@given(_streams)
def test_recv_frame_raises_only_protocol_or_network_errors(data):
    for ftype, _fid, _off, length, body in _read_all(data):
        assert isinstance(ftype, Frame)
        assert body is None if ftype == Frame.DATA else isinstance(body, dict)


@pytest.mark.parametrize("depth", [5_000, 100_000])
def test_deeply_nested_json_is_a_protocol_error_not_a_crash(depth):
    """Issue 8 defect 7: nested JSON raised RecursionError out of recv_frame (a traceback per connection).
    Now a body nested deeper than ``MAX_JSON_DEPTH`` is refused as a ``ProtocolError`` naming the nesting."""
    for opener, closer in (("[", "]"), ('{"a":', "}")):
        payload = ('{"a":' + opener * depth + "1" + closer * depth + "}").encode()
        assert len(payload) <= MAX_CONTROL
        a, b = socket.socketpair()
        writer = threading.Thread(target=lambda: (a.sendall(_control(int(Frame.OPEN), payload)),
                                                  a.shutdown(socket.SHUT_WR)), daemon=True)
        writer.start()
        try:
            b.settimeout(10)
            with pytest.raises(ProtocolError, match="(?i)deep|nest|depth"):
                recv_frame(b)
        finally:
            b.close()
            writer.join(10)
            a.close()


def test_recv_frame_max_control_bounds_a_pre_auth_body():
    """With ``max_control`` (the pre-authentication limit), a larger declared body is refused from the header
    alone, before it is read."""
    data = _control(int(Frame.HELLO), b"", declared=4097)
    a, b = socket.socketpair()
    try:
        a.sendall(data)  # nothing follows the header: reading the body would block, refusing must not
        b.settimeout(5)
        with pytest.raises(ProtocolError, match=r"4097 bytes \(limit 4096\)"):
            recv_frame(b, max_control=4096)
    finally:
        a.close()
        b.close()


# -- path validator --------------------------------------------------------------------------------------
_tricky = st.sampled_from(["..", ".", "/", "\\", "\x00", "\x1f", "\x7f", "\u2024", "\u2025", "\uff0e", "\uff0f",
                           "\u2215", "\ufe52", "\u00b7", "\u200b", "\u202e", "\udcff", "\ud800", "a", "é", "e\u0301",
                           "x" * 256, "\u3002", "~", " ", "\n", "\u0085", "\u2028"])
_paths = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=40),
    st.lists(st.one_of(_tricky, st.text(max_size=6)), max_size=8).map("".join),
    st.lists(st.one_of(_tricky, st.text(max_size=6)), min_size=1, max_size=5).map("/".join),
)


@BOUNDED
@given(_paths)
def test_safe_relpath_never_returns_an_escaping_or_unclean_path(name):
    try:
        rel = safe_relpath(name)
    except RefusedError as exc:
        assert repr(name)[:20] in str(exc) or "path" in str(exc)
        return
    assert rel and not rel.startswith("/") and "\\" not in rel and "\x00" not in rel
    assert all(unicodedata.category(c) not in ("Cc", "Cs") for c in rel)
    parts = rel.split("/")
    assert all(p not in ("", ".", "..") for p in parts)
    assert unicodedata.normalize("NFKC", rel) == rel
    rel.encode("utf-8")  # representable on disk as UTF-8
    root = "/srv/dst"
    assert os.path.normpath(os.path.join(root, rel)).startswith(root + "/")
    assert safe_relpath(rel) == rel  # idempotent


def test_safe_relpath_refuses_undecodable_names_cleanly():
    """Found by fuzzing: a lone surrogate (what ``os.fsdecode`` makes of a non-UTF-8 source name, and
    what a JSON ``"\\udcff"`` decodes to) raised UnicodeEncodeError out of ``safe_relpath`` instead of
    a refusal, so the receiver dropped the whole session with a traceback."""
    for name in ("bad\udcff.dat", "dir/\ud800", "\udc80"):
        with pytest.raises(RefusedError, match="UTF-8"):
            safe_relpath(name)


# -- the receiver's OPEN, after a real handshake ---------------------------------------------------------
def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class _OpenProbe:
    """Authenticated control sessions to a real receiver; sends one OPEN per session and reports the answer.

    Uses the sender's own ``ControlSession`` (so the frames are whatever the sender would send, MACs
    included) with a stand-in in-flight record per file id.
    """

    def __init__(self, port: int, secret: bytes) -> None:
        self.port, self.secret = port, secret

    def open(self, body: dict) -> tuple[str, dict | None, str]:
        from transfer_agent.sending.connector import Connector
        from transfer_agent.sending.control import ControlSession
        from transfer_agent.sending.inflight import InFlight

        finished: list = []
        conn = Connector("127.0.0.1", self.port, self.secret, None,
                         {"job": "fuzzjob", "attempt": 1, "session": uuid.uuid4().hex})
        cs = ControlSession(conn, finished.append, hasher=None)
        f = InFlight(None, 1, os.open(os.devnull, os.O_RDONLY), 0, 0)
        cs._files[1] = f
        try:
            cs.writer.send(Frame.OPEN, body, 1)
            assert f.opened.wait(10), f"no answer to OPEN {body!r}"
            if f.reply is not None and not f.finished.is_set():
                cs.abort(f, FStreamError("fuzz: abort after OPEN_OK"))
                outcome = "opened"
            else:
                outcome = f"refused: {f.error}"
            alive = not cs.failed.is_set()
            err = str(cs.error) if cs.error else ""
        finally:
            cs.close()
        assert alive, f"the receiver dropped the session on OPEN {body!r}: {err}"
        return outcome, f.reply, err


def _receiver(tmp_path: Path):
    from transfer_agent.wire.auth import load_secret
    from transfer_agent.receiving.receiver import Receiver

    secret = tmp_path / "secret"
    secret.write_text(os.urandom(24).hex())
    secret.chmod(0o600)
    root = tmp_path / "dst"
    root.mkdir()
    rcv = Receiver(listen=("127.0.0.1", 0), root=str(root), secret=load_secret(secret), fsync=False).start()
    return rcv, root, load_secret(secret)


_names = st.one_of(st.from_regex(r"[a-z]{1,8}(/[a-z]{1,8}){0,2}\.dat", fullmatch=True), _paths)
_sizes = st.one_of(st.integers(0, 1 << 20), st.integers(1 << 50, 2**63), st.integers(-(2**63), -1))
_well_typed_open = st.fixed_dictionaries(
    {"path": _names, "size": _sizes, "mtime_ns": st.integers(0, 2**63),
     "algo": st.one_of(st.sampled_from(["xxh3_128", "blake3", "blake3-keyed", "md5", ""]), st.text(max_size=8))},
    optional={"replace": st.booleans()})
_any_open = st.builds(lambda base, bad: {**base, **bad}, _well_typed_open.filter(lambda b: 0 <= b["size"] < 1 << 20),
                      st.dictionaries(st.sampled_from(["path", "size", "mtime_ns", "algo", "replace", "x"]), _json,
                                      min_size=1, max_size=3))


def _check_open_fuzz(tmp_path: Path, bodies, examples: int, *, both_outcomes: bool = True,
                     must_refuse: Callable[[dict], bool] = lambda body: False,
                     extra_examples: tuple[dict, ...] = ()) -> None:
    """Fuzz OPEN with ``bodies``: every answer comes on a live session, leaves no descriptor and no file;
    a body ``must_refuse`` picks out is refused."""
    rcv, root, secret = _receiver(tmp_path)
    probe = _OpenProbe(rcv.port, secret)
    try:
        probe.open({"path": "warmup.dat", "size": 1, "mtime_ns": 1, "algo": "xxh3_128"})
        base = _fds()
        seen = []

        def run(body):
            outcome, _reply, _err = probe.open(body)
            seen.append(outcome)
            if must_refuse(body):
                assert outcome.startswith("refused"), f"malformed OPEN {body!r} was accepted"
            deadline = threading.Event()
            for _ in range(200):  # sessions close on the receiver's threads: let them settle (bounded)
                if _fds() <= base and not _temps(root):
                    break
                deadline.wait(0.01)
            assert _fds() <= base, f"descriptor leak after OPEN {body!r} ({outcome}): {_fds()} > {base}"
            assert not _temps(root), f"temp left after OPEN {body!r} ({outcome}): {_temps(root)}"

        # One OPEN that must be accepted (a keyed digest in secret mode): the outcome check below needs
        # both paths exercised, and newer Hypothesis releases draw other examples from the same seed.
        run = given(bodies)(run)
        for body in ({"path": "fuzz/ok.dat", "size": 10, "mtime_ns": 1, "algo": "blake3-keyed"}, *extra_examples):
            run = example(body)(run)
        run = settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                       phases=[Phase.explicit, Phase.generate],  # no shrinking: each example is a real session
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])(run)
        run()
        if both_outcomes:
            assert any(s == "opened" for s in seen) and any(s.startswith("refused") for s in seen)
    finally:
        rcv.stop()


def _temps(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]


def test_receiver_open_fuzz_well_typed_fields(tmp_path):
    _check_open_fuzz(tmp_path, _well_typed_open, 150)


def _mistyped(body: dict) -> bool:
    """An OPEN field of the wrong JSON type (what the receiver validates before it opens anything)."""
    def is_int(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    return (not isinstance(body.get("path"), str) or not is_int(body.get("size"))
            or not is_int(body.get("mtime_ns", 0)) or not isinstance(body.get("algo", "xxh3_128"), str)
            or not isinstance(body.get("replace", False), bool))


def test_receiver_open_fuzz_any_json_fields(tmp_path):
    """Arbitrary JSON in every OPEN field (``mtime_ns: "x"``, ``size: true`` ...). Issue 8 defects 4 and 7:
    a malformed field after the part file was opened leaked its descriptor and left the ``.part``. Fixed by
    validating the whole request before opening anything: every mistyped OPEN is refused on a live session,
    and leaves no descriptor and no file behind."""
    _check_open_fuzz(tmp_path, _any_open, 150, both_outcomes=False, must_refuse=_mistyped,
                     extra_examples=({"path": "fuzz/m.dat", "size": 10, "mtime_ns": "x", "algo": "blake3-keyed"},
                                     {"path": "fuzz/b.dat", "size": True, "mtime_ns": 1, "algo": "blake3-keyed"}))


def test_struct_of_header_is_what_the_fuzzers_assume():
    assert HEADER_SIZE == struct.calcsize("!2sBBIQI") == 20
