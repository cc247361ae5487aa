"""``fstream_provider.bus.live`` (issue 27) on a real redis-server: the overview's order, rows, sparklines and
round trips, Airflow references, the ETA/lag/deadline fields passed through, and one job's detail."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import pytest
import redis

from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.live import airflow_ref, job_detail, job_row, overview
from fstream_provider.model.spec import TransferSpec
import authkit
import serverkit
from agentkit import wait_until

ETA = {"s": 42.0, "lo": 30.5, "hi": 61.0, "rate_bps": 8e8, "basis": "bytes"}
LAG = {"oldest_s": 3.5, "p50_s": 1.25, "p99_s": 2.75, "landed": 17}
DEADLINE = {"at": 1_900_000_000.0, "target_bps": 6e8, "state": "at-risk", "message": "needs 600 Mbit/s"}


@pytest.fixture
def keys() -> Keys:
    return Keys("live")


@pytest.fixture
def store(redis_client: Any, keys: Keys) -> JobStore:
    return JobStore(redis_client, keys=keys, signer=authkit.signer())


def _spec(label: str = "run") -> TransferSpec:
    return TransferSpec(sources=["/data/" + label], destination="fstream://127.0.0.1:9/dst", tuner="fixed",
                        label=label)


class Jobs:
    """Jobs in every state, written the way JobStore's worker side writes them (claim, publish, finish)."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.entries: dict[str, str] = {}

    def submit(self, label: str, key: str | None = None) -> str:
        job_id, _ = self.store.submit(_spec(label), idempotency_key=key)
        k = self.store.keys
        for _stream, entries in self.store.client.xreadgroup(k.jobs_group(), "w", {k.jobs_stream(): ">"}) or []:
            for entry_id, fields in entries:
                self.entries[fields["job_id"]] = entry_id
        return job_id

    def run(self, job_id: str) -> int:
        claim = self.store.claim(job_id, self.entries[job_id], worker="agent-a", max_deliveries=5)
        assert claim.outcome == "claimed", claim
        return claim.attempt

    def interval(self, job_id: str, attempt: int, rec: dict, extra: list[tuple[str, dict]] = ()) -> None:
        events = [(kind, 0.0, data) for kind, data in extra] + [("interval", 0.0, rec)]
        owner, _ = self.store.publish(job_id, attempt, events, {"progress": json.dumps(rec)})
        assert owner

    def finish(self, job_id: str, attempt: int, state: str = "succeeded") -> None:
        assert self.store.finish(job_id, attempt, self.entries[job_id], state=state,
                                 result={"bytes": 1000, "throughput_bps": 8000.0, "verified_files": 3,
                                         "skipped_files": 1, "failed_files": 0})


@pytest.fixture
def jobs(store: JobStore) -> Jobs:
    return Jobs(store)


def test_airflow_ref_parses_the_operators_keys_and_nothing_else():
    assert airflow_ref("etl/manual__2026-01-01T00:00:00+00:00/copy/-1") == {
        "dag_id": "etl", "run_id": "manual__2026-01-01T00:00:00+00:00", "task_id": "copy", "map_index": -1}
    assert airflow_ref("etl/scheduled__2026-01-02T00:00:00+00:00/group.copy/7#try2") == {
        "dag_id": "etl", "run_id": "scheduled__2026-01-02T00:00:00+00:00", "task_id": "group.copy", "map_index": 7}
    assert airflow_ref("etl/r1/copy/3#try2.3")["map_index"] == 3
    for other in (None, "", "dag1/task1/2026-01-01", "k1", "a/b/c/notanumber", "a/b/c/d/1", "a/b/c/1#retry",
                  "a/b/c/1#try"):
        assert airflow_ref(other) is None, other


