"""Issue 28: the triggers' follows share one reader and one client per (event loop, Redis URL).

Before, each deferred transfer task held its own Redis connection blocked in ``XREAD BLOCK``: 200 deferred
tasks, 200 connections. The connections are counted on the real server (``CLIENT LIST``), keeping those
whose address is one of this process's own sockets (psutil), so the count is this process's and nobody
else's; the test's own synchronous clients are named ``test-*`` and left out by name.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from fstream_provider.bus import client as bus_client
from fstream_provider.bus.aio_shared import CLIENTS, connection_name, name_connections
from fstream_provider.bus.embedded import RedisServer
from fstream_provider.bus.follow_async import afollow_job, job_event_reader
from fstream_provider.authz.outcome import load_signer
from fstream_provider.bus.follow_mux import MUX_BLOCK_MS, MUXES
from fstream_provider.bus.job_state import JobState
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.model.spec import TransferSpec

import authkit

NS = "t-mux"
KEYS = Keys(NS)
DEADLINE = 60.0


def _sync(url: str, name: str) -> Any:
    return name_connections(bus_client.connect(url), name)


def _mine(admin: Any, port: int) -> list[dict]:
    """``CLIENT LIST`` entries of this process's async clients: the address is one of our sockets to ``port``."""
    ours = {f"{c.laddr.ip}:{c.laddr.port}" for c in psutil.Process().net_connections("tcp")
            if c.raddr and c.raddr.port == port}
    return [c for c in admin.client_list() if c["addr"] in ours and not c.get("name", "").startswith("test-")]


def _submit(url: str, n: int, keys: Keys = KEYS) -> list[str]:
    client = _sync(url, "test-submit")
    try:
        store = JobStore(client, keys=keys, signer=authkit.signer())
        return [store.submit(TransferSpec(sources=["/a"], destination="fstream://127.0.0.1:9/x"))[0]
                for _ in range(n)]
    finally:
        client.close()


class Worker:
    """Plays the agents' side for many jobs, interleaved: claim, ``rounds`` interval events each, then done."""

    def __init__(self, url: str, job_ids: list[str], keys: Keys = KEYS) -> None:
        self.client = _sync(url, "test-writer")
        # signs the outcomes with this process's default agent key, which the triggers trust (issue 40)
        self.store = JobStore(self.client, keys=keys, outcome_signer=load_signer(None, "fake"))
        self.job_ids = job_ids
        self.claims: dict[str, tuple[Any, str]] = {}

    def claim_all(self) -> None:
        k = self.store.keys
        while len(self.claims) < len(self.job_ids):
            resp = self.client.xreadgroup(k.jobs_group(), "fake", {k.jobs_stream(): ">"}, count=500)
            for entry_id, fields in resp[0][1] if resp else []:
                if fields["job_id"] in self.job_ids:
                    c = self.store.claim(fields["job_id"], entry_id, worker="fake", max_deliveries=5)
                    self.claims[fields["job_id"]] = (c, entry_id)

    def publish(self, job_ids: list[str], step: int) -> None:
        for j in job_ids:
            c, _ = self.claims[j]
            self.store.publish(j, c.attempt, [("interval", time.time(), {"t": float(step), "files_done": step,
                                                                           "throughput_bps": 1e8})])

    def finish(self, job_ids: list[str]) -> None:
        for j in job_ids:
            c, entry_id = self.claims[j]
            self.store.finish(j, c.attempt, entry_id, state="succeeded", result={"files": 1})

    def stream(self, job_id: str) -> list[tuple[str, str]]:
        return [(eid, f["kind"]) for eid, f in self.client.xrange(self.store.keys.job_events(job_id))]

    def close(self) -> None:
        self.client.close()


async def _follow(url: str, job_id: str, got: list, *, block_ms: int = 2000, keys: Keys = KEYS) -> tuple[str, dict]:
    """``afollow_job`` through the loop's mux, with the job's state read on the loop's shared client."""
    shared = await CLIENTS.acquire(url)
    try:
        async def get_state(jid: str) -> JobState | None:
            h = await shared.hgetall(keys.job(jid))
            return JobState.from_hash(h) if h and "job_id" in h else None

        async with job_event_reader(url, keys.job_events(job_id)) as read_events:
            return await afollow_job(get_state, read_events, job_id, block_ms=block_ms,
                                     on_event=lambda eid, ev: got.append((eid, ev["kind"])))
    finally:
        await CLIENTS.release(url, shared)


