"""What a transfer task writes: log lines once at their level, per-cluster summary, XCom, asset events, plot, lineage.

Real Redis, a real receiver and agents on loopback, real Airflow ``dag.test()`` in a subprocess (its own DAG file
with an outlet asset and a downstream task reading the XCom), the plot written through Airflow's
``ObjectStoragePath``.
"""

from __future__ import annotations

import json
import logging
import re
import textwrap
import threading

import pytest

pytest.importorskip("airflow")

from test_airflow_integration import (  # noqa: E402,F401 - fixtures used by name
    _RUN_DAG, _dataset, _run_dag, agent, airflow_env, receiver, secret_file)

import authkit  # noqa: E402

from fstream_provider.model.plot import PANELS, decisions, plot_png, render_plot  # noqa: E402
from fstream_provider.model.tasklog import build_report, live_event_line, summary_table  # noqa: E402
from fstream_provider.operators.lineage import lineage_datasets, operator_lineage  # noqa: E402
from fstream_provider.operators.links import FStreamPlotLink, plot_location, write_plot  # noqa: E402

_DAG = '''
"""Test DAG: a watched transfer with an outlet asset, and a task that reads the landed files from its XCom."""
import datetime as dt
from airflow.sdk import DAG, Asset, task
from fstream_provider.operators.transfer import FStreamTransferOperator

LANDED = Asset("fstream-report-landed")
with DAG("fstream_report_test", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False):
    transfer = FStreamTransferOperator(
        task_id="transfer", sources=[{source!r}], destination={destination!r}, target_throughput="800Mbps",
        watch=True, interval="0.2s", idle_exit="1.5s", tuner_options={{"sample_interval": "0.2s"}},
        plot_dir={plot_dir!r}, outlets=[LANDED], retries=0, deferrable=True)

    @task
    def consume(report):
        return sorted(f["destination"] for f in report["landed_files"])

    consume(transfer.output)
'''

_ASSET_EVENTS = r"""
from airflow.models.asset import AssetEvent
with create_session() as s:
    print("ASSET_JSON " + json.dumps([e.extra for e in s.query(AssetEvent).all()], default=str))
"""

# an interval line, whoever logs it (trigger or operator): the text, and its cc/p/pp layout
INTERVAL_LINE = re.compile(r"\] (t=\s*[\d.]+s .*?cc/p/pp (.+?)  files .*?)\s+\[[\w.]+\] loc=")


def _dag_env(airflow_env, redis_url, secret_file, tmp_path, dag_text: str) -> dict:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "report_dag.py").write_text(dag_text)
    return dict(airflow_env, AIRFLOW__CORE__DAGS_FOLDER=str(dags),
                AIRFLOW_CONN_FSTREAM_DEFAULT=redis_url.replace("redis://", "fstream://", 1)
                + "?" + authkit.conn_query())


