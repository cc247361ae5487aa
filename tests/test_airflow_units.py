"""Provider units with real Redis: trigger serialize round trips, cheap constructors, hook settings, trigger runs, task-log text."""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import tempfile

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
pytest.importorskip("airflow")

from airflow.sdk._shared.module_loading import import_string  # noqa: E402

from fstream_provider.hooks.fstream import FStreamHook  # noqa: E402
from fstream_provider.hooks.fstream_async import FStreamAsyncHook  # noqa: E402
from fstream_provider.bus.jobs import JobStore  # noqa: E402
from fstream_provider.bus.keys import Keys  # noqa: E402
from fstream_provider.operators.transfer import FStreamTransferOperator, normalize_sources, to_unix_time  # noqa: E402
from fstream_provider.sensors.new_files import FStreamNewFilesSensor  # noqa: E402
from fstream_provider.model.spec import TransferSpec  # noqa: E402
from fstream_provider.authz.outcome import load_signer  # noqa: E402
from fstream_provider.model.tasklog import format_interval, save_plot, summary_table, target_warnings  # noqa: E402
from fstream_provider.triggers.new_files import FStreamNewFilesTrigger  # noqa: E402
from fstream_provider.triggers.transfer import FStreamTransferTrigger  # noqa: E402

import authkit  # noqa: E402

NS = "t-airflow"


@pytest.fixture
def fstream_conn(monkeypatch, redis_url):
    """``fstream_default`` pointing at the test Redis, in a private namespace, via the standard env-var URI."""
    from urllib.parse import urlparse

    u = urlparse(redis_url)
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", f"fstream://{u.hostname}:{u.port}{u.path or '/0'}?namespace={NS}")
    return redis_url


def _roundtrip(trigger):
    path, kwargs = trigger.serialize()
    assert path == f"{type(trigger).__module__}.{type(trigger).__qualname__}"
    params = [p for p in inspect.signature(type(trigger).__init__).parameters if p != "self"]
    assert sorted(kwargs) == sorted(params), "serialize() must mirror the constructor exactly"
    again = import_string(path)(**kwargs)
    assert again.serialize() == (path, kwargs)


def test_transfer_trigger_serialize_round_trip():
    _roundtrip(FStreamTransferTrigger(job_id="abc", fstream_conn_id="c", last_event_id="5-1",
                                      target_throughput_bps=8e8, block_ms=250))


def test_new_files_trigger_serialize_round_trip():
    _roundtrip(FStreamNewFilesTrigger(path="sftp://u@h:2222/d", pattern="*.h5", recursive=True, scope="s",
                                      min_files=3, max_files=10, poll_interval=0.5, min_age=2.0,
                                      fstream_conn_id="c", ssh_key_file="/k", known_hosts="/kh"))


def test_constructors_do_no_io(monkeypatch):
    """Hooks, operators, sensors and triggers only store values: any socket connect would fail the test."""
    def refuse(*a, **k):
        raise AssertionError("network I/O in a constructor")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr("fstream_provider.bus.client.connect", refuse)
    monkeypatch.setattr("fstream_provider.bus.client.connect_async", refuse)
    monkeypatch.setattr("fstream_provider.bus.embedded.resolve_redis_url", refuse)
    FStreamHook(fstream_conn_id="nowhere")
    FStreamAsyncHook(fstream_conn_id="nowhere")
    FStreamTransferOperator(task_id="t", sources=["/data/a"], destination="fstream://127.0.0.1:1/x",
                            fstream_conn_id="nowhere")
    FStreamNewFilesSensor(task_id="s", path="sftp://u@192.0.2.1:22/d", fstream_conn_id="nowhere")
    FStreamTransferTrigger(job_id="j", fstream_conn_id="nowhere")
    FStreamNewFilesTrigger(path="sftp://u@192.0.2.1:22/d", fstream_conn_id="nowhere")


def test_hook_reads_the_connection_uri(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_X",
                       "fstream://:s3cr%40t@redis.example:6380/3?submitter=lcls-daq&submitter_key_file=%2Fetc%2Ffs.key"
                       "&key=bl7&namespace=lab&agent_group=dtn")
    s = FStreamHook(fstream_conn_id="fstream_x").settings
    assert s.redis_url == "redis://:s3cr%40t@redis.example:6380/3"
    assert (s.namespace, s.agent_group, s.key) == ("lab", "dtn", "bl7")
    assert (s.submitter, s.submitter_key_file, s.submitter_secret) == ("lcls-daq", "/etc/fs.key", None)