async def _until(pred: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.02)  # polling state on the loop, with a deadline
    return value


class Sampler:
    """Counts this process's connections on the server every 50 ms in a thread; ``peak`` is the most seen."""

    def __init__(self, url: str, port: int) -> None:
        self.admin, self.port = _sync(url, "test-admin"), port
        self.samples: list[list[dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.samples.append(_mine(self.admin, self.port))

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.admin.close()

    @property
    def peak(self) -> int:
        return max((len(s) for s in self.samples), default=0)


def test_200_followers_on_one_loop_get_their_own_events_in_order_over_at_most_3_connections(redis_server):
    url, n = redis_server.url, 200
    job_ids = _submit(url, n)
    worker = Worker(url, job_ids)

    async def main() -> tuple[dict, dict, int, Sampler]:
        got: dict[str, list] = {j: [] for j in job_ids}
        tasks = [asyncio.create_task(_follow(url, j, got[j])) for j in job_ids]
        mux = await _until(lambda: MUXES.current(url), "the loop's mux")
        await _until(lambda: len(mux.followers) == n, "200 registered followers")
        with Sampler(url, redis_server.port) as sampler:
            await _until(lambda: len(sampler.samples) >= 5, "5 samples with every follower registered")
            registered_peak = sampler.peak
            await asyncio.to_thread(worker.claim_all)
            for step in range(3):  # every job's stream grows while all 200 follow
                await asyncio.to_thread(worker.publish, job_ids, step)
            await asyncio.to_thread(worker.finish, job_ids)
            done = dict(zip(job_ids, await asyncio.gather(*tasks)))
        assert MUXES.current(url) is None and CLIENTS.current(url) is None  # the last follower closed them
        return got, done, registered_peak, sampler

    try:
        got, done, registered_peak, sampler = asyncio.run(main())
        for j in job_ids:
            stream = worker.stream(j)
            assert [k for _, k in stream] == ["queued", "claimed", "interval", "interval", "interval", "done"]
            assert got[j] == stream, j  # exactly its own events, each once, in order, through to done
            assert done[j][0] == stream[-1][0] and done[j][1]["state"] == "succeeded"
    finally:
        worker.close()
    # the connections: the reader's and the shared client's (at most 2 commands in flight), named by role
    assert 2 <= registered_peak <= 3 and 2 <= sampler.peak <= 3, [len(s) for s in sampler.samples]
    names = {c["name"] for s in sampler.samples for c in s}
    assert names <= {connection_name("mux"), connection_name("shared")} and connection_name("mux") in names
    assert max(sum(c["name"] == connection_name("mux") for c in s) for s in sampler.samples) == 1
    assert MUXES.held() == 0 and CLIENTS.held() == 0


def test_a_follower_added_while_the_reader_is_blocked_gets_its_events(redis_server):
    url = redis_server.url
    first, late = _submit(url, 2)
    worker = Worker(url, [first, late])
    admin = _sync(url, "test-admin")

    def reader_blocked() -> bool:
        return any(c.get("name") == connection_name("mux") and "b" in c["flags"] and c["cmd"] == "xread"
                   for c in admin.client_list())

    async def main() -> tuple[list, list, int]:
        got_first, got_late = [], []
        a = asyncio.create_task(_follow(url, first, got_first))
        await _until(lambda: got_first, "the first follower's queued event")
        mux = MUXES.current(url)
        await _until(reader_blocked, "the reader blocked in XREAD on the first stream alone")
        assert list(mux.followers) == [KEYS.job_events(first)]
        b = asyncio.create_task(_follow(url, late, got_late))
        await _until(lambda: got_late, "the late follower's queued event (its own first look)")
        rounds = mux.rounds
        await asyncio.to_thread(worker.claim_all)
        await asyncio.to_thread(worker.publish, [late], 0)
        await asyncio.to_thread(worker.finish, [late])
        await asyncio.wait_for(b, DEADLINE)
        assert not a.done()  # the first one still follows
        await asyncio.to_thread(worker.finish, [first])
        await asyncio.wait_for(a, DEADLINE)
        return got_first, got_late, mux.rounds - rounds

    try:
        got_first, got_late, rounds = asyncio.run(main())
        assert got_late == worker.stream(late) and [k for _, k in got_late][-1] == "done"
        assert got_first == worker.stream(first)
        assert rounds >= 1  # the late stream's events came through the shared read
    finally:
        worker.close()
        admin.close()


def test_a_cancelled_follower_is_unregistered_and_nothing_is_left_behind(redis_server):
    url = redis_server.url
    job_ids = _submit(url, 3)
    worker = Worker(url, job_ids)
    admin = _sync(url, "test-admin")

    async def main() -> dict[str, list]:
        got: dict[str, list] = {j: [] for j in job_ids}
        tasks = {j: asyncio.create_task(_follow(url, j, got[j])) for j in job_ids}
        mux = await _until(lambda: MUXES.current(url), "the loop's mux")
        await asyncio.to_thread(worker.claim_all)
        await asyncio.to_thread(worker.publish, job_ids, 0)
        await _until(lambda: all(len(g) == 3 for g in got.values()), "queued, claimed and one interval each")
        assert len(_mine(admin, redis_server.port)) >= 2  # the reader and the shared client are connected
        victim = job_ids[0]
        tasks[victim].cancel()  # mid-stream, as the triggerer cancels a trigger
        with pytest.raises(asyncio.CancelledError):
            await tasks[victim]
        assert KEYS.job_events(victim) not in mux.followers and len(mux.followers) == 2
        await asyncio.to_thread(worker.publish, job_ids, 1)
        await asyncio.to_thread(worker.finish, job_ids)
        await asyncio.gather(*(tasks[j] for j in job_ids[1:]))
        assert MUXES.current(url) is None and CLIENTS.current(url) is None
        return got

    try:
        got = asyncio.run(main())
        assert [k for _, k in got[job_ids[0]]] == ["queued", "claimed", "interval"]  # nothing after its cancel
        for j in job_ids[1:]:
            assert got[j] == worker.stream(j)
        assert MUXES.held() == 0 and CLIENTS.held() == 0
        assert _mine(admin, redis_server.port) == []  # every connection of this process closed
    finally:
        worker.close()
        admin.close()


def test_a_redis_restart_mid_follow_resumes_from_the_last_id(tmp_path, monkeypatch):
    # A follow outlives an outage only within the client's retries (5, jittered: 0.1 to 3 s in all), as
    # before issue 28; a wider budget here so the length of the restart cannot decide the outcome.
    monkeypatch.setattr(bus_client, "connect_async", functools.partial(bus_client.connect_async, retries=40))
    server = RedisServer(str(tmp_path / "redis"), appendonly=True).start()
    url = server.url
    job_ids = _submit(url, 5)
    worker = Worker(url, job_ids)

    async def main() -> tuple[dict[str, list], dict[str, int]]:
        got: dict[str, list] = {j: [] for j in job_ids}
        tasks = [asyncio.create_task(_follow(url, j, got[j])) for j in job_ids]
        await asyncio.to_thread(worker.claim_all)
        await asyncio.to_thread(worker.publish, job_ids, 0)
        await _until(lambda: all(len(g) == 3 for g in got.values()), "the events before the restart")
        before = {j: len(g) for j, g in got.items()}
        pid = server.proc.pid
        await asyncio.to_thread(server.restart)  # same port, same AOF; the reader was blocked in XREAD
        assert server.proc.pid != pid
        await asyncio.to_thread(worker.publish, job_ids, 1)
        await asyncio.to_thread(worker.publish, job_ids, 2)
        await asyncio.to_thread(worker.finish, job_ids)
        await asyncio.gather(*tasks)
        return got, before

    try:
        got, before = asyncio.run(main())
        for j in job_ids:
            stream = worker.stream(j)
            assert [k for _, k in stream] == ["queued", "claimed", "interval", "interval", "interval", "done"]
            assert before[j] == 3 and got[j] == stream  # the rest after the restart: none lost, none twice
    finally:
        worker.close()
        server.stop()


def test_two_loops_get_two_clients_one_loop_one_and_a_loop_shutdown_closes_what_was_not_given_back(redis_server):
    url = redis_server.url
    admin = _sync(url, "test-admin")
    both_acquired = threading.Barrier(2, timeout=DEADLINE)
    seen: dict[str, Any] = {}

    async def on_a_loop(name: str) -> None:
        a, b = await CLIENTS.acquire(url), await CLIENTS.acquire(url)
        assert a is b  # one client per loop and URL
        await a.ping()
        seen[name] = a
        await asyncio.to_thread(both_acquired.wait)  # both loops hold theirs at the same time
        await CLIENTS.release(url, a)
        if name == "leaky":
            return  # one user never gives it back: the loop's shutdown closes it
        await CLIENTS.release(url, b)
        assert CLIENTS.current(url) is None

    threads = [threading.Thread(target=asyncio.run, args=(on_a_loop(n),)) for n in ("tidy", "leaky")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    try:
        assert seen["tidy"] is not seen["leaky"]  # never shared across loops
        assert CLIENTS.held() == 0
        assert [c for c in _mine(admin, redis_server.port) if c["name"] == connection_name("shared")] == []
    finally:
        admin.close()


def test_the_bounded_block_lets_a_late_stream_join_within_one_round(redis_server):
    """The reader re-issues its read at least every MUX_BLOCK_MS: a stream followed meanwhile joins then."""
    url = redis_server.url
    first, late = _submit(url, 2)
    worker = Worker(url, [first, late])

    async def main() -> float:
        got_first, got_late = [], []
        a = asyncio.create_task(_follow(url, first, got_first, block_ms=60_000))
        await _until(lambda: got_first, "the first follower")
        b = asyncio.create_task(_follow(url, late, got_late, block_ms=60_000))
        await _until(lambda: got_late, "the late follower's first look")
        await asyncio.to_thread(worker.claim_all)  # the claim of `late` is written after its first look
        t0 = time.monotonic()
        await _until(lambda: len(got_late) >= 2, "the late follower's claimed event")
        waited = time.monotonic() - t0
        await asyncio.to_thread(worker.finish, [first, late])
        await asyncio.gather(a, b)
        return waited

    try:
        waited = asyncio.run(main())
        assert waited < min(MUX_BLOCK_MS / 1000 + 1.0, 5.0)  # not its own block_ms (60 s): the shared read did
    finally:
        worker.close()


def _follow_many(url: str, groups: list[tuple[Keys, list[str], Worker]], *, expect_reads: int,
                 cluster: bool = False) -> None:
    """Follow every job of ``groups`` on one loop while their events are written: each follower gets its job's
    events; one round of the reader takes ``expect_reads`` reads (seen while every follower was registered)."""
    async def main() -> tuple[dict[str, list], int]:
        got: dict[str, list] = {j: [] for _, ids, _ in groups for j in ids}
        tasks = [asyncio.create_task(_follow(url, j, got[j], keys=keys)) for keys, ids, _ in groups for j in ids]
        mux = await _until(lambda: MUXES.current(url), "the loop's mux")
        await _until(lambda: len(mux.followers) == len(got), "every follower registered")
        reads = len(mux._groups(mux._wanted()))
        assert mux._cluster is cluster
        for _, ids, worker in groups:
            await asyncio.to_thread(worker.claim_all)
            await asyncio.to_thread(worker.publish, ids, 0)
            await asyncio.to_thread(worker.finish, ids)
        await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE)
        return got, reads

    got, reads = asyncio.run(main())
    for _, ids, worker in groups:
        for j in ids:
            assert got[j] == worker.stream(j) and [k for _, k in got[j]] == ["queued", "claimed", "interval", "done"]
    assert reads == expect_reads


def test_more_streams_than_one_read_names_are_read_in_groups(redis_server, monkeypatch):
    """Above MAX_KEYS streams the reader cuts them into several reads (non-blocking, polled): none is left out."""
    from fstream_provider.bus import follow_mux

    monkeypatch.setattr(follow_mux, "MAX_KEYS", 50)
    url = redis_server.url
    job_ids = _submit(url, 120)
    worker = Worker(url, job_ids)
    try:
        _follow_many(url, [(KEYS, job_ids, worker)], expect_reads=3)  # 50 + 50 + 20
    finally:
        worker.close()
    assert MUXES.held() == 0 and CLIENTS.held() == 0


def test_on_a_redis_cluster_each_namespace_slot_is_one_read(tmp_path):
    """``XREAD`` names keys of one slot only on a Cluster: the job event streams of a namespace share its hash
    tag, so one namespace is one read, and two namespaces on one cluster URL are two."""
    from clusterkit import RedisCluster6, find_redis_cli

    if find_redis_cli() is None:
        pytest.skip("redis-cli is not installed (Debian: redis-tools; bench/install-deps.sh installs it)")
    a, b = Keys("t-mux-a"), Keys("t-mux-b")
    with RedisCluster6(tmp_path / "cluster") as rc:
        url = rc.url
        assert rc.slot_of(a.job_events("x")) != rc.slot_of(b.job_events("x"))
        first = _submit(url, 10, a)
        w1 = Worker(url, first, a)
        try:
            _follow_many(url, [(a, first, w1)], expect_reads=1, cluster=True)
        finally:
            w1.close()
        ids_a, ids_b = _submit(url, 10, a), _submit(url, 10, b)
        wa, wb = Worker(url, ids_a, a), Worker(url, ids_b, b)
        try:
            _follow_many(url, [(a, ids_a, wa), (b, ids_b, wb)], expect_reads=2, cluster=True)
        finally:
            wa.close()
            wb.close()
    assert MUXES.held() == 0 and CLIENTS.held() == 0


def test_a_job_that_vanishes_and_a_redis_that_stays_down_end_the_follows_as_before(tmp_path, monkeypatch):
    """A flushed job ends its follow with ``JobLostError``; a Redis gone for longer than the client's retries
    fails every follower with the reader's ``ConnectionError`` (each trigger's own ``XREAD`` raised it before)."""
    import redis

    from fstream_provider.bus.job_state import JobLostError

    monkeypatch.setattr(bus_client, "connect_async", functools.partial(bus_client.connect_async, retries=1))
    server = RedisServer(str(tmp_path / "redis")).start()
    url = server.url
    lost, *others = _submit(url, 4)
    admin = _sync(url, "test-admin")

    async def main() -> tuple[BaseException, list]:
        got: dict[str, list] = {j: [] for j in (lost, *others)}
        gone = asyncio.create_task(_follow(url, lost, got[lost], block_ms=200))
        tasks = [asyncio.create_task(_follow(url, j, got[j], block_ms=60_000)) for j in others]
        await _until(lambda: all(got.values()), "every follower's queued event")
        admin.delete(KEYS.job(lost), KEYS.job_events(lost))  # flushed under it
        (vanished,) = await asyncio.gather(gone, return_exceptions=True)
        assert len(MUXES.current(url).followers) == 3  # the others still follow
        await asyncio.to_thread(server.kill)  # and Redis goes away for good
        down = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), DEADLINE)
        return vanished, down

    try:
        vanished, down = asyncio.run(main())
    finally:
        admin.close()
        server.stop()
    assert isinstance(vanished, JobLostError) and vanished.job_id == lost
    assert [type(e) for e in down] == [redis.ConnectionError] * 3, down
    assert MUXES.held() == 0 and CLIENTS.held() == 0


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "per-trigger"])
def test_deferred_transfer_triggers_share_the_reader_and_fire_once_each(redis_server, monkeypatch, mux):
    """The trigger itself, as the triggerer runs it; ``FSTREAM_FOLLOW_MUX=0`` (the benchmark's comparison) is
    the path before: a connection per trigger."""
    pytest.importorskip("airflow")
    from fstream_provider.triggers.transfer import FStreamTransferTrigger

    url, n = redis_server.url, 200 if mux else 40
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT",
                       url.replace("redis://", "fstream://", 1) + f"?namespace={NS}")
    monkeypatch.setenv("FSTREAM_FOLLOW_MUX", "1" if mux else "0")
    job_ids = _submit(url, n)
    worker = Worker(url, job_ids)

    async def first_event(trigger: FStreamTransferTrigger) -> dict:
        async for ev in trigger.run():
            return ev.payload
        raise AssertionError("the trigger returned without an event")

    async def main() -> tuple[list[dict], Sampler]:
        tasks = [asyncio.create_task(first_event(FStreamTransferTrigger(job_id=j, block_ms=1000))) for j in job_ids]
        with Sampler(url, redis_server.port) as sampler:
            if mux:
                m = await _until(lambda: MUXES.current(url), "the loop's mux")
                await _until(lambda: len(m.followers) == n, "every trigger following")
                await _until(lambda: len(sampler.samples) >= 5, "5 samples with every trigger following")
            else:
                await _until(lambda: sampler.peak >= n, f"{n} connections, one per trigger")
            await asyncio.to_thread(worker.claim_all)
            await asyncio.to_thread(worker.publish, job_ids, 0)
            await asyncio.to_thread(worker.finish, job_ids)
            events = await asyncio.gather(*tasks)
        return events, sampler

    try:
        events, sampler = asyncio.run(main())
        for j, ev in zip(job_ids, events):
            assert ev["status"] == "success" and ev["job_id"] == j and ev["last_event_id"] == worker.stream(j)[-1][0]
    finally:
        worker.close()
    if mux:
        assert 2 <= sampler.peak <= 3, [len(s) for s in sampler.samples]
        assert MUXES.held() == 0 and CLIENTS.held() == 0
    else:
        assert sampler.peak == n and all(c.get("name", "") == "" for s in sampler.samples for c in s)