def test_dag_test_report_logs_once_summarises_per_cluster_and_hands_files_downstream(
        airflow_env, redis_url, secret_file, receiver, agent, tmp_path, monkeypatch):
    src = _dataset(tmp_path / "src", n=6)
    dest = f"fstream://127.0.0.1:{receiver.port}/landed"
    env = _dag_env(airflow_env, redis_url, secret_file, tmp_path, _DAG.format(
        source=str(tmp_path / "src"), destination=dest, plot_dir=(tmp_path / "plots").as_uri()))
    monkeypatch.setattr("test_airflow_integration._RUN_DAG", _RUN_DAG + _ASSET_EVENTS)
    out, log = _run_dag(env, "fstream_report_test", {})
    assert out["state"] == "success", log[-4000:]
    report = out["xcom"]["transfer:return_value"]
    timeline = report["timeline"]

    # 1. each interval line exactly once (the trigger logs them live, execute_complete does not repeat them)
    lines = INTERVAL_LINE.findall(log)
    assert timeline["intervals"] >= 2 and len(lines) == timeline["intervals"], log[-4000:]
    assert len({text for text, _ in lines}) == len(lines)
    # ... and the summary's final layout and change count are what those lines say (per cluster)
    layouts = [layout for _, layout in lines]
    changes = sum(1 for a, b in zip(layouts, layouts[1:]) if a != b)
    assert re.search(rf"\| final cc/p/pp\s+\| {re.escape(layouts[-1])}\s+\|", log), log[-3000:]
    assert re.search(rf"\| parameter changes\s+\| {changes}\s+\|", log)
    assert timeline["final_layout"] == layouts[-1] and timeline["parameter_changes"] == changes

    # 2. XCom: landed files (URL, size, source), bounded (no interval timeline); a downstream task reads them
    assert "intervals" not in report
    names = {f.rsplit("/", 1)[1]: f for f in out["xcom"]["consume:return_value"]}
    assert set(names) == set(src) and all(u.startswith(f"fstream://127.0.0.1:{receiver.port}/landed/")
                                          for u in names.values())
    sizes = {f["destination"].rsplit("/", 1)[1]: f["size"] for f in report["landed_files"]}
    assert sizes == {p.name: p.stat().st_size for p in (tmp_path / "src").iterdir()}
    m = re.search(r"^ASSET_JSON (.*)$", log, re.M)
    (extra,) = json.loads(m.group(1))
    assert extra["job_id"] == report["job_id"]
    assert sorted(f["destination"] for f in extra["files"]) == sorted(names.values())

    # 3. the plot, written at the file:// plot_dir, and the extra link stored for the UI
    plot = report["plot"]
    assert plot.startswith(str(tmp_path / "plots") + "/") and plot in log  # file:// plot_dir: shown as its path
    assert open(plot, "rb").read(4) == b"\x89PNG"
    assert plot == out["xcom"]["transfer:plot"]
    assert out["xcom"]["transfer:_link_FStreamPlotLink"] == ""  # no absolute [api] base_url: no link that cannot work

    # 4. OpenLineage on the finished run: source files in, landed files out
    lineage = operator_lineage(report)
    assert {(d.namespace, d.name) for d in lineage.inputs} == {
        ("file://airflow-test-agent", str(tmp_path / "src" / n)) for n in src}
    assert {(d.namespace, d.name) for d in lineage.outputs} == {
        (f"fstream://127.0.0.1:{receiver.port}", f"/landed/{n}") for n in src}
    from fstream_provider.operators.transfer import FStreamTransferOperator

    class TI:  # what the OpenLineage listener hands over after the run: the task instance, its XCom
        def xcom_pull(self, task_ids, key):
            return report if (task_ids, key) == ("transfer", "return_value") else None

    op = FStreamTransferOperator(task_id="transfer", sources=["/x"], destination=dest)
    facets = op.get_openlineage_facets_on_complete(TI())
    assert [(d.namespace, d.name) for d in facets.outputs] == [(d.namespace, d.name) for d in lineage.outputs]


@pytest.fixture
def retrying_agent(redis_url, secret_file):
    from transfer_agent.daemon.worker import Agent

    a = Agent(redis_url, policy=authkit.policy(secret_file), name="retry-agent-7", block_ms=200, poll_interval=0.1,
              max_retries=1, retry_base_s=0.05)
    t = threading.Thread(target=a.run, name="agent", daemon=True)
    t.start()
    try:
        yield a
    finally:
        a.stop()
        t.join(timeout=30)