def test_jobs_name_their_key_by_id_from_the_operator_else_the_connection(monkeypatch, redis_url, redis_client):
    """Issue 32: the operator's ``key`` wins, the connection's ``key`` extra fills a job naming none; a spec naming
    a key file is refused at submit, and a DAG still passing ``secret_file`` fails when it is parsed."""
    from urllib.parse import urlparse

    u = urlparse(redis_url)
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_KEYED",
                       f"fstream://{u.hostname}:{u.port}/0?namespace={NS}&key=bl7&{authkit.conn_query()}")
    hook = FStreamHook(fstream_conn_id="fstream_keyed")
    kw = dict(task_id="t", sources=["/a"], destination="fstream://127.0.0.1:9/x", fstream_conn_id="fstream_keyed")
    try:
        from_conn, _ = hook.submit(FStreamTransferOperator(**kw).build_spec(), idempotency_key="k/conn")
        from_op, _ = hook.submit(FStreamTransferOperator(**kw, key="bl9").build_spec(), idempotency_key="k/op")
        assert (hook.get_job(from_conn).spec.key, hook.get_job(from_op).spec.key) == ("bl7", "bl9")
        with pytest.raises(ValueError, match="secret_file name key files") as exc:
            hook.submit(TransferSpec(sources=["/a"], destination="fstream://127.0.0.1:9/x", secret_file="/etc/s"),
                        idempotency_key="k/file")
        assert "key=" in str(exc.value)
        assert len(JobStore(redis_client, keys=Keys(NS)).list()) == 2  # the refused one was not queued
    finally:
        hook.close()
    with pytest.raises(TypeError, match="secret_file"):
        FStreamTransferOperator(**kw, secret_file="/etc/fstream/secret")


