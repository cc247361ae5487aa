"""Receiver policy (issue 32): a keyring of secrets, each key confined to its subtree of the root, with a byte quota."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentkit import make_files, part_files, send, write_secret
from transfer_agent.cli.main import main
from transfer_agent.errors import AuthError, FStreamError, ProtocolError
from transfer_agent.receiving.keyring import Keyring, ReceiverKey, load_keyring
from transfer_agent.receiving.quota import Quotas, count_tree
from transfer_agent.receiving.receiver import Receiver
from transfer_agent.sending.connector import Connector
from transfer_agent.wire import auth
from transfer_agent.wire.protocol import VERSION, ControlWriter, Frame, expect
from transfer_agent.wire.secure import ControlLink, transcript_hash

KiB, MiB = 1024, 1024 * 1024


@pytest.fixture
def secrets_dir(tmp_path: Path) -> Path:
    d = tmp_path / "keys"
    d.mkdir()
    for name in ("alpha", "beta", "default", "lcls", "q"):
        write_secret(d / name)
    return d


@pytest.fixture
def keyring(secrets_dir: Path) -> Keyring:
    def key(name: str, **kw: object) -> ReceiverKey:
        return ReceiverKey(name, auth.load_secret(secrets_dir / name), **kw)

    return Keyring([key("alpha", subtree="a"), key("beta", subtree="b"), key("default"), key("lcls", subtree="lcls"),
                    key("q", subtree="q", quota=MiB)])


@pytest.fixture
def krx(tmp_path: Path, keyring: Keyring) -> Iterator[Receiver]:
    os.makedirs(tmp_path / "dst", exist_ok=True)
    r = Receiver(listen=("127.0.0.1", 0), root=str(tmp_path / "dst"), keyring=keyring).start()
    try:
        yield r
    finally:
        r.stop()


def connector(port: int, secret_file: Path, key_id: str | None, sid: str | None = None, job: str = "job",
              attempt: int = 1) -> Connector:
    return Connector("127.0.0.1", port, auth.load_secret(secret_file), None,
                     {"session": sid or uuid.uuid4().hex, "job": job, "attempt": attempt}, key_id=key_id)


def control(port: int, secret_file: Path, key_id: str | None, **kw: object) -> tuple[ControlLink, Connector]:
    conn = connector(port, secret_file, key_id, **kw)
    return conn.connect_link(role="control").link, conn


def open_file(link: ControlLink, fid: int, path: str, size: int) -> tuple[Frame, dict]:
    link.send(Frame.OPEN, {"path": path, "size": size, "mtime_ns": 1, "algo": "blake3-keyed"}, fid)
    ftype, rfid, body = link.recv()
    assert rfid == fid
    return ftype, body


# -- subtrees ---------------------------------------------------------------------------------------
def test_key_writes_under_its_subtree(tmp_path: Path, secrets_dir: Path, krx: Receiver) -> None:
    src = make_files(tmp_path / "src", {"x.dat": 5000})
    res = send(src / "x.dat", krx.port, secrets_dir / "alpha", dest="a", key="alpha")
    assert res.ok, (res.error, res.failures)
    assert (tmp_path / "dst" / "a" / "x.dat").read_bytes() == (src / "x.dat").read_bytes()


def test_write_outside_the_subtree_is_refused_and_creates_nothing(tmp_path: Path, secrets_dir: Path,
                                                                   krx: Receiver) -> None:
    src = make_files(tmp_path / "src", {"x.dat": 5000})
    res = send(src / "x.dat", krx.port, secrets_dir / "alpha", dest="b/deep", key="alpha")
    assert not res.ok and len(res.failures) == 1
    reason = res.failures[0]["reason"]
    assert "'b/deep/x.dat': key 'alpha' may write only under 'a/'" in reason, reason
    assert res.failures[0]["retryable"] is False
    assert not (tmp_path / "dst" / "b").exists()
    assert not any((tmp_path / "dst").rglob("*"))


def test_subtree_is_matched_component_by_component(tmp_path: Path, secrets_dir: Path, krx: Receiver) -> None:
    link, _ = control(krx.port, secrets_dir / "lcls", "lcls")
    with link.sock:
        ftype, body = open_file(link, 1, "lcls2/x", 10)
        assert ftype == Frame.ERROR and body["kind"] == "refused", body
        assert "key 'lcls' may write only under 'lcls/'" in body["message"]
        ftype, body = open_file(link, 2, "lcls", 10)  # the subtree itself is not a file in it
        assert ftype == Frame.ERROR and "may write only under" in body["message"]
        ftype, body = open_file(link, 3, "lcls/run1/x", 10)
        assert ftype == Frame.OPEN_OK, body
    assert not (tmp_path / "dst" / "lcls2").exists()
    assert not (tmp_path / "dst" / "lcls").is_file()


def test_a_key_without_subtree_writes_anywhere(tmp_path: Path, secrets_dir: Path, krx: Receiver) -> None:
    link, _ = control(krx.port, secrets_dir / "default", "default")
    with link.sock:
        assert open_file(link, 1, "b/x", 10)[0] == Frame.OPEN_OK
        assert open_file(link, 2, "top.bin", 10)[0] == Frame.OPEN_OK


# -- authentication ---------------------------------------------------------------------------------
def test_wrong_secret_for_its_key_id_is_refused(tmp_path: Path, secrets_dir: Path, krx: Receiver) -> None:
    with pytest.raises(AuthError, match="does not know our shared secret"):
        control(krx.port, secrets_dir / "beta", "alpha")  # beta's secret, alpha's id
    res = send(make_files(tmp_path / "src", {"x.dat": 100}), krx.port, secrets_dir / "beta", dest="a", key="alpha",
               max_session_retries=0)
    assert not res.ok and "(terminal: auth)" in (res.error or ""), res.error
    assert not any((tmp_path / "dst").rglob("*"))
    assert krx.stats["sessions"] == 0


def test_server_checks_the_proof_with_the_named_key() -> None:
    """A client that ignores the receiver's proof and answers with another key's secret is refused by the server."""
    ring = Keyring([ReceiverKey("alpha", b"A" * 32), ReceiverKey("beta", b"B" * 32)])
    srv, cli = socket.socketpair()
    result: dict[str, object] = {}

    def serve() -> None:
        try:
            result["hs"] = auth.server_handshake(srv, secret_for=ring.secret_for, peer="test")
        except FStreamError as exc:
            result["error"] = exc

    t = threading.Thread(target=serve)
    t.start()
    with srv, cli:
        c_nonce = os.urandom(auth.NONCE_BYTES)
        hello = {"role": "control", "version": VERSION, "nonce": c_nonce.hex(), "auth": "hmac", "key": "alpha"}
        writer = ControlWriter(cli)
        writer.send(Frame.HELLO, hello)
        _t, chal = expect(cli, Frame.CHALLENGE)
        s_nonce = bytes.fromhex(chal["nonce"])
        proof = auth._proof(b"B" * 32, b"client", c_nonce, s_nonce, transcript_hash(hello, {
            k: v for k, v in chal.items() if k != "proof"}))
        writer.send(Frame.AUTH, {"proof": proof})
        with pytest.raises(AuthError, match="wrong shared secret for key 'alpha'"):
            expect(cli, Frame.WELCOME)
        t.join(10)
    assert isinstance(result.get("error"), AuthError)


def test_unknown_key_looks_like_a_wrong_secret_before_authentication(tmp_path: Path, secrets_dir: Path,
                                                                   krx: Receiver) -> None:
    """Key ids cannot be enumerated: an unknown id gets a decoy challenge and the same refusal as a wrong secret."""
    with pytest.raises(AuthError) as unknown:
        control(krx.port, secrets_dir / "alpha", "gamma")
    with pytest.raises(AuthError) as wrong:  # beta exists; alpha's secret is not its
        control(krx.port, secrets_dir / "alpha", "beta")
    assert "does not know our shared secret" in str(unknown.value)
    assert str(unknown.value) == str(wrong.value)
    assert not any(k in str(unknown.value) for k in ("alpha", "beta", "lcls", "default"))


def test_malformed_key_in_hello_is_a_protocol_error(secrets_dir: Path, krx: Receiver) -> None:
    for bad in (5, "", "x" * 65, "a/b", "caf\u00e9"):
        with socket.create_connection(("127.0.0.1", krx.port)) as s:
            with pytest.raises(ProtocolError, match="malformed HELLO: key"):
                auth.client_handshake(s, auth.load_secret(secrets_dir / "alpha"),
                                      {"role": "control", "session": "s", "job": "j", "attempt": 1, "key": bad})
    with pytest.raises(AuthError, match="not valid"):
        connector(krx.port, secrets_dir / "alpha", "a b").connect_link(role="control")


def test_hello_without_key_is_the_default_key(tmp_path: Path, secrets_dir: Path, krx: Receiver) -> None:
    link, _ = control(krx.port, secrets_dir / "default", None)
    with link.sock:
        (session,) = krx._sessions.values()
        assert session.key.key_id == "default"
    with pytest.raises(AuthError):  # alpha's secret is not the default key's
        control(krx.port, secrets_dir / "alpha", None)
    src = make_files(tmp_path / "src", {"x.dat": 1000})
    assert send(src / "x.dat", krx.port, secrets_dir / "default", dest="anywhere").ok


def test_single_secret_receiver_knows_only_default(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    assert list(rx.keyring) == ["default"]
    control(rx.port, secret, "default")[0].sock.close()
    with pytest.raises(AuthError, match="does not know our shared secret"):
        control(rx.port, secret, "other")


# -- data connections -------------------------------------------------------------------------------
def test_data_connection_with_another_key_than_its_session_is_refused(tmp_path: Path, secrets_dir: Path,
                                                                      krx: Receiver) -> None:
    sid = uuid.uuid4().hex
    link, own = control(krx.port, secrets_dir / "alpha", "alpha", sid=sid)
    with link.sock:
        with pytest.raises(ProtocolError, match="data connection authenticated with key 'beta' for a session "
                                                "of key 'alpha'"):
            connector(krx.port, secrets_dir / "beta", "beta", sid=sid).connect(role="data", channel=1, stream=0)
        own.connect(role="data", channel=1, stream=0).close()  # the session's own key is fine
        assert open_file(link, 1, "a/x", 10)[0] == Frame.OPEN_OK  # and the session lives on
    assert krx.stats["sessions"] == 1


def test_jobs_are_named_per_key(secrets_dir: Path, krx: Receiver) -> None:
    """Another key's sender cannot make a job stale by reusing its name with a higher attempt."""
    control(krx.port, secrets_dir / "alpha", "alpha", job="j", attempt=1)[0].sock.close()
    control(krx.port, secrets_dir / "beta", "beta", job="j", attempt=9)[0].sock.close()
    link, _ = control(krx.port, secrets_dir / "alpha", "alpha", job="j", attempt=1)
    with link.sock:
        assert open_file(link, 1, "a/j", 10)[0] == Frame.OPEN_OK


