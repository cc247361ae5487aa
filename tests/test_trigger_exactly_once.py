"""The event trigger's batches survive a triggerer that dies between the claim and Airflow's next run.

Before: files were claimed (``SADD``) right before the event, so a triggerer killed after yielding and
before Airflow persisted the event lost the batch (at-most-once). Now the claim records a pending
batch; a fresh process re-delivers it with the same ``batch_id``; the process that yielded it
acknowledges it on its next run, after which it is never delivered again.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("airflow")

from fstream_provider.bus.client import connect  # noqa: E402
from fstream_provider.bus.keys import Keys  # noqa: E402
from fstream_provider.triggers.new_files import FStreamNewFilesTrigger  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CHILD = textwrap.dedent('''
    import asyncio, json, sys, time
    from fstream_provider.triggers.new_files import FStreamNewFilesTrigger

    async def main():
        t = FStreamNewFilesTrigger(path=sys.argv[1], pattern="*.dat", scope="crash", min_age=1e-9)
        async for ev in t.run():
            print("EVENT " + json.dumps(ev.payload), flush=True)
            await asyncio.sleep(3600)  # Airflow has not persisted it yet: the test kills us here

    asyncio.run(main())
''')


async def _first(trigger: FStreamNewFilesTrigger, timeout: float) -> dict | None:
    async def one() -> dict:
        async for ev in trigger.run():
            return ev.payload
        raise AssertionError("trigger ended without an event")

    try:
        return await asyncio.wait_for(one(), timeout)
    except asyncio.TimeoutError:
        return None


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
            assert line or child.poll() is None, "the child trigger exited without an event"
        first = json.loads(line[len("EVENT "):])
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the triggerer dies before Airflow ran the trigger again
        child.wait(10)
    assert sorted(first["files"]) == [str(tmp_path / "a.dat"), str(tmp_path / "b.dat")] and first["batch_id"]

    # a restarted triggerer (this process never yielded that batch) delivers it again, same id, same files
    again = asyncio.run(_first(FStreamNewFilesTrigger(path=str(tmp_path), pattern="*.dat", scope="crash",
                                                      min_age=1e-9, redeliver_after=0), 20))
    assert again is not None, "the batch was lost with the killed triggerer"
    assert again["batch_id"] == first["batch_id"] and sorted(again["files"]) == sorted(first["files"])
    assert again["redelivered"] is True
    # Airflow runs the trigger again in this process: the batch is acknowledged, never delivered a third time
    assert asyncio.run(_first(FStreamNewFilesTrigger(path=str(tmp_path), pattern="*.dat", scope="crash",
                                                     min_age=1e-9, redeliver_after=0), 2)) is None
    client = connect(redis_url)
    assert client.hlen(Keys().pending("crash")) == 0
    assert client.scard(Keys().seen("crash")) == 2


def test_identity_version_reports_a_rewritten_file_again_and_seen_reset_forgets(tmp_path, redis_url, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", redis_url.replace("redis://", "fstream://", 1))
    f = tmp_path / "r.dat"
    f.write_bytes(b"x" * 10)

    def trig(identity: str) -> FStreamNewFilesTrigger:
        return FStreamNewFilesTrigger(path=str(tmp_path), pattern="*.dat", scope=f"id-{identity}", min_age=1e-9,
                                      identity=identity)

    assert asyncio.run(_first(trig("version"), 20))["files"] == [str(f)]
    assert asyncio.run(_first(trig("path"), 20))["files"] == [str(f)]
    f.write_bytes(b"y" * 20)  # rewritten: a new version
    os.utime(f, (time.time() + 5, time.time() + 5))
    assert asyncio.run(_first(trig("version"), 20))["files"] == [str(f)]
    assert asyncio.run(_first(trig("path"), 2)) is None  # identity path: reported once, whatever happens to it
    with pytest.raises(ValueError, match="identity 'size'"):
        asyncio.run(_first(trig("size"), 5))
    # `fstream seen reset` forgets the scope: the file is reported again
    out = subprocess.run([sys.executable, "-m", "transfer_agent.cli", "seen", "reset", "--scope", "id-path",
                          "--redis", redis_url], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0 and "removed 1 seen file(s)" in out.stdout, out.stdout + out.stderr
    assert asyncio.run(_first(trig("path"), 20))["files"] == [str(f)]