def test_a_missing_connection_fails_at_once_naming_it_and_never_falls_back(monkeypatch):
    """Inside Airflow an undefined conn id used to fall back to $FSTREAM_REDIS_URL / an embedded Redis:
    the job went to a bus no agent watched and the deferred task waited for ever."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    from fstream_provider.hooks.fstream_async import FStreamAsyncHook

    monkeypatch.setenv("FSTREAM_REDIS_URL", "redis://127.0.0.1:1/0")
    with pytest.raises(AirflowNotFoundException, match="'fstream_absent' is not defined.*AIRFLOW_CONN_FSTREAM_ABSENT"):
        FStreamHook(fstream_conn_id="fstream_absent").settings
    with pytest.raises(AirflowNotFoundException, match="fstream_absent"):
        asyncio.run(FStreamAsyncHook(fstream_conn_id="fstream_absent").get_settings())


def test_hook_test_connection(fstream_conn, monkeypatch):
    ok, msg = FStreamHook().test_connection()
    assert ok and "PING" in msg and NS in msg
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEAD", "fstream://127.0.0.1:1/0")
    ok, msg = FStreamHook(fstream_conn_id="fstream_dead").test_connection()
    assert not ok and "fstream_dead" in msg


def test_operator_sources_and_until():
    assert normalize_sources("/a") == ["/a"]
    assert normalize_sources([["/a", "/b"], {"files": ["/c"]}]) == ["/a", "/b", "/c"]
    assert normalize_sources([]) == []
    assert to_unix_time("1970-01-01T00:01:00+00:00") == 60.0
    with pytest.raises(ValueError, match="until"):
        to_unix_time("next tuesday")


def test_operator_template_fields_exist():
    op = FStreamTransferOperator(task_id="t", sources="/a", destination="fstream://h:1/x")
    assert {"sources", "destination"} <= set(op.template_fields)  # paths can come from Jinja (dag_run.conf...)
    for f in op.template_fields:
        assert hasattr(op, f)
    s = FStreamNewFilesSensor(task_id="s", path="/d")
    assert "path" in s.template_fields
    for f in s.template_fields:
        assert hasattr(s, f)


# --------------------------------------------------------------------------- triggers against real Redis
async def _first_event(trigger, timeout=20.0):
    async def go():
        async for ev in trigger.run():
            return ev.payload
        return None

    return await asyncio.wait_for(go(), timeout)


def _write(path, data=b"x"):
    with open(path, "wb") as f:
        f.write(data)


def test_new_files_trigger_reports_each_file_once(fstream_conn, tmp_path):
    _write(tmp_path / "a.xtc", b"1" * 10)
    _write(tmp_path / "b.xtc", b"2" * 20)
    _write(tmp_path / "skip.log")
    kw = dict(path=str(tmp_path), pattern="*.xtc", poll_interval=0.05)
    ev = asyncio.run(_first_event(FStreamNewFilesTrigger(**kw)))
    assert ev["status"] == "success" and sorted(ev["files"]) == [str(tmp_path / "a.xtc"), str(tmp_path / "b.xtc")]
    assert ev["bytes"] == 30
    # The asset watcher re-runs the trigger after each event (and a triggerer restart rebuilds it): only new files.
    _write(tmp_path / "c.xtc")
    ev2 = asyncio.run(_first_event(FStreamNewFilesTrigger(**kw)))
    assert ev2["files"] == [str(tmp_path / "c.xtc")]


def test_duplicate_triggers_never_report_the_same_file(fstream_conn, tmp_path):
    for i in range(30):
        _write(tmp_path / f"f{i:02d}.h5")
    kw = dict(path=str(tmp_path), pattern="*.h5", poll_interval=0.02, max_files=7)

    async def both():
        got: list[str] = []
        for _round in range(2):  # two rounds of two racing triggers, 7 files each at most
            a, b = await asyncio.gather(_first_event(FStreamNewFilesTrigger(**kw)),
                                        _first_event(FStreamNewFilesTrigger(**kw)))
            assert 1 <= len(a["files"]) <= 7 and 1 <= len(b["files"]) <= 7
            got += a["files"] + b["files"]
        return got

    got = asyncio.run(both())
    assert len(got) == len(set(got)) >= 4  # no file in two batches


def test_new_files_trigger_waits_for_a_growing_file(fstream_conn, tmp_path):
    path = tmp_path / "grow.bin"

    async def scenario():
        trig = FStreamNewFilesTrigger(path=str(tmp_path), poll_interval=0.05)
        task = asyncio.ensure_future(_first_event(trig))
        for i in range(10):  # keeps growing for ~0.5 s: must not be reported meanwhile
            with open(path, "ab") as f:
                f.write(b"x" * 1000)
            os.utime(path, (i + 1000.0, i + 1000.0))
            await asyncio.sleep(0.05)
            assert not task.done()
        return await task

    ev = asyncio.run(scenario())
    assert ev["details"][0]["size"] == 10_000  # reported whole, after it stopped growing


def _fake_worker_run(redis_url, job_id, *, fail=False, n=3):
    """Play the agent's side of the job protocol on the real bus (the real agent runs in the integration tests)."""
    from fstream_provider.bus.client import connect

    client = connect(redis_url)
    # signs with this process's default agent key, which the trigger trusts by default (issue 40)
    store = JobStore(client, keys=Keys(NS), outcome_signer=load_signer(None, "fake"))
    k = store.keys
    resp = client.xreadgroup(k.jobs_group(), "fake", {k.jobs_stream(): ">"}, count=1)
    entry_id = resp[0][1][0][0]
    c = store.claim(job_id, entry_id, worker="fake", max_deliveries=5)
    assert c.outcome == "claimed"
    evs = [("interval", i, {"t": float(i + 1), "throughput_bps": 5e8 + i * 1e8, "cc": 2 + i, "p": 1, "pp": 4,
                            "files_done": i, "files_pending": n - i, "reason": f"step {i}"}) for i in range(n)]
    store.publish(job_id, c.attempt, evs)
    result = {"files": n, "bytes": 3 * 2**20, "seconds": 3.0, "throughput_bps": 6e8, "verified_files": n,
              "skipped_files": 0, "failed_files": 0, "failures": [], "intervals": [e[2] for e in evs]}
    store.finish(job_id, c.attempt, entry_id, state="failed" if fail else "succeeded",
                 error="receiver 127.0.0.1:9: disk full (terminal)" if fail else None,
                 result=None if fail else result)
    client.close()


@pytest.mark.parametrize("fail", [False, True])
def test_transfer_trigger_fires_once_on_done(fstream_conn, redis_client, fail):
    store = JobStore(redis_client, keys=Keys(NS), signer=authkit.signer())
    job_id, created = store.submit(TransferSpec(sources=["/a"], destination="fstream://127.0.0.1:9/x"),
                                   idempotency_key=f"d/r/t/-1/{fail}")
    assert created
    _fake_worker_run(fstream_conn, job_id, fail=fail)
    ev = asyncio.run(_first_event(FStreamTransferTrigger(job_id=job_id, block_ms=200)))
    assert ev["job_id"] == job_id
    if fail:
        assert ev["status"] == "error" and "disk full" in ev["message"]
    else:
        assert ev["status"] == "success" and ev["state"] == "succeeded"
    assert ev["last_event_id"] == store.events(job_id, count=1000)[-1][0]


