"""New-file detection: completeness, patterns, the Redis seen-set, and SFTP against a real SSH server on loopback."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import paramiko
import pytest

from fstream_provider.bus.keys import Keys
from fstream_provider.hooks.sftp import Scanner
from fstream_provider.watch.listing import list_local
from fstream_provider.watch.location import Location, default_scope
from fstream_provider.watch.seen import claim, unseen
from fstream_provider.watch.stability import FileStat, StabilityTracker
from agentkit import write_file as _write


def test_list_local_matches_pattern_and_skips_temps(tmp_path):
    _write(tmp_path / "a.xtc", b"1")
    _write(tmp_path / "b.txt", b"2")
    _write(tmp_path / ".c.xtc.job.1.part", b"3")  # an FStream temp: never reported
    _write(tmp_path / "d.xtc.part", b"4")
    _write(tmp_path / "sub" / "e.xtc", b"5")
    names = lambda fs: sorted(os.path.relpath(f.path, tmp_path) for f in fs)  # noqa: E731
    assert names(list_local(str(tmp_path), "*.xtc")) == ["a.xtc"]
    assert names(list_local(str(tmp_path), "*.xtc", recursive=True)) == ["a.xtc", os.path.join("sub", "e.xtc")]
    assert names(list_local(str(tmp_path), "sub/*", recursive=True)) == [os.path.join("sub", "e.xtc")]


def test_list_local_missing_directory_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        list_local(str(tmp_path / "nope"))


def test_growing_file_is_not_complete_until_it_holds_still():
    tr = StabilityTracker()
    f1 = FileStat("/d/a", 100, 10.0)
    assert tr.observe([f1], now=11) == []  # first look: unknown
    f2 = FileStat("/d/a", 200, 10.5)  # still being written
    assert tr.observe([f2], now=12) == []
    assert tr.observe([f2], now=13) == [f2]  # unchanged across two looks: complete


def test_min_age_counts_old_files_complete_on_first_look():
    tr = StabilityTracker(min_age=30)
    old, new = FileStat("/d/old", 1, 100.0), FileStat("/d/new", 1, 195.0)
    assert tr.observe([old, new], now=200.0) == [old]


def test_default_scope_is_stable_and_distinct(tmp_path):
    a = default_scope(str(tmp_path), "*.h5", False)
    assert a == default_scope(str(tmp_path) + "/", "*.h5", False)
    assert a != default_scope(str(tmp_path), "*.xtc", False)
    assert a != default_scope("sftp://u@h:22" + str(tmp_path), "*.h5", False)


def test_location_parse():
    loc = Location.parse("sftp://alice@10.0.0.1:2222/data/run%2042")
    assert (loc.host, loc.port, loc.username, loc.directory) == ("10.0.0.1", 2222, "alice", "/data/run 42")
    with pytest.raises(ValueError, match="s3://"):
        Location.parse("s3://bucket/x")


def test_seen_set_reports_each_file_once(redis_client):
    key = Keys("t-newfiles").seen("scope-a")
    files = [FileStat(f"/d/f{i}", 1, 1.0) for i in range(5)]
    assert claim(redis_client, key, files[:3]) == files[:3]
    assert claim(redis_client, key, files[:3]) == []  # a retry or a restarted watcher: nothing again
    assert unseen(redis_client, key, files) == files[3:]
    assert claim(redis_client, key, files) == files[3:]
    other = Keys("t-newfiles").seen("scope-b")  # another scope sees everything afresh
    assert claim(redis_client, other, files) == files


def test_concurrent_claimers_split_without_overlap(redis_url):
    from fstream_provider.bus.client import connect

    key = Keys("t-newfiles").seen("race")
    files = [FileStat(f"/d/f{i:04d}", 1, 1.0) for i in range(400)]
    clients = [connect(redis_url) for _ in range(4)]
    try:
        barrier = threading.Barrier(4)

        def run(c):
            barrier.wait()
            return claim(c, key, files)

        with ThreadPoolExecutor(4) as pool:
            won = list(pool.map(run, clients))
    finally:
        for c in clients:
            c.close()
    paths = [f.path for w in won for f in w]
    assert len(paths) == len(set(paths)) == 400  # every file reported exactly once across claimers


# --------------------------------------------------------------------------- SFTP on loopback


class _Server(paramiko.ServerInterface):
    def __init__(self, user: str, pubkey) -> None:
        self.user, self.pubkey = user, pubkey

    def check_auth_publickey(self, username, key):
        ok = username == self.user and key.get_base64() == self.pubkey.get_base64()
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def get_allowed_auths(self, username):
        return "publickey"

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED


class _ReadOnlyFS(paramiko.SFTPServerInterface):
    """Directory listing and stat of the real local file system (all the scanner needs)."""

    def _result(self, fn):
        try:
            return fn()
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)

    def list_folder(self, path):
        def ls():
            out = []
            for name in os.listdir(path):
                attr = paramiko.SFTPAttributes.from_stat(os.lstat(os.path.join(path, name)))
                attr.filename = name
                out.append(attr)
            return out

        return self._result(ls)

    def stat(self, path):
        return self._result(lambda: paramiko.SFTPAttributes.from_stat(os.stat(path)))

    def lstat(self, path):
        return self._result(lambda: paramiko.SFTPAttributes.from_stat(os.lstat(path)))

    def canonicalize(self, path):
        return os.path.realpath(path)


@pytest.fixture
def sftp_server(tmp_path) -> Iterator[dict]:
    """A paramiko SSH/SFTP server thread on 127.0.0.1 with a fresh host key and one authorised client key."""
    host_key = paramiko.ECDSAKey.generate()
    ckey = paramiko.ECDSAKey.generate()
    key_file = str(tmp_path / "id_rsa")
    ckey.write_private_key_file(key_file)
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    port = lsock.getsockname()[1]
    known_hosts = str(tmp_path / "known_hosts")
    with open(known_hosts, "w") as f:
        f.write(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
    stop = threading.Event()
    transports: list = []

    def serve():
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except OSError:
                return
            t = paramiko.Transport(conn)
            t.add_server_key(host_key)
            t.set_subsystem_handler("sftp", paramiko.SFTPServer, _ReadOnlyFS)
            transports.append(t)
            try:
                t.start_server(server=_Server(os.environ.get("USER", "fstream"), ckey))
            except Exception:
                t.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    try:
        yield {"port": port, "key_file": key_file, "known_hosts": known_hosts,
               "user": os.environ.get("USER", "fstream"), "host_key": host_key}
    finally:
        stop.set()
        try:
            lsock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        lsock.close()
        for t in transports:
            t.close()
        th.join(timeout=5)


def test_sftp_scan_finds_complete_files_once(tmp_path, sftp_server, redis_client):
    data = tmp_path / "remote"
    _write(data / "run1.h5", b"x" * 1000)
    _write(data / "notes.txt", b"y")
    url = f"sftp://{sftp_server['user']}@127.0.0.1:{sftp_server['port']}{data}"
    sc = Scanner(Location.parse(url), pattern="*.h5", key_file=sftp_server["key_file"],
                 known_hosts=sftp_server["known_hosts"])
    try:
        tr = StabilityTracker()
        key = Keys("t-newfiles").seen(default_scope(url, "*.h5", False))
        assert tr.observe(unseen(redis_client, key, sc.scan())) == []
        stable = tr.observe(unseen(redis_client, key, sc.scan()))
        assert [(f.path, f.size) for f in stable] == [(str(data / "run1.h5"), 1000)]
        assert claim(redis_client, key, stable) == stable
        _write(data / "run2.h5", b"z" * 10)
        tr.observe(unseen(redis_client, key, sc.scan()))
        second = tr.observe(unseen(redis_client, key, sc.scan()))
        assert [f.path for f in second] == [str(data / "run2.h5")]  # run1 never again
    finally:
        sc.close()


def test_sftp_unknown_host_key_is_refused(tmp_path, sftp_server):
    other = tmp_path / "other_known_hosts"
    k = paramiko.ECDSAKey.generate()
    other.write_text(f"[127.0.0.1]:{sftp_server['port']} {k.get_name()} {k.get_base64()}\n")
    url = f"sftp://{sftp_server['user']}@127.0.0.1:{sftp_server['port']}{tmp_path}"
    sc = Scanner(Location.parse(url), key_file=sftp_server["key_file"], known_hosts=str(other))
    with pytest.raises(ConnectionError, match="127.0.0.1"):
        sc.scan()


def test_new_files_trigger_over_sftp(tmp_path, sftp_server, redis_url, monkeypatch):
    """The Airflow event trigger on an ``sftp://`` location: reports the complete file once, over real SSH."""
    import asyncio
    import tempfile

    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
    pytest.importorskip("airflow")
    from fstream_provider.triggers.new_files import FStreamNewFilesTrigger

    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", redis_url.replace("redis://", "fstream://", 1))
    data = tmp_path / "remote"
    _write(data / "shot1.xtc", b"q" * 4096)
    url = f"sftp://{sftp_server['user']}@127.0.0.1:{sftp_server['port']}{data}"
    kw = dict(path=url, pattern="*.xtc", poll_interval=0.05, ssh_key_file=sftp_server["key_file"],
              known_hosts=sftp_server["known_hosts"])

    async def first(trigger):
        async for ev in trigger.run():
            return ev.payload

    ev = asyncio.run(asyncio.wait_for(first(FStreamNewFilesTrigger(**kw)), 20))
    assert ev["files"] == [str(data / "shot1.xtc")] and ev["location"] == url and ev["bytes"] == 4096
    _write(data / "shot2.xtc", b"r")
    ev2 = asyncio.run(asyncio.wait_for(first(FStreamNewFilesTrigger(**kw)), 20))
    assert ev2["files"] == [str(data / "shot2.xtc")]
