"""End to end with real Redis, a real receiver and a real agent on loopback: ``dag.test()``, retries, ``on_kill``."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote, unquote

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
pytest.importorskip("airflow")

from airflow.sdk.exceptions import AirflowException, TaskDeferred  # noqa: E402

from fstream_provider.bus.client import connect  # noqa: E402
from fstream_provider.bus.jobs import JobStore  # noqa: E402
from fstream_provider.bus.keys import Keys  # noqa: E402
from fstream_provider.operators.transfer import FStreamTransferOperator  # noqa: E402
from transfer_agent.receiving.receiver import Receiver  # noqa: E402
from transfer_agent.daemon.worker import Agent  # noqa: E402

import authkit  # noqa: E402
from airflowkit import api_server, browser_page, http, token  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SECRET = b"fstream-airflow-test-secret-0123456789"

_RUN_DAG = r"""
import json, os, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
dag_id, conf = sys.argv[1], json.loads(sys.argv[2])
bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
assert not bag.import_errors, bag.import_errors
dr = bag.dags[dag_id].test(run_conf=conf)
out = {"state": str(dr.state), "run_id": dr.run_id, "tis": {}, "xcom": {}}
with create_session() as s:
    for ti in dr.get_task_instances(session=s):
        out["tis"][ti.task_id] = str(ti.state)
    for x in s.query(XComModel).filter(XComModel.run_id == dr.run_id, XComModel.dag_id == dag_id):
        out["xcom"][x.task_id + ":" + x.key] = x.value
