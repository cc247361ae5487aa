"""A transfer's last sliver (issue 41): the same numbers in the task log, summary, XCom, plot and live views.

The agent records an interval every ``sample_interval_s`` and a last one when the transfer ends, however short:
a 0.08 s sliver at 34.2 Mbit/s after 1 s intervals at ~40 Mbit/s showed as a dip in both charts, a second log
line and the timeline's minimum, and the FStream page showed it as the finished job's rate. The records here
have the agent's shape (``transfer_agent.sending.intervals.interval_record`` plus its live fields) and go through
the bus as its runner publishes them (``JobStore.claim``/``publish``/``finish``); the end-to-end test runs the
operator in Airflow's ``dag.test()`` against a real Redis.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time

import pytest

from fstream_provider.bus.client import connect
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.live import job_detail, overview
from fstream_provider.model.intervals import LiveFold, fold_slivers, job_interval
from fstream_provider.model.plot import render_plot
from fstream_provider.model.spec import TransferSpec
from fstream_provider.model.tasklog import (build_report, interval_stats, intervals_from_events, live_event_line,
                                            summary_table)
from fstream_provider.model.units import format_rate

import authkit

TARGET = 40e6
MB = 1_000_000


def record(t: float, dt: float, nbytes: int, done: int, pending: int, *, reason: str = "", cc: int = 2,
           total: int = 40) -> dict:
    """An interval record as the agent publishes it (``interval_record`` and ``progress.LiveProgress.fields``)."""
    bps = nbytes * 8 / dt
    return {"t": t, "dt": dt, "bytes": nbytes, "throughput_bps": bps, "cc": cc, "p": 4, "pp": 2,
            "clusters": {"large": {"cc": cc, "p": 4, "pp": 2, "throughput_bps": bps, "pending_files": pending}},
            "passive": 0, "active_files": 1 if pending else 0, "files_done": done, "files_failed": 0,
            "files_pending": pending, "files_total": total, "target_bps": TARGET, "reason": reason,
            "bytes_total": total * 8 * 2**20, "bytes_done": done * 8 * 2**20, "bytes_left": (total - done) * 8 * 2**20,
            "eta": {"s": 1.0 * pending, "lo": 0.8 * pending, "hi": 1.2 * pending, "rate_bps": bps, "basis": "rolling"}}


def timeline() -> list[dict]:
    """Three 1 s intervals near 40 Mbit/s, then the 0.08 s sliver at 34.2 Mbit/s the issue saw."""
    return [record(1.0, 1.0, 4_990_000, 12, 28, reason="start: 2 channels"),
            record(2.0, 1.0, 5_010_000, 25, 15, cc=3, reason="raise cc: below target"),
            record(3.0, 1.0, 4_980_000, 39, 1, cc=3),
            record(3.08, 0.08, 342_000, 40, 0, cc=3)]


def folded_rates(recs: list[dict]) -> list[float]:
    """The rates of ``timeline()`` as every view must show them, worked out by hand: the sliver added to the third."""
    return [recs[0]["throughput_bps"], recs[1]["throughput_bps"],
            (recs[2]["bytes"] + recs[3]["bytes"]) * 8 / (recs[2]["dt"] + recs[3]["dt"])]


# ---------------------------------------------------------------------------------------------------- the model
def test_a_last_sliver_is_folded_into_the_interval_before_it():
    recs = timeline()
    out = fold_slivers(recs)
    assert len(out) == 3 and out[:2] == recs[:2]
    last, before, sliver = out[-1], recs[2], recs[3]
    assert last["dt"] == pytest.approx(before["dt"] + sliver["dt"])
    assert last["bytes"] == before["bytes"] + sliver["bytes"]
    assert last["throughput_bps"] == pytest.approx((before["bytes"] + sliver["bytes"]) * 8 / (1.0 + 0.08))
    assert last["clusters"]["large"]["throughput_bps"] == pytest.approx(last["throughput_bps"])
    # the newer state is the sliver's: it ends the merged interval
    assert (last["t"], last["files_done"], last["files_pending"], last["eta"]) == (3.08, 40, 0, sliver["eta"])
    assert last["folded"] == 1
    assert recs[3]["dt"] == 0.08 and "folded" not in recs[2]  # the input is unchanged
    assert fold_slivers(out) == out  # folding a folded timeline changes nothing
    assert job_interval(recs) == 1.0


def test_folding_a_folded_timeline_changes_nothing():
    """The summary folds what the report already folded: each pass used to take a new reference (the median of
    the folded lengths) and fold again (6 records -> 4 -> 3, found in review)."""
    recs = [{"t": float(i), "dt": dt, "bytes": 1000, "throughput_bps": 8000 / dt}
            for i, dt in enumerate([1, 0.09, 1, 0.09, 1, 0.101])]
    once = fold_slivers(recs)
    assert len(once) == 4 and fold_slivers(once) == once


def test_what_is_not_a_sliver_stays():
    recs = timeline()
    assert fold_slivers(recs[:3]) == recs[:3]
    lone = [record(0.05, 0.05, 1000, 1, 0)]  # nothing before it to fold into
    assert fold_slivers(lone) == lone
    old = [{k: v for k, v in r.items() if k != "dt"} for r in recs]  # an older agent's records: no length
    assert fold_slivers(old) == old
    tenth = recs[:3] + [record(3.1, 0.1, 500_000, 40, 0)]  # a tenth exactly: an interval, not a sliver
    assert len(fold_slivers(tenth)) == 4
    # the sliver's own reason wins; without one, the reason of the interval it joins stays
    tuned = recs[:3] + [dict(recs[3], reason="hold: done")]
    assert fold_slivers(tuned)[-1]["reason"] == "hold: done"
    assert fold_slivers(recs[:2] + [dict(recs[3], dt=0.05)])[-1]["reason"] == "raise cc: below target"


def test_the_live_log_writes_no_line_for_a_sliver_and_the_summary_carries_it():
    recs, prev, lines = timeline(), None, []
    for rec in recs:  # as the trigger calls it: one event at a time, the previous interval beside it
        line = live_event_line({"kind": "interval", **rec}, TARGET, prev)
        if line is not None:
            lines.append(line[1])
        prev = rec
    assert len(lines) == 3 and not any(format_rate(recs[3]["throughput_bps"]) in line for line in lines)
    assert "85%" not in " ".join(lines)  # the sliver's 34.2 Mbit/s of a 40 Mbit/s target
    # a reason only the sliver carries (no tuning event gave it) is still said, once
    said = live_event_line({"kind": "interval", **dict(recs[3], reason="tuner error, layout kept")}, TARGET, recs[2])
    assert said == (logging.INFO, "tuner: tuner error, layout kept")

    st = interval_stats(recs)  # raw records: folded inside too
    assert st["intervals"] == len(lines) == 3
    assert st["min_throughput_bps"] == pytest.approx(min(folded_rates(recs)))
    assert st["min_throughput_bps"] > 39e6  # not the sliver's 34.2
    result = {"files": 40, "verified_files": 40, "bytes": sum(r["bytes"] for r in recs), "seconds": 3.08,
              "throughput_bps": sum(r["bytes"] for r in recs) * 8 / 3.08}
    table = summary_table(result, recs, TARGET)
    assert f"(min {format_rate(st['min_throughput_bps'])}, " in table and "3 (min" in table
    assert "34.2" not in table


def test_the_live_stream_replaces_the_last_interval_with_the_folded_one():
    recs = timeline()
    live = LiveFold()
    assert [live.add(r) for r in recs[:3]] == [None, None, None]
    folded = live.add(recs[3])
    assert folded["throughput_bps"] == pytest.approx(folded_rates(recs)[-1]) and live.last == folded
    assert folded["t"] == 3.08 and folded["folded"] == 1


def test_the_plot_draws_the_folded_timeline():
    recs = timeline()
    fig = render_plot(recs, TARGET)
    if fig is None:
        pytest.skip("matplotlib is not installed")
    ys = list(fig.axes[0].get_lines()[0].get_ydata())
    assert ys == pytest.approx([r / 1e6 for r in folded_rates(recs)])


# ---------------------------------------------------------------------------------------------------- the bus
class Runner:
    """A job driven as the agent's runner drives it: claim, publish (events and ``progress``), finish."""

    def __init__(self, url: str, job_id: str) -> None:
        self.client = connect(url)
        from fstream_provider.authz.outcome import load_signer  # this process's agent key, which tasks trust

        self.store = JobStore(self.client, outcome_signer=load_signer(None, "runner"))
        self.job_id = job_id
        self.entry = next(eid for eid, f in self.client.xrange(self.store.keys.jobs_stream())
                          if f.get("job_id") == job_id)
        claim = self.store.claim(job_id, self.entry, worker="fold-test-agent", max_deliveries=5)
        assert claim.outcome == "claimed", claim
        self.attempt = claim.attempt

    def interval(self, rec: dict) -> None:
        owner, _ = self.store.publish(self.job_id, self.attempt, [("interval", time.time(), rec)],
                                      fields={"progress": json.dumps(rec)})
        assert owner

    def finish(self, recs: list[dict]) -> dict:
        nbytes, secs = sum(r["bytes"] for r in recs), sum(r["dt"] for r in recs)
        result = {"files": 40, "verified_files": 40, "skipped_files": 0, "failed_files": 0, "bytes": nbytes,
                  "seconds": secs, "throughput_bps": nbytes * 8 / secs, "intervals": recs}
        assert self.store.finish(self.job_id, self.attempt, self.entry, state="succeeded", result=result)
        return result

    def close(self) -> None:
        self.client.close()


