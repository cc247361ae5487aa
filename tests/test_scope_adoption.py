"""A new-files scope upgraded onto issue 40's per-submitter layout carries over what it remembered
(``watch.adopt``): a real sensor poke and a real trigger on a connection with a submitter report only the files
the scope had not reported before, instead of every file again."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile

import pytest
import authkit
from fstream_provider.bus.acl import acl_rules
from fstream_provider.bus.client import connect
from fstream_provider.bus.keys import Keys
from fstream_provider.watch.adopt import adopt

K = Keys()


@pytest.fixture
def conn(redis_url, monkeypatch):
    """The default ``fstream`` connection, with the test submitter (its scopes live under ``tests:``)."""
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
    pytest.importorskip("airflow")
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT",
                       redis_url.replace("redis://", "fstream://", 1) + "?" + authkit.conn_query())
    return redis_url


def _old_scope(client, scope: str, paths: list[str], batch: dict | None = None) -> None:
    """What a scope held before issue 40 (no submitter in its keys)."""
    client.delete(K.seen(scope), K.pending(scope), K.seen(Keys.owned(authkit.SUBMITTER, scope)),
                  K.pending(Keys.owned(authkit.SUBMITTER, scope)))
    client.sadd(K.seen(scope), *paths)
    if batch:
        client.hset(K.pending(scope), mapping={k: json.dumps(v) for k, v in batch.items()})


def test_adopt_copies_once_and_never_over_a_scope_that_has_state(redis_client):
    owned = Keys.owned("lcls", "adopt-unit")
    _old_scope(redis_client, "adopt-unit", [f"/d/{i}" for i in range(2500)], {"b1": {"files": [], "claimed_at": 1}})
    redis_client.delete(K.seen(owned), K.pending(owned))
    assert adopt(redis_client, K, "adopt-unit", owned) == {"seen": 2500, "pending": 1}
    assert redis_client.scard(K.seen(owned)) == 2500 and redis_client.hkeys(K.pending(owned)) == ["b1"]
    redis_client.sadd(K.seen("adopt-unit"), "/d/late")
    assert adopt(redis_client, K, "adopt-unit", owned) == {}  # its own scope has state: never again
    assert not redis_client.sismember(K.seen(owned), "/d/late")
    assert adopt(redis_client, K, "x", "x") == {}


def test_a_submitters_own_user_cannot_read_the_old_scope_and_is_told_what_to_run(redis_server, redis_client,
                                                                                  capsys):
    _old_scope(redis_client, "adopt-acl", ["/d/a"])
    version = redis_client.info("server")["redis_version"]
    redis_client.execute_command("ACL", "SETUSER", "adopt-sub", *acl_rules("submitter", "fstream", version,
                                                                           submitter="lcls"), ">adopt-pw-0123456789")
    host_port = redis_server.url.split("//")[1].split("/")[0]
    sub = connect(f"redis://adopt-sub:adopt-pw-0123456789@{host_port}/0", retries=0)
    try:
        assert adopt(sub, K, "adopt-acl", Keys.owned("lcls", "adopt-acl")) is None
    finally:
        sub.close()
        redis_client.execute_command("ACL", "DELUSER", "adopt-sub")
    from transfer_agent.cli.main import main  # the operator's way, as a user that may read it

    assert main(["seen", "adopt", "--scope", "adopt-acl", "--submitter", "lcls", "--redis", redis_server.url]) == 0
    assert "1 seen" in capsys.readouterr().out
    assert redis_client.smembers(K.seen(Keys.owned("lcls", "adopt-acl"))) == {"/d/a"}


def test_a_sensor_on_a_submitters_connection_reports_only_what_its_scope_had_not(conn, tmp_path, redis_client):
    from fstream_provider.sensors.new_files import FStreamNewFilesSensor

    for name in ("old.dat", "new.dat"):
        (tmp_path / name).write_bytes(b"x" * 10)
    _old_scope(redis_client, "adopt-sensor", [str(tmp_path / "old.dat")])
    sensor = FStreamNewFilesSensor(task_id="files", path=str(tmp_path), pattern="*.dat", min_age=1e-9,
                                   scope="adopt-sensor", deferrable=False)
    got = sensor.poke({})
    assert got.is_done is True and got.xcom_value == [str(tmp_path / "new.dat")]
    assert redis_client.smembers(K.seen(Keys.owned(authkit.SUBMITTER, "adopt-sensor"))) == {
        str(tmp_path / "old.dat"), str(tmp_path / "new.dat")}


def test_a_trigger_on_a_submitters_connection_reports_only_what_its_scope_had_not(conn, tmp_path, redis_client):
    from fstream_provider.triggers.new_files import FStreamNewFilesTrigger

    for name in ("old.dat", "new.dat"):
        (tmp_path / name).write_bytes(b"x" * 10)
    _old_scope(redis_client, "adopt-trigger", [str(tmp_path / "old.dat")])
    trigger = FStreamNewFilesTrigger(path=str(tmp_path), pattern="*.dat", scope="adopt-trigger", min_age=1e-9,
                                     poll_interval=0.05)

    async def first():
        async for ev in trigger.run():
            return ev.payload

    payload = asyncio.run(asyncio.wait_for(first(), 20))
    assert payload["files"] == [str(tmp_path / "new.dat")] and payload["scope"] == "adopt-trigger"
    assert redis_client.sismember(K.seen(Keys.owned(authkit.SUBMITTER, "adopt-trigger")), str(tmp_path / "old.dat"))
