"""A master made a replica under a blocked read: the bus's clients read on instead of failing.

A server that becomes a replica (``REPLICAOF``, ``FAILOVER``, a failback while a Sentinel group settles) answers
every client blocked on it with ``-UNBLOCKED … instance state changed``. redis-py raised that as a plain
``ResponseError``: the Airflow trigger following a job failed its task while the transfer succeeded (the signature
of test_airflow_bus_outage.py's Sentinel failover flake). Real servers, a real demotion, both client families.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

from fstream_provider.bus.client import REDIS_UNREACHABLE, connect, connect_async
from fstream_provider.bus.embedded import RedisServer
from fstream_provider.bus.role_change import RoleChangedError, role_changed

KEY = "st-role-change"


@pytest.fixture()
def pair(tmp_path):
    servers = [RedisServer(str(tmp_path / "a")).start(), RedisServer(str(tmp_path / "b")).start()]
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


def blocked_reader(url: str, timeout: float = 30.0) -> dict:
    """A client blocked in ``XREAD`` on the server at ``url`` (``CLIENT LIST``: flag ``b``), waited for."""
    admin = connect(url, retries=0)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = [c for c in admin.client_list() if "b" in c["flags"] and c["cmd"] == "xread"]
            if got:
                return got[0]
            time.sleep(0.02)  # polling another process's state with a deadline
        raise AssertionError(f"no client blocked in XREAD on {url} within {timeout:.0f} s")
    finally:
        admin.close()


def _demote_then_write(a: RedisServer, b: RedisServer) -> str:
    """``a`` becomes a replica of ``b`` under the blocked read; an entry written on ``b`` replicates to ``a``."""
    admin_a, admin_b = connect(a.url, retries=0), connect(b.url, retries=0)
    try:
        blocked_reader(a.url)
        admin_a.execute_command("REPLICAOF", "127.0.0.1", str(b.port))
        deadline = time.monotonic() + 30
        while admin_a.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the demoted server never synced"
            time.sleep(0.02)
        return admin_b.xadd(KEY, {"k": "after the demotion"})
    finally:
        admin_a.close()
        admin_b.close()


def _read_in_thread(reader: redis.Redis) -> tuple[threading.Thread, dict]:
    """A blocked ``XREAD`` of ``KEY`` in a thread; ``got`` receives its answer (``resp``) or what it raised."""
    got: dict = {}

    def read() -> None:
        try:
            got["resp"] = reader.xread({KEY: "0-0"}, block=20000)
        except Exception as exc:  # noqa: BLE001 - the test reports what the read raised
            got["exc"] = exc

    t = threading.Thread(target=read)
    t.start()
    return t, got


def test_a_blocked_read_of_the_blocking_client_reads_on_after_its_master_became_a_replica(pair):
    a, b = pair
    reader = connect(a.url)
    t, got = _read_in_thread(reader)
    try:
        eid = _demote_then_write(a, b)
        t.join(30)
        assert "exc" not in got, got  # before: ResponseError('UNBLOCKED force unblock … (master -> replica?)')
        assert got["resp"] == [[KEY, [(eid, {"k": "after the demotion"})]]]
    finally:
        t.join(30)
        reader.close()


def test_a_blocked_read_of_the_asyncio_client_reads_on_after_its_master_became_a_replica(pair):
    a, b = pair

    async def scenario() -> tuple[str, list]:
        reader = connect_async(a.url)
        try:
            read = asyncio.ensure_future(reader.xread({KEY: "0-0"}, block=20000))
            eid = await asyncio.to_thread(_demote_then_write, a, b)
            return eid, await asyncio.wait_for(read, 30)
        finally:
            await reader.aclose()

    eid, resp = asyncio.run(scenario())
    assert resp == [[KEY, [(eid, {"k": "after the demotion"})]]]


def test_a_client_unblocked_on_purpose_still_gets_its_error(pair):
    """``CLIENT UNBLOCK id ERROR`` also answers ``-UNBLOCKED``: that one is a deliberate error, raised at once and
    not read again (the rule matches the role change's own text only)."""
    a, _ = pair
    reader = connect(a.url)
    admin = connect(a.url, retries=0)
    t, got = _read_in_thread(reader)
    try:
        blocked = blocked_reader(a.url)
        assert admin.execute_command("CLIENT", "UNBLOCK", blocked["id"], "ERROR") == 1
        t.join(30)
        exc = got.get("exc")
        assert type(exc) is redis.ResponseError and str(exc).startswith("UNBLOCKED"), got
        assert not isinstance(exc, REDIS_UNREACHABLE)
        assert int(admin.info("commandstats")["cmdstat_xread"]["calls"]) == 1  # not sent again
    finally:
        t.join(30)
        reader.close()
        admin.close()


def test_only_the_role_change_answer_is_an_outage():
    changed = redis.ResponseError("UNBLOCKED force unblock from blocking operation, instance state changed "
                                  "(master -> replica?)")
    assert role_changed(changed)
    assert not role_changed(redis.ResponseError("UNBLOCKED client unblocked via CLIENT UNBLOCK"))
    assert not role_changed(redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"))
    assert not role_changed(redis.ConnectionError("UNBLOCKED instance state changed"))  # already an outage
    assert issubclass(RoleChangedError, REDIS_UNREACHABLE)