def test_overview_orders_running_then_queued_then_newest_finished(store, jobs, redis_client, keys):
    a = jobs.submit("a")
    b = jobs.submit("b")
    c = jobs.submit("c")
    d = jobs.submit("d")
    e = jobs.submit("e")
    jobs.finish(a, jobs.run(a), "failed")
    jobs.run(c)
    jobs.finish(d, jobs.run(d))
    snap = overview(redis_client, keys)
    assert [r["job_id"] for r in snap["jobs"]] == [c, e, b, d, a]
    assert [r["state"] for r in snap["jobs"]] == ["running", "queued", "queued", "succeeded", "failed"]
    assert [r["job_id"] for r in overview(redis_client, keys, limit=3)["jobs"]] == [c, e, b]
    row = snap["jobs"][0]
    assert (row["label"], row["worker"], row["attempt"], row["tuner"]) == ("c", "agent-a", 1, "fixed")
    assert row["sources"] == ["/data/c"] and row["destination"] == "fstream://127.0.0.1:9/dst"
    assert row["submitter"] == authkit.SUBMITTER
    finished = snap["jobs"][3]  # not the result (it holds every interval): its totals, the average rate (issue 41)
    assert finished["throughput_bps"] == 8000.0 and finished["bytes_done"] == 1000
    assert (finished["files_done"], finished["files_failed"]) == (4, 0)
    assert "intervals" not in json.loads(redis_client.hget(keys.job(d), "totals"))  # the sums, no interval record
    json.dumps(snap)  # JSON-able as it is


def test_rows_carry_airflow_refs_and_the_agents_eta_lag_deadline(store, jobs, redis_client, keys):
    mapped = jobs.submit("m", key="etl/scheduled__2026-01-02T00:00:00+00:00/copy/4#try2")
    plain = jobs.submit("p", key="etl/manual__2026-01-01T00:00:00+00:00/copy/-1")
    cli = jobs.submit("c", key="dag1/task1/2026-01-01")
    old = jobs.submit("o")
    rec = {"t": 5.0, "throughput_bps": 8e8, "cc": 4, "p": 2, "pp": 8, "files_done": 10, "files_pending": 5,
           "files_failed": 1, "files_total": 16, "bytes_done": 10_000, "bytes_total": 16_000, "target_bps": 6e8,
           "reason": "deadline target 600 Mbit/s", "clusters": {"large": {"cc": 4, "p": 2, "pp": 8}},
           "eta": ETA, "lag": LAG, "deadline": DEADLINE}
    jobs.interval(mapped, jobs.run(mapped), rec)
    jobs.interval(old, jobs.run(old), {"t": 1.0, "throughput_bps": 1e6})  # an older agent's record
    rows = {r["job_id"]: r for r in overview(redis_client, keys)["jobs"]}
    assert rows[mapped]["airflow"] == {"dag_id": "etl", "run_id": "scheduled__2026-01-02T00:00:00+00:00",
                                       "task_id": "copy", "map_index": 4}
    assert rows[plain]["airflow"]["map_index"] == -1 and rows[plain]["airflow"]["run_id"].endswith("+00:00")
    assert rows[cli]["airflow"] is None and rows[old]["airflow"] is None
    m = rows[mapped]
    assert (m["eta"], m["lag"], m["deadline"]) == (ETA, LAG, DEADLINE)
    for name, value in rec.items():
        assert m[name] == value, name
    o = rows[old]
    assert o["throughput_bps"] == 1e6 and o["t"] == 1.0
    for name in ("eta", "lag", "deadline", "cc", "bytes_total", "files_total", "reason", "clusters"):
        assert o[name] is None, name
    assert rows[plain]["throughput_bps"] is None and rows[plain]["spark"] == []  # queued: no progress yet


def test_spark_is_the_last_interval_rates_also_behind_many_file_events(store, jobs, redis_client, keys):
    job_id = jobs.submit("s")
    attempt = jobs.run(job_id)
    for i in range(40):
        files = [("file", {"path": f"d/{i}/{n}.h5", "size": 1, "status": "committed"}) for n in range(15)]
        if i == 25:
            files.append(("tuning", {"t": float(i), "reason": "cc 2 -> 4: throughput rose", "layouts": {}}))
        jobs.interval(job_id, attempt, {"t": float(i), "throughput_bps": 1e6 * (i + 1), "reason": ""}, files)
    row = overview(redis_client, keys, spark_points=30)["jobs"][0]
    assert row["spark"] == [1e6 * (i + 1) for i in range(10, 40)]
    assert row["reason"] == "cc 2 -> 4: throughput rose"  # the last non-empty one, from the tuning event
    assert overview(redis_client, keys, spark_points=5)["jobs"][0]["spark"] == [1e6 * (i + 1) for i in range(35, 40)]