# -- quotas -----------------------------------------------------------------------------------------
def test_quota_lands_one_file_and_refuses_the_next(tmp_path: Path, secrets_dir: Path, krx: Receiver) -> None:
    src = make_files(tmp_path / "src", {"one.bin": 600 * KiB, "two.bin": 600 * KiB, "new/three.bin": 600 * KiB})
    assert send(src / "one.bin", krx.port, secrets_dir / "q", dest="q", key="q").ok
    res = send(src / "two.bin", krx.port, secrets_dir / "q", dest="q", key="q")
    assert not res.ok and len(res.failures) == 1
    reason = res.failures[0]["reason"]
    assert "quota" in reason and "key 'q'" in reason and str(MiB) in reason and str(600 * KiB) in reason, reason
    assert res.failures[0]["retryable"] is False
    assert not part_files(tmp_path / "dst") and not (tmp_path / "dst" / "q" / "two.bin").exists()
    res = send(src / "new", krx.port, secrets_dir / "q", dest="q/new", key="q")  # a directory not there yet
    assert not res.ok and "quota" in res.failures[0]["reason"]
    assert not (tmp_path / "dst" / "q" / "new").exists()


def test_quota_is_given_back_when_a_part_is_aborted(tmp_path: Path, secrets_dir: Path, krx: Receiver) -> None:
    link, _ = control(krx.port, secrets_dir / "q", "q")
    with link.sock:
        assert open_file(link, 1, "q/big", 900 * KiB)[0] == Frame.OPEN_OK
        ftype, body = open_file(link, 2, "q/other", 200 * KiB)
        assert ftype == Frame.ERROR and "quota exceeded" in body["message"], body
        link.send(Frame.ABORT, {}, 1)
        link.send(Frame.PING, {})
        assert link.recv()[0] == Frame.PONG
        assert open_file(link, 3, "q/other", 200 * KiB)[0] == Frame.OPEN_OK