def test_transfer_trigger_unknown_job_is_an_error(fstream_conn):
    ev = asyncio.run(_first_event(FStreamTransferTrigger(job_id="nope", block_ms=100)))
    assert ev["status"] == "error" and "nope" in ev["message"] and "does not exist" in ev["message"]


def test_transfer_trigger_on_kill_cancels_the_job(fstream_conn, redis_client):
    store = JobStore(redis_client, keys=Keys(NS), signer=authkit.signer())
    job_id, _ = store.submit(TransferSpec(sources=["/a"], destination="fstream://127.0.0.1:9/x"),
                             idempotency_key="d/r/kill/-1")
    asyncio.run(FStreamTransferTrigger(job_id=job_id).on_kill())
    st = store.get(job_id)
    assert st.state == "cancelled" and "killed" in st.error


def test_cancel_on_kill_false_leaves_the_job_running(fstream_conn, redis_client):
    store = JobStore(redis_client, keys=Keys(NS), signer=authkit.signer())
    job_id, _ = store.submit(TransferSpec(sources=["/a"], destination="fstream://127.0.0.1:9/x"),
                             idempotency_key="d/r/keep/-1")
    asyncio.run(FStreamTransferTrigger(job_id=job_id, cancel_on_kill=False).on_kill())
    assert store.get(job_id).state == "queued"
    op = FStreamTransferOperator(task_id="t", sources=["/a"], destination="fstream://127.0.0.1:9/x",
                                 cancel_on_kill=False)
    op._job_id = job_id
    op.on_kill()
    assert store.get(job_id).state == "queued"


def test_sensor_poke_mode_reports_complete_files_once(fstream_conn, tmp_path):
    _write(tmp_path / "r1.sra", b"1" * 100)
    sensor = FStreamNewFilesSensor(task_id="s", path=str(tmp_path), pattern="*.sra", deferrable=False,
                                   min_files="1")
    assert not sensor.poke({})  # first look: completeness unknown
    done = sensor.poke({})
    assert done and done.xcom_value == [str(tmp_path / "r1.sra")]
    again = FStreamNewFilesSensor(task_id="s", path=str(tmp_path), pattern="*.sra", deferrable=False, min_age=1e-9)
    assert not again.poke({})  # a retry or a rerun: already reported


# --------------------------------------------------------------------------- task-log text
def test_interval_line_and_summary_are_readable(tmp_path):
    rec = {"t": 12.0, "throughput_bps": 812.4e6, "cc": 4, "p": 2, "pp": 8, "files_done": 120, "files_pending": 30,
           "reason": "QoS: below target, +1 channel",
           "clusters": [{"name": "small", "cc": 3, "p": 1, "pp": 16}, {"name": "large", "cc": 1, "p": 4, "pp": 1}]}
    line = format_interval(rec, 800e6)
    for part in ("t=   12.0s", "812.40 Mbit/s", "target 800.00 Mbit/s, 102%", "small 3/1/16", "large 1/4/1",
                 "120 done, 30 pending", "QoS: below target"):
        assert part in line, (part, line)
    # the files handed to channels and not committed yet are counted too (issue 41: a small transfer said
    # "0 pending" from its first second to its end, all its files being in flight)
    assert "120 done, 32 in flight, 30 pending" in format_interval({**rec, "active_files": 32}, 800e6)
    result = {"files": 150, "bytes": 2**30, "seconds": 10.0, "throughput_bps": 6e8, "verified_files": 150,
              "failed_files": 0}
    table = summary_table(result, [rec], 800e6, job_id="j1")
    assert "1.00 GiB" in table and "600.00 Mbit/s" in table and "75% reached" in table
    (w,) = target_warnings(result, [rec], 800e6)
    assert "target missed" in w and "600.00 Mbit/s" in w
    assert target_warnings({"throughput_bps": 9e8}, [rec], 800e6) == []
    png = save_plot([rec, dict(rec, t=13.0)], str(tmp_path / "p" / "plot.png"), 800e6)
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