def _submit(url: str, label: str, key: str | None = None) -> str:
    client = connect(url)
    try:
        return JobStore(client, signer=authkit.signer()).submit(
            TransferSpec(sources=[f"/data/{label}"], destination="fstream://127.0.0.1:9/x", label=label,
                         target_throughput_bps=TARGET), idempotency_key=key)[0]
    finally:
        client.close()


def test_the_overview_shows_a_finished_jobs_average_and_the_job_view_its_folded_timeline(redis_url):
    recs = timeline()
    job_id = _submit(redis_url, "fold-overview")
    run = Runner(redis_url, job_id)
    try:
        for rec in recs:
            run.interval(rec)
        result = run.finish(recs)
        row = next(r for r in overview(run.client, Keys())["jobs"] if r["job_id"] == job_id)
        assert row["state"] == "succeeded" and row["throughput_bps"] == pytest.approx(result["throughput_bps"])
        detail = job_detail(run.store, job_id)
        assert detail["throughput_bps"] == pytest.approx(result["throughput_bps"])  # the tab: the same average
        assert [r["throughput_bps"] for r in detail["intervals"]] == pytest.approx(folded_rates(recs))
        assert detail["spark"] == pytest.approx(folded_rates(recs))
    finally:
        run.close()


def test_a_live_job_stream_sends_the_sliver_as_a_fold_of_the_last_interval(redis_url):
    from fstream_provider.ui import bus_conn, sse

    recs = timeline()
    job_id = _submit(redis_url, "fold-stream")
    run = Runner(redis_url, job_id)
    for rec in recs[:3]:
        run.interval(rec)

    class Request:
        async def is_disconnected(self) -> bool:
            return False

    async def read() -> list[tuple[str, dict]]:
        stream = sse.job_stream(Request(), bus_conn.Bus("test", redis_url, "fstream"), job_id, block_ms=100)
        frames: list[tuple[str, dict]] = []
        try:
            async for chunk in stream:
                for msg in chunk.split("\n\n"):
                    ev = re.search(r"^event: (\w+)$", msg, re.M)
                    data = re.search(r"^data: (.*)$", msg, re.M)
                    if ev and data:
                        frames.append((ev.group(1), json.loads(data.group(1))))
                if frames and frames[-1][0] == "snapshot":  # the page has the three intervals: the sliver comes
                    await asyncio.to_thread(run.interval, recs[3])
                    await asyncio.to_thread(run.finish, recs)
                if frames and frames[-1][0] == "end":
                    return frames
        finally:
            await stream.aclose()
        return frames

    try:
        frames = asyncio.run(asyncio.wait_for(read(), 30))
    finally:
        run.close()
    kinds = [k for k, _ in frames]
    assert "fold" in kinds, kinds
    fold = next(d for k, d in frames if k == "fold")
    assert fold["throughput_bps"] == pytest.approx(folded_rates(recs)[-1])
    assert not any(k == "event" and d.get("kind") == "interval" for k, d in frames)  # no sliver as an interval
    rows = [d for k, d in frames if k == "row"]
    assert rows and rows[-1]["throughput_bps"] == pytest.approx(sum(r["bytes"] for r in recs) * 8 / 3.08)