print("RESULT_JSON " + json.dumps(out, default=str))
"""


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    """A private AIRFLOW_HOME with a migrated sqlite database and the example DAGs folder."""
    home = tmp_path_factory.mktemp("airflow-home")
    env = dict(os.environ, AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "fstream_provider" / "example_dags"),
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
               FSTREAM_STATE_DIR=str(home / "fstream-state"))
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True,
                   timeout=300)
    return env


@pytest.fixture
def secret_file(tmp_path) -> str:
    p = tmp_path / "secret"
    p.write_bytes(SECRET)
    p.chmod(0o600)
    return str(p)


@pytest.fixture
def receiver(tmp_path):
    r = Receiver(listen=("127.0.0.1", 0), root=str(tmp_path / "dst"), secret=SECRET).start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def agent(redis_url, secret_file):
    a = Agent(redis_url, policy=authkit.policy(secret_file), name="airflow-test-agent", block_ms=200,
              poll_interval=0.1)
    t = threading.Thread(target=a.run, name="agent", daemon=True)
    t.start()
    try:
        yield a
    finally:
        a.stop()
        t.join(timeout=30)
        assert not t.is_alive(), "agent did not stop"


def _dataset(root: Path, n: int = 12) -> dict[str, str]:
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for i in range(n):
        p = root / f"shot{i:03d}.xtc"
        p.write_bytes(os.urandom(50_000 * (i + 1)))
        out[p.name] = _sha(p)
    return out


def _run_dag(env: dict, dag_id: str, conf: dict, timeout: float = 240) -> tuple[dict, str]:
    p = subprocess.run([sys.executable, "-c", _RUN_DAG, dag_id, json.dumps(conf)], env=env, capture_output=True,
                       text=True, timeout=timeout)
    text = p.stdout + p.stderr
    m = re.search(r"^RESULT_JSON (.*)$", p.stdout, re.M)
    assert m, f"dag.test produced no result (rc {p.returncode}):\n{text[-4000:]}"
    return json.loads(m.group(1)), text


@pytest.mark.slow
def test_dag_test_transfer_example_moves_verified_files_and_the_ui_serves_its_plot(airflow_env, redis_url, secret_file, receiver, agent,
                                                        tmp_path):
    src = _dataset(tmp_path / "src")
    env = dict(airflow_env, AIRFLOW_CONN_FSTREAM_DEFAULT=redis_url.replace("redis://", "fstream://", 1)
               + "?" + authkit.conn_query(), AIRFLOW__API__BASE_URL="http://airflow.example:8080/")
    conf = {"source": str(tmp_path / "src"), "destination": f"fstream://127.0.0.1:{receiver.port}/landed",
            "target_throughput": "800Mbps"}
    out, log = _run_dag(env, "fstream_transfer_example", conf)
    assert out["state"] == "success", log[-4000:]
    landed = tmp_path / "dst" / "landed"
    assert {p.name: _sha(p) for p in landed.iterdir()} == src  # every byte arrived, nothing extra (no temps)
    report = out["xcom"]["transfer:return_value"]
    assert report["files"] == report["verified_files"] == len(src) and report["failed_files"] == 0
    assert report["bytes"] == sum(50_000 * (i + 1) for i in range(len(src)))
    assert report["timeline"]["intervals"] and report["target_throughput_bps"] == 800e6
    assert out["xcom"]["transfer:job_id"] == report["job_id"]
    # The task log an operator reads: interval lines, the summary table, the plot path.
    assert re.search(r"t=\s*\d+\.\ds\s+[\d.]+ [kMG]?bit/s \(target 800\.00 Mbit/s", log), log[-3000:]
    assert "| files" in log and "verified " + str(len(src)) in log
    # The plot (issue 31): not drawn by the finishing task (no plot_dir), but served by the provider's plugin;
    # the extra link and the log name its absolute URL, not a path the UI would take for one of its routes.
    plot = report["plot"]
    run_id = quote(out["run_id"], safe="")
    assert plot == f"http://airflow.example:8080/fstream/plot/fstream_transfer_example/{run_id}/transfer/-1.png"
    assert plot in log and out["xcom"]["transfer:_link_FStreamPlotLink"] == plot
    assert out["xcom"]["transfer:fstream_conn_id"] == "fstream_default"
    assert not list((Path(airflow_env["FSTREAM_STATE_DIR"]) / "plots").rglob("*.png"))
    # ... and the api-server's plugin draws it when asked, behind Airflow's auth
    with api_server(env) as base:
        path = f"/fstream/plot/fstream_transfer_example/{run_id}/transfer/-1.png"
        assert http(base + path)[0] in (401, 403)  # no token: refused
        tok = token(base)
        status, ctype, body = http(base + path, tok)
        assert (status, ctype, body[:4]) == (200, "image/png", b"\x89PNG"), body[:300]
        status, ctype, body = http(base + f"/fstream/page/fstream_transfer_example/{run_id}/transfer/%7BMAP_INDEX%7D",
                                   tok)  # an unmapped task: the UI leaves {MAP_INDEX} as it is
        assert status == 200 and f'src="../../../..{path[len("/fstream"):]}"' in body.decode(), body[:500]
        status, _, body = http(base + f"/fstream/plot/fstream_transfer_example/{run_id}/nope/-1.png", tok)
        assert status == 404 and "has no FStream job" in body.decode()
        assert http(base + "/fstream/docs/index.md")[0] in (401, 403)  # the docs the Providers page links
        status, ctype, body = http(base + "/fstream/docs/index.md", tok)
        assert status == 200 and ctype.startswith("text/html") and "<h1" in body.decode() and "FStream" in body.decode()
        assert http(base + "/fstream/docs/img/live-job.png", tok)[2][:4] == b"\x89PNG"
        assert http(base + "/fstream/docs/..%2Fsecret", tok)[0] == 404
        providers = json.loads(http(base + "/api/v2/providers", tok)[2])["providers"]
        (fstream,) = [p for p in providers if p["package_name"] == "fstream"]
        assert fstream["documentation_url"] == "fstream/docs/index.md"  # the Providers page's link (ui.doc_link)
        plugins = json.loads(http(base + "/api/v2/plugins", tok)[2])["plugins"]
        (ours,) = [p for p in plugins if p["name"] == "fstream"]
        views = {v["name"]: v for v in ours["external_views"]}
        assert views["Transfer"]["destination"] == "task_instance"
        assert views["Transfer"]["href"] == "/fstream/page/{DAG_ID}/{RUN_ID}/{TASK_ID}/{MAP_INDEX}"
        assert (views["FStream"]["destination"], views["FStream"]["href"]) == ("nav", "/fstream/live")
        # in a real browser: the task instance's "Transfer" tab shows the finished job and its drawn plot
        with browser_page(base, tok) as page:
            ti_url = f"{base}/dags/fstream_transfer_example/runs/{run_id}/tasks/transfer"
            page.goto(ti_url)
            try:
                page.get_by_text("Transfer", exact=True).click(timeout=15_000)
                img = page.frame_locator("iframe").locator("img#plot")
                img.wait_for(timeout=30_000)
            except Exception:
                page.screenshot(path="/tmp/x/ui.png", full_page=True)
                raise
            page.wait_for_function("() => [...document.querySelectorAll('iframe')].some(f => { const i = "
                                   "f.contentDocument && f.contentDocument.querySelector('img#plot'); "
                                   "return i && i.complete && i.naturalWidth > 0 })", timeout=30_000)
            assert unquote(page.url).startswith(unquote(ti_url)) and "Page Not Found" not in page.content()
            from playwright.sync_api import expect

            frame = page.frame_locator("iframe")  # the live view of a job that ended: its final state and files
            expect(frame.locator("#status")).to_have_text("finished: succeeded", timeout=30_000)
            expect(frame.locator("#files tbody tr")).to_have_count(len(src), timeout=30_000)


class _TI:
    """The few task-instance fields the operator reads (dag/run/task ids, map index, try number, XCom push)."""

    def __init__(self, try_number: int = 1) -> None:
        self.dag_id, self.run_id, self.task_id, self.map_index, self.try_number = "d", "manual__1", "transfer", -1, try_number
        self.xcom: dict = {}

    def xcom_push(self, key, value):
        self.xcom[key] = value

    def xcom_pull(self, task_ids, key, map_indexes=None):
        return self.xcom.get(key)


def _deferred_job_id(op, ti) -> str:
    op.deferrable = True  # the default follows [operators] default_deferrable (False)
    with pytest.raises(TaskDeferred) as exc:
        op.execute({"ti": ti})
    return exc.value.trigger.job_id


def test_retry_reattaches_instead_of_starting_a_second_job(monkeypatch, redis_url, redis_client, secret_file):
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", redis_url.replace("redis://", "fstream://", 1)
                       + "?" + authkit.conn_query())
    kw = dict(task_id="transfer", sources=["/data/a"], destination="fstream://127.0.0.1:9/x", deferrable=True)
    first = _deferred_job_id(FStreamTransferOperator(**kw), _TI(1))
    # try 2 (a retry after a worker crash, or a rerun): a fresh operator instance, same task instance key
    second = _deferred_job_id(FStreamTransferOperator(**kw), _TI(2))
    assert second == first
    store = JobStore(redis_client, keys=Keys())
    assert len(store.list()) == 1 and redis_client.xlen(Keys().jobs_stream()) == 1
    # once that job has ended in failure, a retry must actually retry: one new attempt, keyed by try number
    assert store.cancel(first, "test: make the first attempt fail")
    third = _deferred_job_id(FStreamTransferOperator(**kw), _TI(3))
    assert third != first and store.get(third).idempotency_key == "d/manual__1/transfer/-1#try3"
    assert _deferred_job_id(FStreamTransferOperator(**kw), _TI(3)) == third


def test_on_kill_cancels_a_running_stream(monkeypatch, redis_url, redis_client, secret_file, receiver, agent, tmp_path):
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", redis_url.replace("redis://", "fstream://", 1)
                       + "?" + authkit.conn_query())
    _dataset(tmp_path / "watch", n=2)
    op = FStreamTransferOperator(task_id="stream", sources=[str(tmp_path / "watch")], watch=True, interval="0.2s",
                                 destination=f"fstream://127.0.0.1:{receiver.port}/stream", deferrable=False,
                                 poll_interval=0.2, plot_dir=str(tmp_path / "plots"))
    ti = _TI(1)
    errors: list[BaseException] = []

    def run():
        try:
            op.execute({"ti": ti})
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    store = JobStore(redis_client, keys=Keys())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
            "job_id" in ti.xcom and (st := store.get(ti.xcom["job_id"])) and st.state == "running"):
        time.sleep(0.05)  # polling a state in another process/thread with a deadline
    assert store.get(ti.xcom["job_id"]).state == "running"
    op.on_kill()
    t.join(timeout=60)
    assert not t.is_alive()
    st = store.get(ti.xcom["job_id"])
    assert st.state == "cancelled" and "killed" in (st.error or "")
    assert errors and isinstance(errors[0], AirflowException) and "cancelled" in str(errors[0])


def _conn_env(airflow_env: dict, redis_url: str, secret_file: str) -> dict:
    return dict(airflow_env, AIRFLOW_CONN_FSTREAM_DEFAULT=redis_url.replace("redis://", "fstream://", 1)
                + "?" + authkit.conn_query())


@pytest.mark.slow
def test_dag_test_sra_batch_ships_each_new_file_once(airflow_env, redis_url, secret_file, receiver, agent, tmp_path):
    out_dir = tmp_path / "outgoing"
    out_dir.mkdir()
    old = time.time() - 60  # closed a minute ago: complete on the first look (min_age=5 s in the DAG)
    first = {}
    for i in range(3):
        p = out_dir / f"SRR{i:04d}.sra"
        p.write_bytes(os.urandom(30_000 + i))
        os.utime(p, (old, old))
        first[p.name] = _sha(p)
    (out_dir / "README.txt").write_text("not an SRA run")
    env = _conn_env(airflow_env, redis_url, secret_file)
    conf = {"outgoing": str(out_dir), "destination": f"fstream://127.0.0.1:{receiver.port}/sra", "min_files": 1}
    out, log = _run_dag(env, "fstream_sra_batch", conf)
    assert out["state"] == "success", log[-4000:]
    assert sorted(out["xcom"]["new_runs:return_value"]) == sorted(str(out_dir / n) for n in first)
    (day,) = (tmp_path / "dst" / "sra").iterdir()
    assert {p.name: _sha(p) for p in day.iterdir()} == first
    assert out["xcom"]["totals:return_value"]["files"] == 3

    # The next night: only the new run is shipped, never the three already reported.
    p = out_dir / "SRR0099.sra"
    p.write_bytes(os.urandom(1234))
    os.utime(p, (old, old))
    out2, log2 = _run_dag(env, "fstream_sra_batch", conf)
    assert out2["state"] == "success", log2[-4000:]
    assert out2["xcom"]["new_runs:return_value"] == [str(p)]
    assert out2["xcom"]["transfer:return_value"]["files"] == 1


@pytest.mark.slow
def test_dag_test_lcls_stream_ships_files_written_while_it_runs(airflow_env, redis_url, secret_file, receiver, agent,
                                                               tmp_path):
    run_dir = tmp_path / "xtc"
    src = _dataset(run_dir, n=4)
    late = run_dir / "late.xtc"
    env = _conn_env(airflow_env, redis_url, secret_file)
    conf = {"run_dir": str(run_dir), "destination": f"fstream://127.0.0.1:{receiver.port}/lcls",
            "target_throughput": "200Mbps", "idle_exit": "3s"}
    client_store = JobStore(connect(redis_url), keys=Keys())

    def write_late_file():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until the stream job runs, then write one more file
            if any(j.state == "running" for j in client_store.list()):
                tmp = run_dir / ".late.xtc.tmp"
                tmp.write_bytes(os.urandom(77_777))
                tmp.rename(late)
                return
            time.sleep(0.05)

    writer = threading.Thread(target=write_late_file, daemon=True)
    writer.start()
    out, log = _run_dag(env, "fstream_lcls_stream", conf)
    writer.join(timeout=10)
    client_store.client.close()
    assert out["state"] == "success", log[-4000:]
    src["late.xtc"] = _sha(late)
    assert {p.name: _sha(p) for p in (tmp_path / "dst" / "lcls").iterdir()} == src
    rep = out["xcom"]["stream_run:return_value"]
    assert rep["files"] == rep["verified_files"] == 5 and rep["target_throughput_bps"] == 200e6
    assert out["xcom"]["report:return_value"].startswith("run streamed: 5 files")


def test_deferral_timeout_cancels_the_job(monkeypatch, redis_url, redis_client):
    from airflow.sdk.bases.operator import TriggerFailureReason
    from airflow.sdk.exceptions import TaskDeferralTimeout

    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", redis_url.replace("redis://", "fstream://", 1)
                       + "?" + authkit.conn_query())
    ti = _TI(1)
    op = FStreamTransferOperator(task_id="transfer", sources=["/data/a"], destination="fstream://127.0.0.1:9/x",
                                 deferrable=True)
    job_id = _deferred_job_id(op, ti)
    resumed = FStreamTransferOperator(task_id="transfer", sources=["/data/a"], destination="fstream://127.0.0.1:9/x")
    with pytest.raises(TaskDeferralTimeout):
        resumed.resume_execution("__fail__", {"error": TriggerFailureReason.TRIGGER_TIMEOUT}, {"ti": ti})
    st = JobStore(redis_client, keys=Keys()).get(job_id)
    assert st.state == "cancelled" and "timed out" in st.error


# -- issue 9: what a DAG author meets in real use -------------------------------------------------------------
_CORRECTNESS_DAGS = '''
from datetime import datetime
from airflow.sdk import DAG
from fstream_provider.operators.transfer import FStreamTransferOperator

KW = dict(sources=["{{ params.source }}"], destination="{{ params.destination }}", retries=0)
with DAG("fstream_typo_conn", schedule=None, start_date=datetime(2026, 1, 1), params={"source": "", "destination": ""}):
    FStreamTransferOperator(task_id="transfer", fstream_conn_id="fstream_typo", deferrable=True, **KW)
with DAG("fstream_no_agent", schedule=None, start_date=datetime(2026, 1, 1), params={"source": "", "destination": ""}):
    FStreamTransferOperator(task_id="transfer", deferrable=True, agent_timeout="1s", **KW)
with DAG("fstream_templated_layout", schedule=None, start_date=datetime(2026, 1, 1),
         params={"source": "", "destination": "", "p": 3, "cc": 2}):
    FStreamTransferOperator(task_id="transfer", tuner="fixed", cc="{{ params.cc }}", p="{{ params.p }}", pp=1,
                            watch="{{ 'false' }}", agent_timeout="{{ '1s' }}", **KW)
'''


@pytest.fixture
def correctness_env(airflow_env, tmp_path, redis_url, secret_file):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "fstream_correctness.py").write_text(_CORRECTNESS_DAGS)
    return dict(airflow_env, AIRFLOW__CORE__DAGS_FOLDER=str(dags), FSTREAM_REDIS_URL=redis_url,
                AIRFLOW_CONN_FSTREAM_DEFAULT=redis_url.replace("redis://", "fstream://", 1)
                + "?" + authkit.conn_query())


def test_a_misspelled_connection_fails_the_task_at_once_naming_it(correctness_env, tmp_path):
    """It used to fall back to $FSTREAM_REDIS_URL / an embedded Redis and stay deferred for ever."""
    t0 = time.monotonic()
    out, log = _run_dag(correctness_env, "fstream_typo_conn",
                        {"source": str(tmp_path), "destination": "fstream://127.0.0.1:9/x"}, timeout=90)
    assert out["tis"]["transfer"] == "failed", log[-3000:]
    assert "'fstream_typo' is not defined" in log and "AIRFLOW_CONN_FSTREAM_TYPO" in log, log[-3000:]
    assert time.monotonic() - t0 < 80


@pytest.mark.slow
def test_no_live_agent_warns_at_submit_and_fails_after_agent_timeout_deferred(correctness_env, tmp_path, redis_client):
    out, log = _run_dag(correctness_env, "fstream_no_agent",
                        {"source": str(tmp_path), "destination": "fstream://127.0.0.1:9/x"}, timeout=120)
    assert out["tis"]["transfer"] == "failed", log[-3000:]
    assert "No FStream agent is alive" in log and "fstream agent --redis" in log, log[-3000:]
    assert "no live agent on the bus (agent_timeout 1 s)" in log, log[-3000:]
    job = JobStore(redis_client, keys=Keys()).get(out["xcom"]["transfer:job_id"])
    assert job.state == "cancelled"  # nothing left queued for an agent that starts later


def test_no_live_agent_fails_after_agent_timeout_polling(monkeypatch, redis_url, redis_client):
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", redis_url.replace("redis://", "fstream://", 1)
                       + "?" + authkit.conn_query())
    op = FStreamTransferOperator(task_id="transfer", sources=["/data/a"], destination="fstream://127.0.0.1:9/x",
                                 deferrable=False, poll_interval=0.2, agent_timeout="1s")
    t0 = time.monotonic()
    with pytest.raises(AirflowException, match="no live agent on the bus"):
        op.execute({"ti": _TI(1)})
    assert time.monotonic() - t0 < 15
    assert JobStore(redis_client, keys=Keys()).get(op._job_id).state == "cancelled"


@pytest.mark.slow
def test_templated_layout_and_flags_render_and_reach_the_spec(correctness_env, tmp_path, redis_client):
    conf = {"source": str(tmp_path), "destination": "fstream://127.0.0.1:9/x", "p": 3, "cc": 2}
    out, log = _run_dag(correctness_env, "fstream_templated_layout", conf, timeout=120)
    spec = JobStore(redis_client, keys=Keys()).get(out["xcom"]["transfer:job_id"]).spec
    assert (spec.cc, spec.p, spec.pp, spec.watch) == (2, 3, 1, False), log[-3000:]
    assert "agent_timeout 1 s" in log  # the templated agent_timeout was rendered and used (no agent here)
    out, log = _run_dag(correctness_env, "fstream_templated_layout", dict(conf, p="three"), timeout=120)
    assert out["tis"]["transfer"] == "failed" and "p='three' must be an integer" in log, log[-3000:]


def test_clear_of_a_finished_task_redoes_the_work(monkeypatch, redis_url, redis_client, secret_file, receiver, agent,
                                                 tmp_path):
    """Clear raises the try number; a finished job under the task's key is not re-attached but redone."""
    monkeypatch.setenv("AIRFLOW_CONN_FSTREAM_DEFAULT", redis_url.replace("redis://", "fstream://", 1)
                       + "?" + authkit.conn_query())
    src = _dataset(tmp_path / "src", n=4)
    kw = dict(task_id="transfer", sources=[str(tmp_path / "src")], destination=f"fstream://127.0.0.1:{receiver.port}/c",
              deferrable=False, poll_interval=0.2, plot_dir=str(tmp_path / "plots"), agent_timeout="1s")
    first = FStreamTransferOperator(**kw)
    assert first.execute({"ti": _TI(1)})["verified_files"] == 4  # with an agent alive, agent_timeout never fires
    landed = tmp_path / "dst" / "c"
    (landed / "shot002.xtc").unlink()  # someone deletes a landed file; the user clears the task
    second = FStreamTransferOperator(**kw)
    report = second.execute({"ti": _TI(2)})
    assert second._job_id != first._job_id, "Clear re-attached to the finished job"
    assert {p.name: _sha(p) for p in landed.iterdir()} == src
    assert report["verified_files"] == 1 and report["skipped_files"] == 3, report