@pytest.mark.slow
def test_dag_test_retry_and_error_events_are_warnings(airflow_env, redis_url, secret_file, retrying_agent, tmp_path):
    _dataset(tmp_path / "src", n=1)
    dead = "fstream://127.0.0.1:9/nowhere"  # nothing listens on port 9 (discard): a retryable connection failure
    env = _dag_env(airflow_env, redis_url, secret_file, tmp_path, _DAG.format(
        source=str(tmp_path / "src"), destination=dead, plot_dir=str(tmp_path / "plots")))
    out, log = _run_dag(env, "fstream_report_test", {})
    assert out["tis"]["transfer"] == "failed", log[-4000:]
    # the agent's session retries and the job's error, logged live by the trigger at WARNING (were INFO)
    retries = re.findall(r"\[(\w+)\s*\] agent: session failed: .*; retry \d+ \[fstream_provider\.triggers", log)
    errors = re.findall(r"\[(\w+)\s*\] error: cannot connect to receiver 127\.0\.0\.1:9", log)
    assert retries and set(retries) == {"warning"}, log[-4000:]
    assert errors and set(errors) == {"warning"}, log[-4000:]


def _interval(t, small, large=None, reason="", pending=3):
    clusters = {"small": dict(zip(("cc", "p", "pp"), small))}
    if large:
        clusters["large"] = dict(zip(("cc", "p", "pp"), large))
    cc = sum(c["cc"] for c in clusters.values())
    return {"kind": "interval", "t": t, "throughput_bps": 5e8 + t * 1e6, "cc": cc, "p": 4, "pp": 2,
            "clusters": clusters, "files_done": int(t), "files_pending": pending, "reason": reason}


def test_summary_counts_per_cluster_changes_the_overall_cc_hides():
    # small 2→3 channels while large 3→2: the overall cc stays 5, the interval lines show a change
    ivs = [_interval(1, (2, 1, 4), (3, 4, 1)), _interval(2, (3, 1, 4), (2, 4, 1), reason="move a channel")]
    events = [(str(i), e) for i, e in enumerate(ivs)] + [("9", {"kind": "done", "state": "succeeded", "result": {}})]
    report = build_report("j1", events, None)
    assert report["timeline"]["parameter_changes"] == 1 and report["timeline"]["final_layout"] == \
        "small 3/1/4 · large 2/4/1"
    table = summary_table(report, [{k: v for k, v in e.items() if k != "kind"} for e in ivs], None)
    assert re.search(r"\| parameter changes \| 1\s+\|", table) and "small 3/1/4 · large 2/4/1" in table


def test_xcom_report_stays_bounded_for_a_long_stream():
    events = [(str(i), _interval(i, (2 + i % 3, 1, 4))) for i in range(43_200)]  # 12 h at 1 s sampling
    events += [(f"f{i}", {"kind": "file", "path": f"d/f{i}", "source": f"/s/f{i}", "size": 10, "status": "committed"})
               for i in range(50)]
    events.append(("z", {"kind": "done", "state": "succeeded", "result": {"intervals": [e for _, e in events[:10]]}}))
    report = build_report("j", events, 1e9, "fstream://h:4000/d")
    assert "intervals" not in report and report["timeline"]["intervals"] == 43_200
    assert len(json.dumps(report)) < 20_000
    assert report["landed_files"][0] == {"path": "d/f0", "destination": "fstream://h:4000/d/f0", "source": "/s/f0",
                                         "size": 10, "status": "committed"}


def test_live_lines_levels():
    assert live_event_line({"kind": "retry", "try": 1, "delay": 0.5, "message": "refused"})[0] == logging.WARNING
    assert live_event_line({"kind": "error", "message": "boom"})[0] == logging.WARNING
    assert live_event_line({"kind": "file", "status": "failed", "path": "a", "reason": "x"})[0] == logging.ERROR
    assert live_event_line({"kind": "interval", "t": 1, "throughput_bps": 1})[0] == logging.INFO
    assert live_event_line({"kind": "file", "status": "committed"}) is None
    assert live_event_line({"kind": "log", "level": "warning", "message": "session failed"}) == (
        logging.WARNING, "agent: session failed")
    # the agents' scheduler (issue #11): why the job started, and a preemption with what stays committed
    assert live_event_line({"kind": "scheduled", "reason": "steal: start j cc=4"}) == (
        logging.INFO, "scheduler: steal: start j cc=4")
    assert live_event_line({"kind": "preempted", "reason": "steal: preempt j for k", "by": "k",
                            "committed_bytes": 38_797_312}) == (
        logging.WARNING, "preempted: steal: preempt j for k; 37.00 MiB committed stay and are not sent again")