# ---------------------------------------------------------------------------------------------------- Airflow
_DAG = '''
"""Test DAG: one deferrable transfer whose job the test drives as an agent would."""
import datetime as dt
from airflow.sdk import DAG
from fstream_provider.operators.transfer import FStreamTransferOperator

with DAG("fstream_fold_test", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False):
    FStreamTransferOperator(task_id="transfer", sources=["/data/fold"], destination="fstream://127.0.0.1:9/x",
                            target_throughput="40Mbps", retries=0, deferrable=True)
'''
INTERVAL_LINE = re.compile(r"\] (t=\s*[\d.]+s\s+([\d.]+ [kMG]?bit/s) .*?cc/p/pp .+?  files .*?)\s+\[[\w.]+\] loc=")


@pytest.mark.slow
def test_dag_test_log_summary_xcom_and_overview_agree(redis_url, tmp_path_factory, tmp_path):
    pytest.importorskip("airflow")
    from test_airflow_integration import _run_dag

    env = _airflow_env(tmp_path_factory)
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "fold_dag.py").write_text(_DAG)
    env = dict(env, AIRFLOW__CORE__DAGS_FOLDER=str(dags),
               AIRFLOW_CONN_FSTREAM_DEFAULT=redis_url.replace("redis://", "fstream://", 1) + "?" + authkit.conn_query())
    recs, box = timeline(), {}

    def drive() -> None:  # the agent: claims the operator's job, publishes its intervals and the sliver, finishes
        client = connect(redis_url)
        try:
            store = JobStore(client)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and "job" not in box:
                job = next((j for j in store.list(10) if "/data/fold" in j.spec.sources), None)
                if job is not None and job.state == "queued":
                    box["job"] = job.job_id
                else:
                    time.sleep(0.05)  # polling another process's submit with a deadline
            run = Runner(redis_url, box["job"])
            for rec in recs:
                run.interval(rec)
            box["result"] = run.finish(recs)
            run.close()
        except Exception as exc:  # noqa: BLE001 - said by the test's assertion
            box["error"] = exc
        finally:
            client.close()

    t = threading.Thread(target=drive, name="fold-runner", daemon=True)
    t.start()
    out, log = _run_dag(env, "fstream_fold_test", {})
    t.join(30)
    assert "error" not in box, box.get("error")
    assert out["state"] == "success", log[-4000:]
    report = out["xcom"]["transfer:return_value"]
    folded = folded_rates(recs)

    # the log: one line per folded interval, none at the sliver's rate, no second "85 %"
    lines = INTERVAL_LINE.findall(log)
    assert len(lines) == len(folded) == report["timeline"]["intervals"] == 3, log[-4000:]
    assert format_rate(recs[3]["throughput_bps"]) not in log and "85%" not in log
    # the summary and the XCom: the folded minimum, the job's average
    mins = min(folded)
    assert report["timeline"]["min_throughput_bps"] == pytest.approx(mins)
    assert re.search(rf"\| intervals\s+\| 3 \(min {re.escape(format_rate(mins))}, ", log), log[-3000:]
    assert report["throughput_bps"] == pytest.approx(box["result"]["throughput_bps"])
    assert re.search(rf"\| throughput\s+\| {re.escape(format_rate(report['throughput_bps']))}\s+\|", log)
    # the live views read the same bus: the overview's row and the job view's timeline say the same
    client = connect(redis_url)
    try:
        row = next(r for r in overview(client, Keys())["jobs"] if r["job_id"] == box["job"])
        detail = job_detail(JobStore(client), box["job"])
        events = JobStore(client).all_events(box["job"])
    finally:
        client.close()
    assert row["throughput_bps"] == pytest.approx(report["throughput_bps"])
    assert [r["throughput_bps"] for r in detail["intervals"]] == pytest.approx(folded)
    assert build_report(box["job"], events, TARGET)["timeline"] == report["timeline"]
    assert [r["throughput_bps"] for r in intervals_from_events(events)] == pytest.approx(folded)


def _airflow_env(tmp_path_factory) -> dict:
    import os
    import subprocess
    import sys

    home = tmp_path_factory.mktemp("airflow-home")
    env = dict(os.environ, AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
               FSTREAM_STATE_DIR=str(home / "fstream-state"))
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True,
                   timeout=300)
    return env