def test_quota_walk_counts_parts_and_ignores_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "q" / "d").mkdir(parents=True)
    (root / "q" / "a").write_bytes(b"x" * 100)
    (root / "q" / "d" / ".b.job.1.part").write_bytes(b"x" * 50)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "big").write_bytes(b"x" * 5000)
    (root / "q" / "link").symlink_to(tmp_path / "outside")
    (root / "q" / "flink").symlink_to(tmp_path / "outside" / "big")
    (root / "elsewhere").write_bytes(b"x" * 7)
    key = ReceiverKey("q", b"s" * 16, "q", quota=1000)
    quotas = Quotas(str(root), keys=lambda: [key])
    assert quotas.used(key) == 150
    assert count_tree(str(root), "")[0] == 157 and count_tree(str(root), "missing") == (0, {})
    assert count_tree(str(root), "q")[1] == {"q/d/.b.job.1.part": 50}
    (root / "s").symlink_to(root / "q")
    assert count_tree(str(root), "s") == (0, {})  # a subtree reached through a symlink holds nothing of the key's
    c = quotas.charge("q/new", 800)
    assert c is not None and quotas.used(key) == 950
    with pytest.raises(FStreamError, match="quota exceeded"):
        quotas.charge("q/more", 51)
    assert quotas.charge("elsewhere2", 5000) is None  # no quota covers it
    quotas.refund(c, 300)
    assert quotas.used(key) == 650


