"""A master failed over while it still answers takes writes no replica gets, then drops them (found by CI).

On a loaded host the sentinel can miss a master's PINGs for ``down-after`` ms and promote its replica while the
old master still answers. Until the sentinel makes it a replica, that master takes the agent's writes alone:
``WAIT 1`` finds no replica, and the write used to stand "with today's risk". When it was made a replica it dropped
them, and a succeeded job's event stream lacked 14 of its 64 ``committed`` records
(tests/test_airflow_under_faults.py, CI of 2026-11-29). Now the agent's event and outcome writes that no replica
acknowledged are in doubt (``WriteInDoubt``) and sent again; the events are numbered, so a batch that did stand is
not appended twice. Real servers: a master and a replica whose roles are swapped by hand, as the sentinel would.
"""

from __future__ import annotations

import contextlib
import time

import pytest

from fstream_provider.bus.client import WriteInDoubt, connect
from fstream_provider.bus.embedded import RedisServer
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.model.spec import TransferSpec
from transfer_agent.daemon.jobrun import JobRun

import authkit
from agentkit import wait_until


def _replicate(replica: RedisServer, master: RedisServer) -> None:
    """``replica`` REPLICAOF ``master``, in sync (its data replaced by the master's)."""
    c = connect(replica.url, retries=0)
    try:
        c.execute_command("REPLICAOF", "127.0.0.1", str(master.port))
        wait_until(lambda: c.info("replication").get("master_link_status") == "up", 30, "the replica in sync")
    finally:
        c.close()


def _promote(server: RedisServer) -> None:
    c = connect(server.url, retries=0)
    try:
        c.execute_command("REPLICAOF", "NO", "ONE")
    finally:
        c.close()


@pytest.fixture()
def pair(tmp_path):
    a, b = RedisServer(str(tmp_path / "a")).start(), RedisServer(str(tmp_path / "b")).start()
    try:
        for s in (a, b):  # a master starts a full sync at once, not after the default 5 s wait for more replicas
            c = connect(s.url, retries=0)
            c.config_set("repl-diskless-sync-delay", 0)
            c.close()
        _replicate(b, a)
        yield a, b
    finally:
        a.stop()
        b.stop()


@contextlib.contextmanager
def _waiting_store(master: RedisServer, namespace: str, timeout_ms: int = 100, **kw):
    """A JobStore on ``master`` whose job writes wait for one replica (``?wait_replicas=1``)."""
    client = connect(master.url + f"?wait_replicas=1&wait_timeout_ms={timeout_ms}")
    try:
        yield JobStore(client, keys=Keys(namespace), signer=authkit.signer(), **kw)
    finally:
        client.close()


def _claimed(store: JobStore) -> tuple[str, int, str]:
    job_id, _ = store.submit(TransferSpec(sources=["/x"], destination="fstream://127.0.0.1:1/y"))
    k = store.keys
    (entry_id, _), = store.client.xreadgroup(k.jobs_group(), "w", {k.jobs_stream(): ">"}, count=1)[0][1]
    claim = store.claim(job_id, entry_id, worker="w", max_deliveries=3)
    assert claim.outcome == "claimed"
    return job_id, claim.attempt, entry_id


def _committed(store: JobStore, job_id: str) -> list[str]:
    return [e["path"] for _, e in store.all_events(job_id) if e.get("kind") == "file"]


def test_events_a_demoted_master_took_alone_are_sent_again_and_land_once(pair):
    a, b = pair
    with _waiting_store(a, "doubt") as store:
        job_id, attempt, _ = _claimed(store)
        run = JobRun(job_id, attempt, "0-0")
        run.add("file", {"path": "f_000.bin", "status": "committed"})
        events, progress, first = run.take()
        assert store.publish(job_id, attempt, events, first=first) == (True, False)  # a replica has it
        assert store.replication["acknowledged"] >= 3  # submit, claim, publish

        _promote(b)  # the sentinel promoted the replica; the old master still answers
        run.add("file", {"path": "f_001.bin", "status": "committed"})
        run.add("file", {"path": "f_002.bin", "status": "committed"})
        events, progress, first = run.take()
        with pytest.raises(WriteInDoubt, match="0 of 1 replica"):  # before: it stood, acknowledged by no replica
            store.publish(job_id, attempt, events, first=first)
        run.untake(events, progress, first)
        assert _committed(store, job_id) == ["f_000.bin", "f_001.bin", "f_002.bin"]  # on the old master, for now

        _replicate(a, b)  # the sentinel makes the old master a replica: what it took alone is gone
        assert _committed(store, job_id) == ["f_000.bin"]
        _promote(a)  # and the roles back (the client follows one address here; a sentinel client would follow)
        _replicate(b, a)
        run.add("file", {"path": "f_003.bin", "status": "committed"})
        events, progress, first = run.take()
        assert first == 2 and len(events) == 3  # the batch in doubt goes out again first, with its numbers
        assert store.publish(job_id, attempt, events, first=first) == (True, False)
        assert _committed(store, job_id) == ["f_000.bin", "f_001.bin", "f_002.bin", "f_003.bin"]


