"""The event trigger's batches: at-least-once with a stable ``batch_id``, acknowledged once Airflow stored the event.

Before: files were claimed (``SADD``) right before the event, so a triggerer killed after yielding and
before Airflow stored the event lost the batch (at-most-once). Now the claim records a pending batch;
as an asset watcher the trigger runs in Airflow 3.3's shared-stream ack mode and the batch is
acknowledged only after the persist confirmation. The triggerer's side is Airflow's real
``SharedStreamManager`` driven the way ``TriggerRunner.run_trigger`` drives it
(airflow/jobs/triggerer_job_runner.py): subscribe, ``filter_shared_stream``, ``bind_pending_event`` per
event, and ``confirm_persisted`` — the call the supervisor's state sync makes once the event is in
the metadata database. The Redis is real, and the killed triggerer is a real process.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

pytest.importorskip("airflow")

from airflow.triggers.shared_stream import AckTimeout, SharedStreamManager  # noqa: E402

from fstream_provider.bus.client import connect  # noqa: E402
from fstream_provider.bus.keys import Keys  # noqa: E402
from fstream_provider.triggers.new_files import FStreamNewFilesTrigger  # noqa: E402


async def run_like_the_triggerer(trigger, manager, trigger_id, on_event):
    """TriggerRunner.run_trigger for a BaseEventTrigger: shared stream if it has a key, else run()."""
    key = trigger.shared_stream_key()
    if key is not None:
        stream = trigger.filter_shared_stream(manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=key))
    else:
        stream = trigger.run()
    try:
        async for ev in stream:
            seq = manager.bind_pending_event(trigger_id=trigger_id, key=key) if key is not None else None
            await on_event(ev.payload, seq)
    finally:
        if key is not None:
            await manager.unsubscribe(trigger_id, key)


CHILD = "import asyncio\n" + inspect.getsource(run_like_the_triggerer) + textwrap.dedent('''
    import json, sys
    from airflow.triggers.shared_stream import SharedStreamManager
    from fstream_provider.triggers.new_files import FStreamNewFilesTrigger

    async def on_event(payload, seq):
        print("EVENT " + json.dumps(payload), flush=True)
        await asyncio.sleep(3600)  # the supervisor has not stored it yet: the test kills us here

    trigger = FStreamNewFilesTrigger(path=sys.argv[1], pattern="*.dat", scope="crash", min_age=1e-9,
                                     poll_interval=0.05)
    asyncio.run(run_like_the_triggerer(trigger, SharedStreamManager(), 1, on_event))
''')


def _trigger(path: Path, scope: str, **kw) -> FStreamNewFilesTrigger:
    return FStreamNewFilesTrigger(path=str(path), pattern="*.dat", scope=scope, min_age=1e-9, poll_interval=0.05,
                                  **kw)


async def _triggerer(trigger, seconds: float, *, persist: bool = True, ack_timeout: float = 300.0,
                     until=None, failures: list | None = None) -> list[dict]:
    """Run ``trigger`` as the triggerer does for ``seconds`` (or until ``until(events)``); with ``persist``
    every event is confirmed stored, as the supervisor does after writing it."""
    manager, events = SharedStreamManager(ack_timeout=ack_timeout), []

    async def on_event(payload, seq):
        events.append(payload)
        if persist and seq is not None:
            manager.confirm_persisted([seq])

    task = asyncio.create_task(run_like_the_triggerer(trigger, manager, 7, on_event))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not task.done() and not (until and until(events)):
        await asyncio.sleep(0.05)
    task.cancel()
    (outcome,) = await asyncio.gather(task, return_exceptions=True)
    await manager.stop_all()
    if isinstance(outcome, Exception):
        if failures is None:
            raise outcome
        failures.append(outcome)  # the trigger failed (what the triggerer would record)
    return events


def _pending(redis_url: str, scope: str) -> int:
    return connect(redis_url).hlen(Keys().pending(scope))


def test_a_batch_claimed_by_a_killed_triggerer_is_delivered_again_then_never_twice(tmp_path, redis_url, monkeypatch):
    conn = redis_url.replace("redis://", "fstream://", 1)
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", conn)
    for n in ("a.dat", "b.dat"):
        (tmp_path / n).write_bytes(b"x" * 100)
    env = dict(os.environ, AIRFLOW_CONN_FSTREAM_DEFAULT=conn, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        line = ""
        while time.monotonic() < deadline and not line.startswith("EVENT "):
            line = child.stdout.readline()
            assert line or child.poll() is None, "the child triggerer exited without an event"
        first = json.loads(line[len("EVENT "):])
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the triggerer dies before the supervisor stored the event
        child.wait(10)
    assert sorted(first["files"]) == [str(tmp_path / "a.dat"), str(tmp_path / "b.dat")] and first["batch_id"]

    # a restarted triggerer delivers it again, same id, same files; Airflow stores it: acknowledged
    again = asyncio.run(_triggerer(_trigger(tmp_path, "crash", redeliver_after=0), 30,
                                   until=lambda ev: ev and _pending(redis_url, "crash") == 0))
    assert again, "the batch was lost with the killed triggerer"
    assert again[0]["batch_id"] == first["batch_id"] and sorted(again[0]["files"]) == sorted(first["files"])
    assert again[0]["redelivered"] is True
    assert _pending(redis_url, "crash") == 0, "the stored batch was not acknowledged"
    assert connect(redis_url).scard(Keys().seen("crash")) == 2
    # acknowledged: never delivered again, even by a trigger that redelivers at once. A look delivers a batch
    # due for redelivery before any new file, so the first thing this trigger delivers is the only new file.
    (tmp_path / "c.dat").write_bytes(b"x" * 100)
    after = asyncio.run(_triggerer(_trigger(tmp_path, "crash", redeliver_after=0), 30, until=bool))
    assert [(e["files"], e.get("redelivered", False)) for e in after] == [([str(tmp_path / "c.dat")], False)], after


def test_an_event_airflow_did_not_store_is_delivered_again_and_a_stored_one_never(tmp_path, redis_url, monkeypatch):
    """No persist confirmation within the ack timeout: Airflow fails the subscriber, the producer releases
    the batch, and the next delivery carries the same batch id. A confirmed batch is never repeated."""
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", redis_url.replace("redis://", "fstream://", 1))
    (tmp_path / "x.dat").write_bytes(b"x" * 10)
    failures: list = []
    lost = asyncio.run(_triggerer(_trigger(tmp_path, "unstored"), 20, persist=False, ack_timeout=0.5,
                                  failures=failures))
    assert len(lost) == 1 and [type(f) for f in failures] == [AckTimeout]  # Airflow fails the subscriber
    pending = connect(redis_url).hgetall(Keys().pending("unstored"))
    assert list(pending) == [lost[0]["batch_id"]] and json.loads(pending[lost[0]["batch_id"]])["delivered_at"] == 0
    got = asyncio.run(_triggerer(_trigger(tmp_path, "unstored"), 20,
                                 until=lambda ev: ev and _pending(redis_url, "unstored") == 0))
    assert [e["batch_id"] for e in got] == [lost[0]["batch_id"]] and got[0]["files"] == [str(tmp_path / "x.dat")]
    # the next batch is new files only, once: a look delivers a batch due for redelivery before any new file
    # (here at once: redeliver_after=0), so y.dat coming first, and z.dat (written once y.dat's batch was
    # stored) coming next, show that neither the stored batch nor y.dat's was delivered again
    y, z = tmp_path / "y.dat", tmp_path / "z.dat"
    y.write_bytes(b"y" * 10)

    def y_then_z(events: list) -> bool:
        if events and not z.exists():
            z.write_bytes(b"z" * 10)
        return len(events) >= 2

    nxt = asyncio.run(_triggerer(_trigger(tmp_path, "unstored", redeliver_after=0), 20, until=y_then_z))
    assert [e["files"] for e in nxt] == [[str(y)], [str(z)]], nxt
    assert len({lost[0]["batch_id"], *(e["batch_id"] for e in nxt)}) == 3


def test_a_deferred_sensor_trigger_runs_alone_and_asset_triggers_share_by_settings(tmp_path):
    """Two sensors deferring with the same settings must each get their own batch: no shared stream."""
    a, b = _trigger(tmp_path, "s"), _trigger(tmp_path, "s")
    assert a.shared_stream_key() == b.shared_stream_key() is not None
    assert a.shared_stream_key() != _trigger(tmp_path, "s", max_files=3).shared_stream_key()
    a.task_instance = types.SimpleNamespace(task_id="wait", dag_id="d", run_id="r", map_index=-1, try_number=1)
    # ^ the triggerer sets the deferred task's instance before it asks for the key
    assert a.shared_stream_key() is None


def test_identity_path_size_mtime_reports_a_rewritten_file_again_and_seen_reset_forgets(tmp_path, redis_url,
                                                                                        monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", redis_url.replace("redis://", "fstream://", 1))
    f = tmp_path / "r.dat"
    f.write_bytes(b"x" * 10)

    def files(identity: str, seconds: float = 20) -> list:
        ev = asyncio.run(_triggerer(_trigger(tmp_path, f"id-{identity}", identity=identity), seconds,
                                    until=lambda e: bool(e)))
        return [e["files"] for e in ev]

    assert files("path+size+mtime") == [[str(f)]]
    assert files("path") == [[str(f)]]
    f.write_bytes(b"y" * 20)  # rewritten: a new version
    os.utime(f, (time.time() + 5, time.time() + 5))
    assert files("path+size+mtime") == [[str(f)]]
    # identity path: reported once, whatever happens to it. One look reports every new file it finds in one
    # batch, so a new file reported alone shows the rewritten one is not new under this identity.
    marker = tmp_path / "s.dat"
    marker.write_bytes(b"s")
    assert files("path") == [[str(marker)]]
    marker.unlink()
    with pytest.raises(ValueError, match=r"identity 'size': expected one of 'path', 'path\+size\+mtime'"):
        asyncio.run(_triggerer(_trigger(tmp_path, "bad", identity="size"), 5))
    def seen(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "transfer_agent.cli", "seen", *args, "--scope", "id-path",
                               "--redis", redis_url], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))

    out = seen("list")
    assert out.returncode == 0 and f"seen     {f}" in out.stdout and "2 seen file(s), 0 pending" in out.stdout, out
    # `fstream seen reset` forgets the scope: the file is reported again
    out = seen("reset")
    assert out.returncode == 0 and "removed 2 seen file(s)" in out.stdout, out.stdout + out.stderr
    assert files("path") == [[str(f)]]


def test_a_cancelled_watch_stops_although_redis_py_can_swallow_the_cancellation(redis_url):
    """redis-py's async client can lose a ``CancelledError`` that lands mid-command (redis/redis-py#2028):
    the trigger kept polling after the triggerer cancelled it, and the triggerer waited for it forever."""
    import random

    from fstream_provider.bus.client import connect_async
    from fstream_provider.watch.pending import PendingBatches
    from fstream_provider.watch.stability import FileStat

    async def main() -> int:
        client = connect_async(redis_url)
        store = PendingBatches(client, "{t}:seen", "{t}:pending")

        async def poll_forever() -> None:
            while True:
                await store.take_redeliverable(0)
                await store.aunseen([FileStat("/x", 1, 1.0)])

        kept_running = 0
        rng = random.Random(9)
        for _ in range(1500):
            task = asyncio.create_task(poll_forever())
            await asyncio.sleep(rng.random() * 0.003)
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=0.5)
            if not done:
                kept_running += 1
                task.cancel()
                await asyncio.wait([task], timeout=0.5)
        await client.aclose()
        return kept_running

    assert asyncio.run(main()) == 0