# -- the data model and the keyring file --------------------------------------------------------------
def test_receiver_key_and_keyring_rules() -> None:
    assert ReceiverKey("k", None, "lcls/").subtree == "lcls"
    k = ReceiverKey("k", b"s" * 16, "lcls")
    assert k.admits("lcls/x") and k.admits("lcls/a/b") and not k.admits("lcls2/x") and not k.admits("lcls")
    assert "s" * 16 not in repr(k)
    for bad in ({"key_id": "a b"}, {"subtree": "../x"}, {"subtree": "/abs"}, {"quota": -1}, {"quota": True}):
        with pytest.raises(FStreamError):
            ReceiverKey(**{"key_id": "k", "secret": b"s" * 16, **bad})
    ring = Keyring.single(b"s" * 16)
    assert list(ring) == ["default"] and ring.lookup("default").subtree == "" and ring.lookup("x") is None
    with pytest.raises(FStreamError, match="no secret while others do"):
        Keyring([ReceiverKey("a", b"s" * 16), ReceiverKey("b", None)])
    with pytest.raises(FStreamError, match="given twice"):
        ring.with_key(ReceiverKey("default", b"t" * 16))
    with pytest.raises(FStreamError, match="cannot be told apart"):
        Keyring([ReceiverKey("a", None), ReceiverKey("b", None)])
    with pytest.raises(FStreamError, match="not both"):
        Receiver(root="/tmp", secret=b"s" * 16, keyring=ring)