def test_overview_round_trips_do_not_grow_with_the_number_of_jobs(store, jobs, redis_client, keys, monkeypatch):
    from redis.connection import AbstractConnection

    sent = [0]
    original = AbstractConnection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        sent[0] += 1
        return original(self, command, check_health)

    def add(n: int) -> None:
        for i in range(n):
            job_id = jobs.submit(f"j{i}")
            if i % 3 == 0:
                attempt = jobs.run(job_id)
                for t in range(3):
                    jobs.interval(job_id, attempt, {"t": float(t), "throughput_bps": 1e6})
            elif i % 3 == 1:
                jobs.finish(job_id, jobs.run(job_id))

    def trips() -> tuple[int, int]:
        overview(redis_client, keys)  # scripts and connections warm
        sent[0] = 0
        monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
        try:
            snap = overview(redis_client, keys)
        finally:
            monkeypatch.setattr(AbstractConnection, "send_packed_command", original)
        return sent[0], len(snap["jobs"])

    redis_client.hset(keys.agent("a1"), mapping={"name": "a1", "seen": "1"})
    redis_client.sadd(keys.agents(), "a1")
    add(3)
    few, shown = trips()
    assert shown == 3
    add(60)
    many, shown = trips()
    assert shown == 63
    assert many <= few + 1 and many <= 15, (few, many)  # +1: SCAN over a grown keyspace may take a second call


def test_agents_and_board_in_the_overview(store, jobs, redis_client, keys):
    import time

    job_id = jobs.submit("x")
    now = time.time()
    redis_client.hset(keys.agent("dtn1-1"), mapping={"name": "dtn1-1", "host": "dtn1", "pid": 4242,
                                                     "started_at": repr(now - 100), "seen": repr(now - 2.5),
                                                     "job_id": job_id, "attempt": 1})
    redis_client.pexpire(keys.agent("dtn1-1"), 10_000)
    redis_client.sadd(keys.agents(), "dtn1-1", "gone-2")  # gone-2: its heartbeat key expired
    redis_client.hset(keys.sched_tasks(), job_id, json.dumps({"state": "waiting", "agent": ""}))
    snap = overview(redis_client, keys, now=now)
    assert snap["generated_at"] == now
    a, gone = snap["agents"]
    assert (a["name"], a["host"], a["pid"], a["alive"], a["job_id"], a["attempt"]) == (
        "dtn1-1", "dtn1", 4242, True, job_id, 1)
    assert a["heartbeat_age_s"] == pytest.approx(2.5, abs=0.01)
    assert gone["name"] == "gone-2" and gone["alive"] is False and gone["heartbeat_age_s"] is None
    assert snap["board"][job_id]["state"] == "waiting"


def test_pools_in_the_overview(redis_client, keys):
    from fstream_provider.bus.pools import StreamPools

    StreamPools(redis_client, keys).provision("dtn1", "dtn2:9000", "agent-a")
    (pool,) = overview(redis_client, keys)["pools"]
    assert (pool["src"], pool["dst"]) == ("dtn1", "dtn2:9000")
    assert pool["grants"]["agent-a"]["streams"] == pool["allocated"] > 0


