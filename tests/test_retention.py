"""Retention of finished jobs (issue 28): ``--job-retention`` reaches the TTLs, ``bus.retention`` finds and reclaims
what finished jobs leave behind, ``fstream gc`` reports without changing anything and reclaims with ``--apply``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import authkit
import pytest

from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.retention import reclaim, scan_pattern, survey
from fstream_provider.model.spec import TransferSpec

DAY = 86400


@pytest.fixture
def spec() -> TransferSpec:
    return TransferSpec(sources=["/data/run1/a.h5", "/data/run1/b.h5"], destination="fstream://127.0.0.1:9000/dst",
                        tuner="fixed", cc=2, label="run1")


def _finish(store: JobStore, spec: TransferSpec, key: str | None = None, state: str = "succeeded") -> str:
    """Submit a job and take it through claim -> finish as an agent does; returns its id."""
    job_id, _ = store.submit(spec, idempotency_key=key)
    k = store.keys
    (entry_id, _fields), = store.client.xreadgroup(k.jobs_group(), "w", {k.jobs_stream(): ">"}, count=1)[0][1]
    claim = store.claim(job_id, entry_id, worker="w", max_deliveries=5)
    assert claim.outcome == "claimed"
    assert store.finish(job_id, claim.attempt, entry_id, state=state, result={"files": 2})
    return job_id


def _idem(keys: Keys, key: str) -> str:
    """The Redis key of the test submitter's idempotency key ``key`` (issue 40: ``<submitter>:<key>``)."""
    return keys.idempotency(Keys.owned(authkit.SUBMITTER, key))


def _ttls(client: Any, *keys: str) -> list[int]:
    return [client.ttl(k) for k in keys]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSTREAM_")}
    return {**env, "FSTREAM_STATE_DIR": str(tmp_path / "state")}


def _fstream(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transfer_agent.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60)