def write_keyring(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_keyring_file_loads(tmp_path: Path, secrets_dir: Path) -> None:
    ring = load_keyring(write_keyring(secrets_dir / "ring.toml", """
[keys.lcls]
secret_file = "lcls"            # relative to the keyring's directory
subtree = "lcls"
quota = "10TiB"
[keys.default]
secret_file = "%s"
""" % (secrets_dir / "default")))
    assert sorted(ring) == ["default", "lcls"]
    assert ring["lcls"] == ReceiverKey("lcls", auth.load_secret(secrets_dir / "lcls"), "lcls", 10 * 2**40)
    assert ring["default"].subtree == "" and ring["default"].quota is None


@pytest.mark.parametrize("body,names", [
    ('[keys.lcls]\nsecret_file = "lcls"\nquota = "10XB"\n', ["keys.lcls.quota", "'10XB'"]),
    ('[keys.lcls]\nsecret_file = "lcls"\nquota = -5\n', ["keys.lcls.quota", "-5"]),
    ('[keys.lcls]\nsecret_file = "lcls"\nsubtre = "lcls"\n', ["keys.lcls.subtre", "unknown field"]),
    ('[keys.lcls]\nsecret_file = "lcls"\nsubtree = "../up"\n', ["keys.lcls.subtree", "'../up'", "escapes"]),
    ('[keys.lcls]\nsecret_file = "missing"\n', ["keys.lcls.secret_file", "'missing'", "does not exist"]),
    ('[keys.lcls]\nsecret_file = "open"\n', ["keys.lcls.secret_file", "chmod 600"]),
    ('[keys."bad id"]\nsecret_file = "lcls"\n', ["keys.bad id", "not a valid key id"]),
    ('[keys.lcls]\nsecret_file = "lcls"\n[keys.tls]\nsubtree = "t"\n', ["tls", "no secret"]),
    ('[key.lcls]\nsecret_file = "lcls"\n', ["[keys.<id>]", "key"]),
    ('[keys.lcls\n', ["cannot read"]),
])
def test_keyring_file_errors_name_the_field_and_value(secrets_dir: Path, body: str, names: list[str]) -> None:
    (secrets_dir / "open").write_text("x" * 40)
    (secrets_dir / "open").chmod(0o644)
    path = write_keyring(secrets_dir / "ring.toml", body)
    with pytest.raises(FStreamError) as err:
        load_keyring(path)
    msg = str(err.value)
    assert msg.startswith(f"keyring {path}: "), msg
    for name in names:
        assert name in msg, (name, msg)


def test_cli_refuses_secret_file_when_the_keyring_has_default(tmp_path: Path, secrets_dir: Path, capsys) -> None:
    ring = write_keyring(secrets_dir / "ring.toml", '[keys.default]\nsecret_file = "default"\n')
    code = main(["receive", "--listen", "127.0.0.1:0", "--root", str(tmp_path / "dst"), "--keyring", str(ring),
                 "--secret-file", str(secrets_dir / "alpha")])
    err = capsys.readouterr().err
    assert code == 2 and "defines key 'default' already" in err and str(ring) in err, err
    ring = write_keyring(secrets_dir / "ring.toml", '[keys.lcls]\nsecret_file = "lcls"\nquota = "lots"\n')
    code = main(["receive", "--listen", "127.0.0.1:0", "--root", str(tmp_path / "dst"), "--keyring", str(ring)])
    assert code == 2 and "keys.lcls.quota = 'lots'" in capsys.readouterr().err


def test_cli_secret_file_becomes_the_default_key(tmp_path: Path, secrets_dir: Path, monkeypatch, capsys) -> None:
    seen: list[Keyring] = []

    def start(self: Receiver) -> Receiver:
        seen.append(self.keyring)
        raise FStreamError("not started in this test")

    monkeypatch.setattr(Receiver, "start", start)
    ring = write_keyring(secrets_dir / "ring.toml", '[keys.lcls]\nsecret_file = "lcls"\nsubtree = "lcls"\n')
    assert main(["receive", "--listen", "127.0.0.1:0", "--root", str(tmp_path / "dst"), "--keyring", str(ring),
                 "--secret-file", str(secrets_dir / "default")]) == 2
    assert "not started in this test" in capsys.readouterr().err
    (keys,) = seen
    assert sorted(keys) == ["default", "lcls"] and keys["lcls"].subtree == "lcls"
    assert keys["default"].secret == auth.load_secret(secrets_dir / "default") and keys["default"].subtree == ""