def test_job_detail_files_intervals_tuning_and_continuation(store, jobs):
    assert job_detail(store, "0000000000000000") is None
    job_id = jobs.submit("d", key="etl/r1/copy/0")
    attempt = jobs.run(job_id)
    jobs.interval(job_id, attempt, {"t": 1.0, "throughput_bps": 2e8, "cc": 2, "p": 1, "pp": 4, "target_bps": None,
                                    "reason": "initial layout"}, [
        ("file", {"path": "a.h5", "source": "/data/d/a.h5", "size": 100, "status": "committed", "resumed": 0,
                  "checksum": "abc123", "algo": "xxh3_128"}),
        ("file", {"path": "b.h5", "source": "/data/d/b.h5", "size": 200, "status": "failed",
                  "reason": "checksum mismatch"}),
        ("retry", {"attempt": 1, "try": 1, "delay": 0.5, "message": "1 file failed: /data/d/b.h5: checksum mismatch"}),
        ("tuning", {"t": 1.0, "reason": "initial layout", "layouts": {"large": {"cc": 2, "p": 1, "pp": 4}}}),
    ])
    jobs.interval(job_id, attempt, {"t": 2.0, "throughput_bps": 4e8, "cc": 2, "p": 1, "pp": 4, "reason": "",
                                    "eta": ETA}, [
        ("file", {"path": "b.h5", "source": "/data/d/b.h5", "size": 200, "status": "committed", "resumed": 64}),
        ("file", {"path": "c.h5", "source": "/data/d/c.h5", "size": 300, "status": "skipped",
                  "reason": "already at destination with the same size and checksum"}),
    ])
    d = job_detail(store, job_id)
    assert d["job_id"] == job_id and d["state"] == "running" and d["done"] is None
    assert d["airflow"] == {"dag_id": "etl", "run_id": "r1", "task_id": "copy", "map_index": 0}
    assert [(r["t"], r["throughput_bps"], r["reason"]) for r in d["intervals"]] == [
        (1.0, 2e8, "initial layout"), (2.0, 4e8, "")]
    assert d["intervals"][1]["eta"] == ETA and d["eta"] == ETA
    assert d["spark"] == [2e8, 4e8] and d["reason"] == "initial layout"
    assert d["tuning"] == [{"t": 1.0, "ts": d["tuning"][0]["ts"], "reason": "initial layout",
                            "layouts": {"large": {"cc": 2, "p": 1, "pp": 4}}}]
    files = {f["path"]: f for f in d["files"]}
    assert [f["path"] for f in d["files"]] == ["a.h5", "b.h5", "c.h5"]
    assert (files["a.h5"]["status"], files["a.h5"]["checksum"], files["a.h5"]["algo"]) == ("committed", "abc123",
                                                                                           "xxh3_128")
    assert files["a.h5"]["retries"] == 0 and files["c.h5"]["retries"] == 0
    assert files["b.h5"]["status"] == "committed" and files["b.h5"]["resumed"] == 64
    assert files["b.h5"]["retries"] == 2  # its failed attempt, and the retry message naming its source
    assert files["c.h5"]["status"] == "skipped" and files["c.h5"]["size"] == 300

    last = d["events_last_id"]
    again = job_detail(store, job_id, after=last)
    assert again["intervals"] == [] and again["files"] == [] and again["events_last_id"] == last
    jobs.finish(job_id, attempt)
    end = job_detail(store, job_id, after=last)
    assert end["done"] == "succeeded" and end["events_last_id"] != last
    assert end["throughput_bps"] == 8000.0  # a finished job with its result: the average rate


def test_job_row_of_a_job_without_progress(store, jobs):
    job_id = jobs.submit("q")
    row = job_row(store.get(job_id), now=store.get(job_id).created_at + 5, spark=None)
    assert row["state"] == "queued" and row["spark"] == [] and row["age_s"] == pytest.approx(5, abs=0.01)
    assert all(row[k] is None for k in ("eta", "lag", "deadline", "throughput_bps", "cc", "reason", "worker"))


def test_overview_of_a_real_agents_running_job(redis_url, redis_client, store, keys, tmp_path):
    """A real ``Agent`` (fake data plane) running a job: alive with that job, and the job's interval events
    are the sparkline; its progress hash carries the ETA the transfer reported."""
    from transfer_agent.daemon.worker import Agent

    release = threading.Event()

    class Fake:
        def __init__(self, spec: TransferSpec, *, on_event: Any, cancel: threading.Event, **_kw: Any) -> None:
            self.on_event, self.cancel = on_event, cancel

        def run(self) -> Any:
            for i in range(5):
                self.on_event("interval", {"t": float(i), "throughput_bps": 1e7 * (i + 1), "cc": 3, "eta": ETA})
            release.wait(30)

            class R:
                ok, failures = True, []

                def to_dict(self) -> dict:
                    return {"bytes": 5, "throughput_bps": 1.0, "verified_files": 1, "skipped_files": 0,
                            "failed_files": 0, "intervals": []}
            return R()

    agent = Agent(redis_url, name="real-1", keys=keys, block_ms=50, flush_interval=0.02, poll_interval=0.05,
                  policy=authkit.policy(authkit.key_file()), rng=random.Random(1),
                  transfer_factory=lambda spec, **kw: Fake(spec, **kw))
    th = threading.Thread(target=agent.run, daemon=True)
    th.start()
    try:
        job_id, _ = store.submit(TransferSpec(sources=[str(tmp_path)], destination="fstream://127.0.0.1:1/d",
                                              tuner="fixed"))

        def running() -> dict | None:
            snap = overview(redis_client, keys)
            rows = [r for r in snap["jobs"] if r["job_id"] == job_id and len(r["spark"]) == 5]
            return snap if rows else None

        wait_until(running, 20, "the agent's job running with 5 intervals")
        snap = running()
        (row,) = snap["jobs"]
        assert row["state"] == "running" and row["worker"] == "real-1" and row["cc"] == 3 and row["eta"] == ETA
        assert row["spark"] == [1e7, 2e7, 3e7, 4e7, 5e7]
        wait_until(lambda: any(a["job_id"] == job_id for a in overview(redis_client, keys)["agents"]), 20,
                   "the heartbeat naming the job")
        (a,) = overview(redis_client, keys)["agents"]
        assert a["name"] == "real-1" and a["alive"] and a["heartbeat_age_s"] < 10
    finally:
        release.set()
        agent.stop()
        th.join(10)