def _gc(capsys: Any, *argv: str) -> tuple[int, str, str]:
    from transfer_agent.cli.main import main

    code = main(["gc", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- the option ------------------------------------------------------------------------------------
def test_the_retention_a_store_is_given_is_the_ttl_of_what_its_finished_jobs_keep(redis_client, spec):
    keys = Keys("rt")
    short = JobStore(redis_client, keys=keys, retention_s=3600, signer=authkit.signer())
    job_id = _finish(short, spec, key="dag/run/task/0")
    ttls = _ttls(redis_client, keys.job(job_id), keys.job_events(job_id), _idem(keys, "dag/run/task/0"))
    assert all(3590 <= t <= 3600 for t in ttls), ttls
    default = JobStore(redis_client, keys=keys, signer=authkit.signer())
    job_id = _finish(default, spec, key="dag/run/task/1", state="failed")
    ttls = _ttls(redis_client, keys.job(job_id), keys.job_events(job_id), _idem(keys, "dag/run/task/1"))
    assert all(7 * DAY - 10 <= t <= 7 * DAY for t in ttls), ttls
    # a queued job cancelled through a store: the canceller's retention
    job_id, _ = short.submit(spec)
    assert short.cancel(job_id)
    assert 3590 <= redis_client.ttl(keys.job(job_id)) <= 3600
    # and submit drops its submitter's index entries older than its retention, and only those (issue 40: the
    # submitter's own index; an agent's claim does the same in the facility's)
    own = keys.job_index_of(authkit.SUBMITTER)
    for index in (own, keys.job_index()):
        redis_client.zadd(index, {"old": time.time() - 7200, "recent": time.time() - 1800})
    job_id, _ = short.submit(spec)
    assert redis_client.zscore(own, "old") is None and redis_client.zscore(own, "recent") is not None
    assert redis_client.zscore(keys.job_index(), "old") is not None  # not the submitter's to trim
    short.ensure_group()
    [(_s, entries)] = redis_client.xreadgroup(keys.jobs_group(), "a1", {keys.jobs_stream(): ">"}, count=100)
    [entry_id] = [e for e, f in entries if f["job_id"] == job_id]
    assert short.claim(job_id, entry_id, worker="a1", max_deliveries=5).outcome == "claimed"
    assert redis_client.zscore(keys.job_index(), "old") is None
    assert redis_client.zscore(keys.job_index(), "recent") is not None and redis_client.zscore(keys.job_index(), job_id)


def test_zero_or_negative_retention_is_refused_naming_the_option(redis_client, tmp_path):
    for bad in (0, -5, 0.4):
        with pytest.raises(ValueError, match="job retention .*must be at least 1 s"):
            JobStore(redis_client, retention_s=bad)
    got = _fstream("agent", "--root", str(tmp_path), "--job-retention", "0s", "--redis", "redis://127.0.0.1:1/0",
                   env=_env(tmp_path))
    assert got.returncode == 2 and "--job-retention '0s': must be a positive duration" in got.stderr, got.stderr
    got = _fstream("submit", str(tmp_path), "--to", "fstream://h:1/x", "--job-retention=-1d", env=_env(tmp_path))
    assert got.returncode == 2 and "--job-retention '-1d'" in got.stderr, got.stderr
    f = tmp_path / "fstream.toml"
    f.write_text('[agent]\njob-retention = "0s"\n\n[gc]\njob-retention = "soon"\n')
    got = _fstream("config", "check", str(f), env=_env(tmp_path))
    assert got.returncode != 0
    assert '[agent] job-retention = "0s": --job-retention \'0s\': must be a positive duration' in got.stderr + got.stdout
    assert '[gc] job-retention = "soon"' in got.stderr + got.stdout


def test_the_config_file_retention_reaches_the_jobs_an_agent_finishes(redis_client, redis_url, tmp_path, spec):
    """`[agent] job-retention` in the file: the TTL of a job a real `fstream agent --once` finished (refused: the
    job is unsigned, and a refusal is a terminal state the agent writes like any other)."""
    keys = Keys("rtcfg")
    job_id, _ = JobStore(redis_client, keys=keys).submit(spec, idempotency_key="cfg-1")
    f = tmp_path / "fstream.toml"
    f.write_text(f'[redis]\nurl = "{redis_url}"\nnamespace = "rtcfg"\n\n[agent]\njob-retention = "2h"\n')
    got = _fstream("--config", str(f), "agent", "--once", "--root", str(tmp_path), env=_env(tmp_path))
    assert got.returncode == 0, got.stderr
    state = redis_client.hget(keys.job(job_id), "state")
    assert state == "failed", got.stderr
    ttls = _ttls(redis_client, keys.job(job_id), keys.job_events(job_id), keys.idempotency("cfg-1"))
    assert all(7190 <= t <= 7200 for t in ttls), ttls
    # `[cancel]` too: a queued job the command cancels
    job_id, _ = JobStore(redis_client, keys=keys).submit(spec)
    f.write_text(f'[redis]\nurl = "{redis_url}"\nnamespace = "rtcfg"\n\n[cancel]\njob-retention = "90m"\n')
    got = _fstream("--config", str(f), "cancel", job_id, env=_env(tmp_path))
    assert got.returncode == 0, got.stderr
    assert 5390 <= redis_client.ttl(keys.job(job_id)) <= 5400


# -- survey and reclaim ----------------------------------------------------------------------------
def _orphans(client: Any, keys: Keys, spec: TransferSpec) -> dict[str, Any]:
    """One of each thing ``fstream gc`` reclaims, made directly in Redis, and live jobs it must not touch."""
    store = JobStore(client, keys=keys, signer=authkit.signer())
    now = time.time()
    # (a) finished jobs whose keys lost their TTL (an older version; a crash between writes): one ended an hour
    # ago, one ended longer ago than the retention
    recent = _finish(store, spec, key="idem-recent")
    old = _finish(store, spec, key="idem-old")
    client.hset(keys.job(recent), "updated_at", repr(now - 3600))
    client.hset(keys.job(old), "updated_at", repr(now - 8 * DAY))
    for j, k in ((recent, "idem-recent"), (old, "idem-old")):
        for key in (keys.job(j), keys.job_events(j), keys.idempotency(store.scoped_idempotency(k))):
            client.persist(key)
    live, _ = store.submit(spec, idempotency_key="idem-live")  # queued, no TTL: as it should be
    # (b) an index entry of a job that is gone
    client.zadd(keys.job_index(), {"gone-index": now - 60})
    # (c) an event stream whose job is gone (an unfenced append after the job expired)
    store.append_event("gone-events", "scheduled", {"reason": "late"})
    # (d) an idempotency key naming a job that is gone
    client.set(keys.idempotency("idem-gone"), "gone-idem")
    # (e) scheduler board fields of a finished job and of a gone one; the live job's stay
    task = json.dumps({"state": "waiting"})
    client.hset(keys.sched_tasks(), mapping={recent: task, "gone-board": task, live: task})
    client.hset(keys.sched_progress(), mapping={"gone-board": "{}", live: "{}"})
    # (f) a scope's memory: an old pending batch and a seen set
    client.sadd(keys.seen("lcls/run42"), "a.h5", "b.h5", "c.h5")
    old_batch = json.dumps({"claimed_at": now - 9 * DAY, "delivered_at": now - 9 * DAY, "files": [{"path": "a.h5"}]})
    new_batch = json.dumps({"claimed_at": now - 60, "delivered_at": now - 60, "files": [{"path": "c.h5"}]})
    client.hset(keys.pending("lcls/run42"), mapping={"b-old": old_batch, "b-new": new_batch})
    return {"recent": recent, "old": old, "live": live, "now": now}


def test_survey_finds_each_kind_and_reclaim_fixes_it(redis_client, spec):
    keys, client = Keys("rtgc"), redis_client
    o = _orphans(client, keys, spec)
    other = Keys("rtgc2")  # another namespace on the same Redis: never looked at
    client.set(other.idempotency("x"), "gone")
    report = survey(client, keys, now=o["now"])
    no_ttl = {e["job_id"]: e for e in report.no_ttl}
    assert set(no_ttl) == {o["recent"], o["old"]}
    assert sorted(kind for _, kind in no_ttl[o["recent"]]["keys"]) == ["events", "idem", "job"]
    assert 7 * DAY - 3700 <= no_ttl[o["recent"]]["ttl"] <= 7 * DAY - 3500 and no_ttl[o["old"]]["ttl"] < 0
    assert report.index_orphans == ["gone-index"]
    assert report.event_orphans == [keys.job_events("gone-events")]
    assert report.idempotency_orphans == [[keys.idempotency("idem-gone"), "gone-idem"]]
    assert sorted(report.board_orphans) == sorted([[keys.sched_tasks(), o["recent"]],
                                                   [keys.sched_tasks(), "gone-board"],
                                                   [keys.sched_progress(), "gone-board"]])
    assert [p[1] for p in report.old_pending] == ["b-old"]
    assert report.seen == {"lcls/run42": 3} and report.pending == {"lcls/run42": {"batches": 2, "older": 1}}
    assert report.jobs["succeeded"] == 2 and report.jobs["queued"] == 1
    assert report.memory["job"]["keys"] == 3 and report.memory["job"]["bytes"] > 0
    assert report.streams["jobs_stream"]["length"] == 3

    version = client.zscore(keys.sched_version(), "#") or 0
    done = reclaim(client, keys, report)
    assert done == {"ttl_set": 3, "expired": 3, "index_orphans": 2, "event_orphans": 1, "idempotency_orphans": 1,
                    "board_orphans": 3, "old_pending": 0}  # the expired job's index entry went with it
    # the agents' cached board views learn of the removed fields from the change log at their next cycle
    assert client.zscore(keys.sched_version(), "#") == version + 2
    assert client.zscore(keys.sched_version(), f"t:{o['recent']}") == version + 1
    assert client.zscore(keys.sched_version(), "p:gone-board") == version + 2
    ttls = _ttls(client, keys.job(o["recent"]), keys.job_events(o["recent"]), _idem(keys, "idem-recent"))
    assert all(7 * DAY - 3700 <= t <= 7 * DAY - 3500 for t in ttls), ttls
    assert not client.exists(keys.job(o["old"]), keys.job_events(o["old"]), _idem(keys, "idem-old"))
    assert client.ttl(keys.job(o["live"])) == -1 and client.ttl(_idem(keys, "idem-live")) == -1
    assert client.zscore(keys.job_index(), "gone-index") is None and client.zscore(keys.job_index(), o["old"]) is None
    assert client.zscore(keys.job_index_of(authkit.SUBMITTER), o["live"]) is not None  # queued: its submitter's
    assert not client.exists(keys.job_events("gone-events"), keys.idempotency("idem-gone"))
    assert set(client.hkeys(keys.sched_tasks())) == {o["live"]}
    assert set(client.hkeys(keys.sched_progress())) == {o["live"]}
    assert set(client.hkeys(keys.pending("lcls/run42"))) == {"b-old", "b-new"}  # report only by default
    assert client.get(other.idempotency("x")) == "gone"
    again = survey(client, keys)
    assert again.reclaimable(drop_pending=False) == 0

    assert reclaim(client, keys, again, drop_pending=True)["old_pending"] == 1
    assert set(client.hkeys(keys.pending("lcls/run42"))) == {"b-new"}


def test_reclaim_leaves_what_changed_since_the_survey(redis_client, spec):
    keys, client = Keys("rtrace"), redis_client
    o = _orphans(client, keys, spec)
    report = survey(client, keys, now=o["now"])
    client.expire(keys.job(o["recent"]), 60)  # someone set a TTL meanwhile
    client.set(keys.idempotency("idem-gone"), o["live"])  # re-pointed at a live job meanwhile
    redelivered = json.dumps({"claimed_at": o["now"] - 9 * DAY, "delivered_at": time.time(), "files": []})
    client.hset(keys.pending("lcls/run42"), "b-old", redelivered)  # a watcher took the batch again meanwhile
    done = reclaim(client, keys, report, drop_pending=True)
    assert 0 < client.ttl(keys.job(o["recent"])) <= 60
    assert client.get(keys.idempotency("idem-gone")) == o["live"] and done["idempotency_orphans"] == 0
    assert client.hget(keys.pending("lcls/run42"), "b-old") == redelivered and done["old_pending"] == 0


def test_the_scan_covers_every_family_and_no_other_namespace(redis_client):
    """One SCAN glob (the families' common prefix, glob-escaped) finds keys in the namespace slot and in their own
    slots; keys of another namespace it also matches are not counted."""
    keys, client = Keys("a*b"), redis_client
    client.set(keys.idempotency("k"), "gone")
    client.sadd(keys.seen("s1"), "f")
    client.xadd(keys.history(), {"row": "{}"})
    for other in (Keys("aXb"), Keys("a*b2")):  # the first matched by an unescaped glob, the second by any
        client.set(other.idempotency("k"), "gone")
        client.sadd(other.seen("s2"), "f")
    assert scan_pattern(Keys("fstream")).startswith("{fstream") and scan_pattern(Keys("x")).endswith("*")
    report = survey(client, keys)
    assert report.idempotency_orphans == [[keys.idempotency("k"), "gone"]]
    assert report.seen == {"s1": 1} and report.streams["history"]["length"] == 1
    assert report.scanned == 3 and "other" not in report.memory


# -- fstream gc ------------------------------------------------------------------------------------
def _snapshot(client: Any, pattern: str) -> dict[str, tuple]:
    """Each key's content and TTL. A hash by its fields: its DUMP follows the dict's order, which an incremental
    rehash changes on a mere read once the hash is a hashtable (a finished job's hash, since it keeps ``totals``)."""
    def content(k: str) -> Any:
        return sorted(client.hgetall(k).items()) if client.type(k) == "hash" else client.dump(k)

    return {k: (content(k), client.ttl(k)) for k in client.scan_iter(match=pattern, count=1000)}


def test_gc_dry_run_changes_nothing(redis_client, redis_url, spec, capsys):
    keys, client = Keys("rtdry"), redis_client
    _orphans(client, keys, spec)
    size, before = client.dbsize(), _snapshot(client, scan_pattern(keys))
    started = time.monotonic()
    code, out, err = _gc(capsys, "--redis", redis_url, "--namespace", "rtdry")
    took = time.monotonic() - started  # TTLs run down meanwhile (seconds on a loaded host): no more than that
    assert code == 1, err
    assert "dry run: 12 key(s) or field(s) to reclaim; run with --apply" in out
    assert "1  index entries whose job is gone" in out and "seen scope 'lcls/run42': 3 files remembered" in out
    after = _snapshot(client, scan_pattern(keys))
    assert client.dbsize() == size and after.keys() == before.keys()
    changed = [k for k in before if not (after[k][0] == before[k][0] and abs(after[k][1] - before[k][1]) <= 1 + took)]
    assert not changed, [(k, before[k][1], after[k][1], before[k][0] == after[k][0]) for k in changed]


def test_gc_json_reports_then_applies(redis_client, redis_url, spec, capsys):
    keys, client = Keys("rtjson"), redis_client
    o = _orphans(client, keys, spec)
    ns = ("--redis", redis_url, "--namespace", "rtjson", "--json")
    code, out, _ = _gc(capsys, *ns)
    doc = json.loads(out)
    assert code == 1 and doc["applied"] is False and doc["reclaimed"] is None
    assert set(doc) == {"namespace", "now", "retention_s", "reclaimable", "jobs", "seen", "pending", "streams",
                        "memory", "scanned_keys", "applied", "reclaimed", "left"}
    assert doc["namespace"] == "rtjson" and doc["retention_s"] == 7 * DAY
    assert {k: v["count"] for k, v in doc["reclaimable"].items()} == {
        "no_ttl": 2, "index_orphans": 1, "event_orphans": 1, "idempotency_orphans": 1, "board_orphans": 3,
        "old_pending": 1}
    assert doc["reclaimable"]["index_orphans"]["examples"] == ["gone-index"]
    assert doc["left"] == {"no_ttl": 6, "index_orphans": 1, "event_orphans": 1, "idempotency_orphans": 1,
                           "board_orphans": 3, "old_pending": 0}
    fam = doc["memory"]["families"]["job_events"]
    assert fam["keys"] == 4 and fam["sampled"] == 4 and fam["bytes"] > 0 and fam["estimated"] is False
    assert doc["memory"]["total_bytes"] >= fam["bytes"] and doc["memory"]["used_memory"] > 0
    assert doc["seen"] == {"lcls/run42": 3} and doc["streams"]["jobs_stream"]["length"] == 3

    code, out, _ = _gc(capsys, *ns, "--apply", "--job-retention", "1d")
    doc = json.loads(out)
    assert code == 0 and doc["applied"] is True and doc["retention_s"] == DAY
    assert doc["reclaimed"] == {"ttl_set": 3, "expired": 3, "index_orphans": 2, "event_orphans": 1,
                                "idempotency_orphans": 1, "board_orphans": 3, "old_pending": 0}
    assert not any(doc["left"].values())
    assert DAY - 3700 <= client.ttl(keys.job(o["recent"])) <= DAY - 3500  # ended an hour ago, kept a day
    code, out, _ = _gc(capsys, *ns)
    assert code == 0 and not any(v["count"] for k, v in json.loads(out)["reclaimable"].items() if k != "old_pending")
    code, _, err = _gc(capsys, *ns, "--drop-pending")
    assert code == 2 and "--drop-pending: only with --apply" in err


def test_gc_on_an_unreachable_redis_is_retryable(capsys):
    code, _, err = _gc(capsys, "--redis", "redis://127.0.0.1:1/0")
    assert code == 75 and "unreachable" in err


def test_survey_and_reclaim_on_a_redis_cluster(tmp_path, spec):
    """On a real 3-master Cluster: the scan visits every master (the new-files scopes' keys have slots of their
    own), and every reclaiming command or script touches one key."""
    clusterkit = pytest.importorskip("clusterkit")
    if clusterkit.find_redis_cli() is None:
        pytest.skip("redis-cli not installed")
    from fstream_provider.bus.client import connect

    with clusterkit.RedisCluster6(tmp_path / "cluster") as cluster:
        client, keys = connect(cluster.url), Keys("rtcl")
        try:
            o = _orphans(client, keys, spec)
            for i in range(30):
                client.sadd(keys.seen(f"scope-{i}"), "f")
            assert len({cluster.master_of(keys.seen(f"scope-{i}")).address for i in range(30)}) > 1
            report = survey(client, keys, now=o["now"])
            assert report.counts() == {"no_ttl": 2, "index_orphans": 1, "event_orphans": 1, "idempotency_orphans": 1,
                                       "board_orphans": 3, "old_pending": 1}
            assert len(report.seen) == 31 and report.memory["seen"]["keys"] == 31
            done = reclaim(client, keys, report, drop_pending=True)
            assert done == {"ttl_set": 3, "expired": 3, "index_orphans": 2, "event_orphans": 1,
                            "idempotency_orphans": 1, "board_orphans": 3, "old_pending": 1}
            assert survey(client, keys).reclaimable(drop_pending=True) == 0
        finally:
            client.close()


def test_the_retention_bench_measures_jobs_and_their_expiry():
    """``bench/scale/retention.py`` at 20 jobs: bytes per job measured before any expired, and after the retention
    only the families bounded otherwise (audit, history, nonces) are left."""
    from fstream_bench.scale.retention import run

    out = run(20, retention_s=2, log=lambda _msg: None)
    assert out["measured_before_expiry"] and out["bytes_per_job"] > out["one_job"]["hash"] > 0
    assert out["one_job"]["events_entries"] == 1 + 1 + 10 + 4 + 1 + 1  # queued claimed tuning intervals files done
    after = out["after_retention"]
    assert after["jobs_left"] == 0 and after["not_bounded_bytes"] == 0
    assert set(after["families_bytes"]) <= {"audit", "history", "nonce", "jobs_stream", "job_owners"}