def _timeline():
    return [_interval(0.5, (2, 1, 4), pending=5), _interval(1.0, (2, 1, 4), pending=4),
            _interval(1.5, (4, 1, 4), (1, 4, 1), reason="fstream: throughput below target, add channels", pending=2),
            _interval(2.0, (4, 1, 4), (1, 4, 1), pending=0)]


def test_plot_has_three_panels_integer_ticks_and_decision_markers():
    fig = render_plot(_timeline(), 8e8, title="t")
    axes = fig.get_axes()
    assert len(axes) == len(PANELS) == 3
    tp, ch, pend = axes
    assert [ax.get_ylabel() for ax in axes] == ["Mbit/s", "channels / streams", "files pending"]
    assert all(float(v).is_integer() for v in ch.get_yticks()) and all(float(v).is_integer() for v in pend.get_yticks())
    assert {line.get_label() for line in ch.get_lines()} >= {"small channels", "large streams"}
    assert decisions(_timeline()) == [(1.5, "fstream: throughput below target, add channels")]
    (note,) = [a.get_text() for a in tp.texts]  # compact: numbered, the reason cut to 28 characters
    assert note.startswith("1: fstream: throughput below") and note.endswith("…") and len(note) == 3 + 28


def test_plot_written_through_object_storage_file_and_memory(tmp_path):
    import fsspec
    from airflow.sdk.io import attach

    data = plot_png(_timeline(), 8e8)
    url = write_plot(plot_location(tmp_path.as_uri(), "dag", "manual__2024-01-01T00:00:00+00:00", "t", "j1"), data)
    assert url == str(tmp_path / "dag" / "manual__2024-01-01T00_00_00_00_00" / "t-j1.png")
    assert (tmp_path / "dag" / "manual__2024-01-01T00_00_00_00_00" / "t-j1.png").read_bytes()[:4] == b"\x89PNG"
    mem = fsspec.filesystem("memory")
    attach("memory", fs=mem)
    url = write_plot(plot_location("memory://plots", "d", "r", "t", "j"), data)
    assert url == "memory://plots/d/r/t-j.png" and mem.cat("/plots/d/r/t-j.png")[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="plot_dir is empty"):
        plot_location(" ", "d", "r", "t", "j")


def test_plot_link_is_the_plugins_absolute_url_or_none(monkeypatch):
    """Issue 31: the old link was a file path, which the UI took for one of its own routes (its 404 page)."""
    from types import SimpleNamespace

    class Op:
        _report = {"plot": "/srv/plots/d/r/t-j.png"}

    key = SimpleNamespace(dag_id="d", run_id="manual__2026-01-01T00:00:00+00:00", task_id="t", map_index=-1)
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.org/")
    assert (FStreamPlotLink().get_link(Op(), ti_key=key)
            == "https://airflow.example.org/fstream/plot/d/manual__2026-01-01T00%3A00%3A00%2B00%3A00/t/-1.png")
    assert FStreamPlotLink().get_link(object(), ti_key=key) == ""  # deferred, no report yet
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "/")
    assert FStreamPlotLink().get_link(Op(), ti_key=key) == ""  # a bare path would open the UI's 404 page


def test_lineage_datasets_name_source_host_and_receiver():
    report = {"agent": "dtn01.example.org-4242", "destination": "fstream://dtn02:7700/in",
              "landed_files": [{"path": "in/a.h5", "destination": "fstream://dtn02:7700/in/a.h5",
                                "source": "/data/a.h5", "size": 1}]}
    assert lineage_datasets(report) == ([("file://dtn01.example.org", "/data/a.h5")],
                                        [("fstream://dtn02:7700", "/in/a.h5")])