def test_status_json_carries_the_live_rows(store, jobs, redis_url, capsys):
    """``fstream status --json``: the list keeps its ``jobs`` (``to_dict``) and adds the overview's rows under
    ``live``; one job adds its row."""
    from transfer_agent.cli.main import main

    queued = jobs.submit("q")
    running = jobs.submit("r", key="etl/r1/copy/2#try3")
    jobs.interval(running, jobs.run(running), {"t": 2.0, "throughput_bps": 5e8, "eta": ETA, "lag": LAG,
                                               "deadline": DEADLINE})
    ns = ("--redis", redis_url, "--namespace", store.keys.namespace)
    assert main(["status", "--json", *ns]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [j["job_id"] for j in out["jobs"]] == [running, queued] and out["jobs"][0]["spec"]["sources"] == ["/data/r"]
    assert [r["job_id"] for r in out["live"]] == [running, queued]
    live = out["live"][0]
    assert (live["eta"], live["lag"], live["deadline"], live["throughput_bps"]) == (ETA, LAG, DEADLINE, 5e8)
    assert live["airflow"] == {"dag_id": "etl", "run_id": "r1", "task_id": "copy", "map_index": 2}
    assert main(["status", running, "--json", *ns]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["state"] == "running" and one["progress"]["eta"] == ETA  # the old keys stay
    assert one["live"]["eta"] == ETA and one["live"]["deadline"]["state"] == "at-risk"


def test_it_only_reads_what_the_viewer_role_may_and_the_submitter_role_sees_jobs(store, jobs, redis_client,
                                                                                 redis_url, keys):
    """The viewer ACL user (``@read`` only, no scripts) reads the whole overview and a job's detail; the
    submitter user (Airflow's connection) reads jobs and agents, and the overview names the pools and board
    it may not read instead of failing."""
    from fstream_provider.bus.acl import acl_rules
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.pools import StreamPools

    job_id = jobs.submit("v")
    jobs.interval(job_id, jobs.run(job_id), {"t": 1.0, "throughput_bps": 3e8, "eta": ETA},
                  [("file", {"path": "v.h5", "size": 1, "status": "committed"})])
    StreamPools(redis_client, keys).provision("dtn1", "dtn2", "agent-a")
    redis_client.hset(keys.sched_tasks(), job_id, json.dumps({"state": "running"}))
    users = {}
    for role in ("viewer", "submitter"):
        who = authkit.SUBMITTER if role == "submitter" else None  # issue 40: a submitter user is one submitter's
        redis_client.execute_command("ACL", "SETUSER", f"{role}-u",
                                     *acl_rules(role, keys.namespace, serverkit.chosen_version(), submitter=who),
                                     f">{role}-pw-0123456789")
        users[role] = connect(redis_url.replace("redis://", f"redis://{role}-u:{role}-pw-0123456789@"))
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            users["viewer"].hset(keys.job(job_id), "state", "failed")  # the user really is read-only
        snap = overview(users["viewer"], keys)
        assert snap["unreadable"] == [] and snap["jobs"][0]["spark"] == [3e8] and snap["jobs"][0]["eta"] == ETA
        assert snap["pools"][0]["src"] == "dtn1" and snap["board"][job_id]["state"] == "running"
        detail = job_detail(JobStore(users["viewer"], keys=keys), job_id)
        assert [f["path"] for f in detail["files"]] == ["v.h5"]
        sub = overview(users["submitter"], keys, owner=authkit.SUBMITTER)  # its own index: the facility's is not its
        assert sub["unreadable"] == ["pools", "board"] and sub["pools"] == [] and sub["board"] == {}
        assert [r["job_id"] for r in sub["jobs"]] == [job_id] and sub["jobs"][0]["spark"] == [3e8]
    finally:
        for client in users.values():
            client.close()


def test_a_spark_trail_reads_only_new_events_and_gives_the_same_sparkline(redis_client):
    """Issue 27's CPU goal: the UI re-reads the overview every 0.5 s; with a trail only events newer than the last
    read are read (the overview's sparklines spent 9 in 10 of the plugin's CPU re-reading 120 events a job)."""
    from fstream_provider.bus.live import SparkTrail, _sparks
    from fstream_provider.bus.keys import Keys

    keys = Keys("trail")
    stream = keys.job_events("j1")
    for i in range(40):
        redis_client.xadd(stream, {"kind": "interval", "ts": "0", "data": json.dumps({"throughput_bps": i})})
        redis_client.xadd(stream, {"kind": "file", "ts": "0", "data": "{}"})
    trail = SparkTrail(points=30)
    first = trail.read(redis_client, keys, ["j1"])["j1"]
    assert first[0] == [float(i) for i in range(10, 40)]
    for i in range(40, 43):
        redis_client.xadd(stream, {"kind": "interval", "ts": "0", "data": json.dumps({"throughput_bps": i,
                                                                                     "reason": f"r{i}"})})
    before = redis_client.info("commandstats").get("cmdstat_xrange", {}).get("calls", 0)
    again = trail.read(redis_client, keys, ["j1"])["j1"]
    after = redis_client.info("commandstats")["cmdstat_xrange"]["calls"]
    assert again == ([float(i) for i in range(13, 43)], "r42") == _sparks(redis_client, keys, ["j1"], 30)["j1"]
    assert after - before == 1  # one forward read, not a new backward scan
    assert trail.read(redis_client, keys, [])  == {} and trail._jobs == {}  # a job no longer running is forgotten


class CountingRedis(redis.Redis):
    """A real client to the test's redis-server that writes down every command it sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(tuple(str(a) for a in args))
        return super().execute_command(*args, **options)


def test_the_job_views_snapshot_reads_the_event_stream_once(redis_url, keys, jobs):
    """Issue 42: ``ui.sse._snapshot`` took the job's story (its newest notable events) from a second read of the
    stream (XREVRANGE) after ``job_detail`` had paged through every event; now ``job_detail`` collects it in its
    one pass, and a short page ends the paging (no read that comes back empty)."""
    from fstream_provider.ui.sse import NOTABLE, RECENT, _snapshot

    job_id = jobs.submit("story")
    attempt = jobs.run(job_id)
    for i in range(RECENT + 5):  # more notable events than the story keeps: the oldest (the claim) falls out
        jobs.interval(job_id, attempt, {"t": float(i + 1), "throughput_bps": 1e8, "reason": ""},
                      [("retry", {"attempt": 1, "try": i + 1, "delay": 0.1, "message": f"retry {i}"})])
    jobs.finish(job_id, attempt)
    client = CountingRedis.from_url(redis_url, decode_responses=True)
    try:
        detail = _snapshot(JobStore(client, keys=keys, signer=authkit.signer()), job_id)
        stream_reads = [cmd for cmd in client.sent if keys.job_events(job_id) in cmd]
        assert [cmd[0].upper() for cmd in stream_reads] == ["XREAD"], stream_reads
        every = JobStore(client, keys=keys).all_events(job_id)
    finally:
        client.close()
    newest = [eid for eid, ev in every if ev["kind"] in NOTABLE][-RECENT:]
    story = detail["recent_events"]
    assert [ev["id"] for ev in story] == newest and len(story) == RECENT
    assert story[0]["kind"] == "retry" and story[-1]["kind"] == "done"
    assert story[-1]["result"] == {"bytes": 1000, "throughput_bps": 8000.0, "verified_files": 3,
                                   "skipped_files": 1, "failed_files": 0}  # a done event's result: its totals
    assert len(detail["intervals"]) == RECENT + 5 and detail["done"] == "succeeded"
