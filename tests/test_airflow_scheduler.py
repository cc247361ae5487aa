"""A real Airflow (bench/airflow/procs.py, four processes) runs the asset pipeline once per batch, not twice a file."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

pytest.importorskip("airflow")

from fstream_provider.bus.client import connect  # noqa: E402
from fstream_provider.bus.keys import Keys  # noqa: E402
from transfer_agent.receiving.receiver import Receiver  # noqa: E402
from transfer_agent.daemon.worker import Agent  # noqa: E402

import authkit  # noqa: E402
from fstream_bench.airflow.procs import Airflow, wait as _wait  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SECRET = b"fstream-scheduler-test-secret-012345"
DAG_ID = "fstream_asset_pipeline"


def _runs(af: Airflow) -> list[tuple[str, str]]:
    return af.runs(DAG_ID)


def _batches(af: Airflow) -> dict[str, list[str]]:
    rows = af.query("select run_id, value from xcom where dag_id = ? and task_id = 'batch_files' "
                    "and key = 'return_value'", DAG_ID)
    return {run_id: json.loads(v) for run_id, v in rows}


def _drop(watch: Path, names: list[str]) -> float:
    """Write files under a hidden name, then rename (how instruments close files); returns the close time."""
    for n in names:
        tmp = watch / f".{n}.writing"
        tmp.write_bytes(os.urandom(64_000))
    closed = time.time()
    for n in names:
        (watch / f".{n}.writing").rename(watch / n)
    return closed


def _latencies(redis_url: str, af: Airflow, closed: list[float]) -> str:
    """File closed -> asset event, and -> the agent claiming the transfer job (the transfer starting)."""
    from fstream_provider.bus.jobs import JobStore

    events = [r[0] for r in af.query("select timestamp from asset_event order by id")]
    to_event = [datetime.fromisoformat(ts).replace(tzinfo=timezone.utc).timestamp() - t  # stored as naive UTC
                for ts, t in zip(events, closed)]
    client = connect(redis_url)
    try:
        store = JobStore(client)
        claims = sorted(e["ts"] for j in store.list() for _, e in store.events(j.job_id, count=1000)
                        if e["kind"] == "claimed")
    finally:
        client.close()
    to_claim = [c - t for c, t in zip(claims, closed)]
    return ("file closed -> asset event: " + ", ".join(f"{x:.2f} s" for x in to_event)
            + "; file closed -> transfer claimed by the agent: " + ", ".join(f"{x:.2f} s" for x in to_claim))


def _pending_batches(redis_url: str) -> int:
    """Batches a new-files watcher claimed and Airflow has not yet confirmed stored (every scope)."""
    client = connect(redis_url)
    try:
        return sum(client.hlen(k) for k in client.scan_iter(Keys().own_slot_patterns()["pending"]))
    finally:
        client.close()


def test_asset_triggered_dag_runs_once_per_batch_never_twice_per_file(tmp_path, redis_url):
    watch, dags, work = tmp_path / "watch", tmp_path / "dags", tmp_path / "airflow"
    for d in (watch, dags, work):
        d.mkdir()
    shutil.copy(REPO / "fstream_provider" / "example_dags" / "fstream_asset_pipeline.py", dags)
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)  # load_secret refuses a secret others can read
    receiver = Receiver(listen=("127.0.0.1", 0), root=str(tmp_path / "dst"), secret=SECRET).start()
    agent = Agent(redis_url, policy=authkit.policy(secret), name="sched-test-agent", block_ms=200, poll_interval=0.1)
    agent_thread = threading.Thread(target=agent.run, daemon=True)
    agent_thread.start()
    af = Airflow(work, dags, {
        "FSTREAM_EXAMPLE_WATCH_DIR": str(watch),
        "FSTREAM_EXAMPLE_DESTINATION": f"fstream://127.0.0.1:{receiver.port}/landed",
        "FSTREAM_STATE_DIR": str(tmp_path / "state"),
        "AIRFLOW_CONN_FSTREAM_DEFAULT": redis_url.replace("redis://", "fstream://", 1) + "?" + authkit.conn_query()})
    diag = af.diag
    fired = lambda: sum(1 for line in af.log("triggerer").splitlines()  # noqa: E731  (watcher events only)
                        if "Trigger fired event" in line and "new complete file(s)" in line)
    try:
        af.migrate()
        af.start_all()
        _wait(lambda: af.log("triggerer").count("watching " + str(watch)) >= 1, 180, "the watcher to start", diag)

        batch1 = ["a0.h5", "a1.h5", "a2.h5"]
        closed = [_drop(watch, batch1)]
        (watch / "ignored.txt").write_text("not matching *.h5")
        _wait(lambda: len(_runs(af)) == 1 and _runs(af)[0][1] in ("success", "failed"), 180, "run 1", diag)

        # Restart the triggerer: the watcher is rebuilt from serialize(); its memory is gone, Redis remembers.
        starts = af.log("triggerer").count("watching " + str(watch))
        af.restart("triggerer")
        _wait(lambda: af.log("triggerer").count("watching " + str(watch)) > starts, 120, "the watcher to restart", diag)

        batch2 = ["b0.h5", "b1.h5"]
        closed.append(_drop(watch, batch2))
        _wait(lambda: len(_runs(af)) >= 2 and all(s in ("success", "failed") for _, s in _runs(af)), 180, "run 2",
              diag)

        # The watcher keeps running (shared-stream ack mode: one poll loop, not a re-run per event); each batch
        # is acknowledged once the triggerer confirmed its event stored. Then a third batch: its run holds only
        # its own file, so the watcher looked again after both acknowledgements and re-reported nothing (a
        # re-reported file would come out in an extra run before it, or in its batch).
        _wait(lambda: _pending_batches(redis_url) == 0, 60, "the triggerer to acknowledge the stored batches", diag)
        batch3 = ["c0.h5"]
        closed.append(_drop(watch, batch3))
        _wait(lambda: len(_runs(af)) >= 3 and all(s in ("success", "failed") for _, s in _runs(af)), 180, "run 3",
              diag)

        runs = _runs(af)
        assert [s for _, s in runs] == ["success", "success", "success"], f"{runs}\n{diag()}"
        batches = _batches(af)
        assert sorted(map(sorted, batches.values())) == [sorted(str(watch / n) for n in batch1),
                                                         sorted(str(watch / n) for n in batch2),
                                                         sorted(str(watch / n) for n in batch3)]
        assert sorted(p.name for p in (tmp_path / "dst" / "landed").iterdir()) == sorted(batch1 + batch2 + batch3)
        assert fired() == 3  # one watcher event per batch, none for files already reported
        print("LATENCY " + _latencies(redis_url, af, closed))
    finally:
        af.stop_all()
        agent.stop()
        agent_thread.join(timeout=30)
        receiver.stop()