def test_a_batch_in_doubt_that_stood_is_not_appended_twice(pair):
    """A replica slow to acknowledge (here: none for a while): the batch stood on the master; sent again, the bus
    finds its numbers there and appends nothing; a later batch appends only its new events."""
    a, b = pair
    with _waiting_store(a, "twice") as store:
        job_id, attempt, _ = _claimed(store)
        run = JobRun(job_id, attempt, "0-0")
        _promote(b)
        for i in range(3):
            run.add("file", {"path": f"f_{i:03d}.bin", "status": "committed"})
        events, progress, first = run.take()
        with pytest.raises(WriteInDoubt):
            store.publish(job_id, attempt, events, first=first)
        run.untake(events, progress, first)
        _replicate(b, a)  # the replica is back and has what the master took
        run.add("file", {"path": "f_003.bin", "status": "committed"})
        events, progress, first = run.take()
        assert store.publish(job_id, attempt, events, first=first) == (True, False)
        assert _committed(store, job_id) == [f"f_{i:03d}.bin" for i in range(4)]
        # a new attempt numbers from 1 again and is not mistaken for the old one's events
        store.client.hset(store.keys.job(job_id), "attempt", attempt + 1)
        assert store.publish(job_id, attempt + 1, [("file", 1.0, {"path": "again.bin"})], first=1) == (True, False)
        assert _committed(store, job_id)[-1] == "again.bin"


def test_a_replica_gone_for_longer_than_the_doubt_lets_writes_stand_until_one_acknowledges(pair):
    """A replica down for good must not stop the events: after ``in_doubt_s`` they stand as written (counted
    short, as before), and the first write a replica acknowledges again ends the doubt."""
    a, b = pair
    with _waiting_store(a, "gone", 50, in_doubt_s=1.0) as store:
        job_id, attempt, entry_id = _claimed(store)
        _promote(b)
        with pytest.raises(WriteInDoubt):
            store.publish(job_id, attempt, [("file", 1.0, {"path": "a"})], first=1)
        time.sleep(1.1)  # the doubt's window, by the monotonic clock the store reads
        assert store.publish(job_id, attempt, [("file", 1.0, {"path": "a"}), ("file", 1.0, {"path": "b"})],
                             first=1) == (True, False)
        assert store.replication["short"] == 1 and _committed(store, job_id) == ["a", "b"]
        _replicate(b, a)
        assert store.finish(job_id, attempt, entry_id, state="succeeded", result={"files": 2})
        assert store._short_since is None and store.get(job_id).state == "succeeded"
        # the doubt starts afresh: the next short write is in doubt again
        _promote(b)
        with pytest.raises(WriteInDoubt):
            store.publish(job_id, attempt, [("file", 1.0, {"path": "c"})], first=3)


def test_an_outcome_in_doubt_is_recorded_by_its_second_try(pair):
    """``finish`` that no replica acknowledged raises; sent again after it stood, it finds the job finished
    (returns False: the runner reads the job and sees its own outcome); after it was dropped, it writes it."""
    a, b = pair
    with _waiting_store(a, "outcome") as store:
        job_id, attempt, entry_id = _claimed(store)
        _promote(b)
        with pytest.raises(WriteInDoubt):
            store.finish(job_id, attempt, entry_id, state="succeeded", result={"files": 1})
        _replicate(a, b)  # dropped with the demotion
        _promote(a)
        _replicate(b, a)
        assert store.get(job_id).state == "running"
        assert store.finish(job_id, attempt, entry_id, state="succeeded", result={"files": 1})
        assert store.get(job_id).state == "succeeded"
