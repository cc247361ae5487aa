"""The live view of FStream transfers in the Airflow 3 UI (issue 27), as a person uses it.

A real ``airflow api-server`` (tests/airflowkit.py) with the provider's plugin, a real ``redis-server``, task
instances made by ``dag.test()`` of the DAGs below, and Debian's Chromium driven by Playwright: the top-level
"FStream" page and the task instance's "Transfer" tab, framed by Airflow's UI. Most jobs are driven here through
``JobStore`` exactly as an agent's runner publishes (``claim``, ``publish`` with the ``progress`` field,
``release``, ``finish``), so every number the page must show is known; one test runs a real agent and receiver
(``FStreamTransferOperator`` deferring in ``dag.test()``, a paced transfer) and reads the page while it moves.

Access: SimpleAuthManager has no per-DAG roles, so the api-server runs a SimpleAuthManager subclass written by
this test (``AUTH_MANAGER``): the same users plus ``viewer`` (role VIEWER) who may not read one DAG. The
plugin asks the auth manager only through Airflow's API (``requires_access_*``, ``get_authorized_dag_ids``).

``FSTREAM_SCREENSHOTS=1`` rewrites docs/airflow/img/live-overview.png and live-job.png (``FSTREAM_DOCS_SCREENSHOTS=DIR``
writes them into DIR, as tests/test_airflow_integration.py does its own).
"""

from __future__ import annotations

import http.client as httpclient
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from urllib.parse import quote

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
pytest.importorskip("airflow")
pytest.importorskip("playwright")

from fstream_provider.bus.client import connect  # noqa: E402
from fstream_provider.bus.embedded import RedisServer  # noqa: E402
from fstream_provider.bus.jobs import JobStore  # noqa: E402
from fstream_provider.bus.keys import Keys  # noqa: E402
from fstream_provider.model.spec import TransferSpec  # noqa: E402
from fstream_provider.model.units import format_rate  # noqa: E402

import authkit  # noqa: E402
from agentkit import wait_until  # noqa: E402
from airflowkit import api_server, browser_page, http, plugin_frame, token  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SHOTS = REPO / "docs" / "airflow" / "img"
DAG, HIDDEN_DAG, AGENT_DAG = "fstream_live_view", "fstream_live_view_hidden", "fstream_live_view_agent"
AGENT_NS = "fsagent"
TAB = "fstream-transfer"

DAGS = r'''
"""DAGs of tests/test_airflow_live_view.py: tasks that submit a job (driven by the test), and a real transfer."""
from datetime import datetime

from airflow.sdk import DAG, task

from fstream_provider.operators.transfer import FStreamTransferOperator


def _submit(ti, label):
    from fstream_provider.hooks.fstream import FStreamHook
    from fstream_provider.model.spec import TransferSpec

    mi = -1 if ti.map_index is None else ti.map_index
    spec = TransferSpec(sources=[f"/data/{label}"], destination="fstream://127.0.0.1:9/landed", label=label,
                        target_throughput_bps=4e8)
    job_id, _ = FStreamHook().submit(spec, idempotency_key=f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{mi}")
    ti.xcom_push(key="job_id", value=job_id)
    ti.xcom_push(key="fstream_conn_id", value="fstream_default")


with DAG("fstream_live_view", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    @task
    def transfer(**context):
        _submit(context["ti"], "live-view")

    @task
    def shard(part, **context):
        _submit(context["ti"], f"shard-{part}")

    transfer()
    shard.expand(part=[0, 1])

with DAG("fstream_live_view_hidden", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    @task
    def transfer(**context):
        _submit(context["ti"], "hidden")

    transfer()

with DAG("fstream_live_view_agent", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    FStreamTransferOperator(task_id="transfer", fstream_conn_id="fstream_live_agent",
                            sources="{{ dag_run.conf['source'] }}", destination="{{ dag_run.conf['destination'] }}",
                            target_throughput="{{ dag_run.conf['target'] }}", deferrable=True)
'''

AUTH_MANAGER = r'''
"""SimpleAuthManager plus a user ``viewer`` (role VIEWER) who may read every DAG but one (tests only)."""
import os

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

# the simple manager reads its users from the config on every call (login included): add ``viewer`` to them
os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] = (
    os.environ.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS") or "admin:admin") + ",viewer:viewer"


class OneDagHiddenAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        if getattr(user, "username", None) == "viewer" and details is not None \
                and details.id == os.environ["FSTREAM_TEST_HIDDEN_DAG"]:
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
'''

_RUN_DAGS = r"""
import json, os, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
assert not bag.import_errors, bag.import_errors
conf = json.loads(sys.argv[2])
for dag_id in sys.argv[1].split(","):
    dr = bag.dags[dag_id].test(run_conf=conf)
    out = {"dag_id": dag_id, "state": str(dr.state), "run_id": dr.run_id, "xcom": {}}
    with create_session() as s:
        for x in s.query(XComModel).filter(XComModel.run_id == dr.run_id, XComModel.dag_id == dag_id):
            out["xcom"][f"{x.task_id}[{x.map_index}]:{x.key}"] = x.value
    print("RESULT_JSON " + json.dumps(out, default=str), flush=True)
"""


def _run_dags(env: dict, dag_ids: list[str], conf: dict | None = None, timeout: float = 300) -> dict[str, dict]:
    p = subprocess.run([sys.executable, "-c", _RUN_DAGS, ",".join(dag_ids), json.dumps(conf or {})], env=env,
                       capture_output=True, text=True, timeout=timeout)
    found = {json.loads(m)["dag_id"]: json.loads(m) for m in re.findall(r"^RESULT_JSON (.*)$", p.stdout, re.M)}
    assert set(found) == set(dag_ids), f"dag.test failed (rc {p.returncode}):\n{(p.stdout + p.stderr)[-4000:]}"
    return found


def _xcom_value(v):
    return json.loads(v) if isinstance(v, str) and v.startswith('"') else v


@pytest.fixture(scope="module")
def bus(tmp_path_factory):
    server = RedisServer(str(tmp_path_factory.mktemp("redis")))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def site(tmp_path_factory, bus):
    """AIRFLOW_HOME (migrated), the DAG runs of the driven tasks, and a running api-server: a dict."""
    home = tmp_path_factory.mktemp("airflow-home")
    dags = home / "dags"
    dags.mkdir()
    (dags / "fstream_live_view_dags.py").write_text(DAGS)
    lib = home / "lib"
    lib.mkdir()
    (lib / "fstream_live_test_auth.py").write_text(AUTH_MANAGER)
    conn = bus.replace("redis://", "fstream://", 1) + "?" + authkit.conn_query()
    env = dict(os.environ, AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__CORE__DAGS_FOLDER=str(dags), AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
               FSTREAM_STATE_DIR=str(home / "fstream-state"), AIRFLOW_CONN_FSTREAM_DEFAULT=conn,
               AIRFLOW_CONN_FSTREAM_LIVE_AGENT=conn + f"&namespace={AGENT_NS}",
               AIRFLOW_CONN_NOT_FSTREAM="http://example.org", FSTREAM_TEST_HIDDEN_DAG=HIDDEN_DAG,
               AIRFLOW__CORE__AUTH_MANAGER="fstream_live_test_auth.OneDagHiddenAuthManager",
               PYTHONPATH=os.pathsep.join([str(lib), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True,
                   timeout=300)
    runs = _run_dags(env, [DAG, HIDDEN_DAG])
    with api_server(env) as base:
        passwords = json.loads((home / "test-passwords.json").read_text())
        yield {"env": env, "base": base, "runs": runs, "admin": token(base),
               "viewer": token(base, "viewer", passwords["viewer"]), "home": home}


def _job_id(site: dict, dag_id: str, task: str, map_index: int = -1) -> str:
    return _xcom_value(site["runs"][dag_id]["xcom"][f"{task}[{map_index}]:job_id"])


def _ti_path(site: dict, dag_id: str, task: str, map_index: int | str = -1) -> str:
    run = quote(site["runs"][dag_id]["run_id"], safe="")
    return f"{quote(dag_id, safe='')}/{run}/{task}/{map_index}"


class Driven:
    """One job, driven as an agent's runner drives it: claim (fenced by attempt), publish, release, finish."""

    def __init__(self, url: str, job_id: str, keys: Keys | None = None) -> None:
        self.client = connect(url)
        from fstream_provider.authz.outcome import load_signer  # this process's agent key, which tasks trust

        self.store = JobStore(self.client, keys=keys or Keys(), outcome_signer=load_signer(None, "driven"))
        self.job_id, self.attempt, self.t = job_id, 0, 0.0
        self.live: dict = {}  # the agent's ETA, lag and deadline state, once it reports them
        k = self.store.keys
        self.entry = next(eid for eid, f in self.client.xrange(k.jobs_stream()) if f.get("job_id") == job_id)

    def claim(self, worker: str = "live-test-agent") -> None:
        c = self.store.claim(self.job_id, self.entry, worker=worker, max_deliveries=9)
        assert c.outcome == "claimed", c
        self.attempt = c.attempt

    def interval(self, bps: float, **extra) -> float:
        """Publish one interval record; returns the wall time (ms) just before it was published."""
        self.t += 1.0
        self.live.update({k: extra.pop(k) for k in ("eta", "lag", "deadline") if k in extra})  # reported each time
        rec = {"t": self.t, "dt": 1.0, "throughput_bps": bps, "cc": 2, "p": 4, "pp": 2, "target_bps": 4e8,
               "files_done": int(self.t), "files_pending": 10 - int(self.t), "files_failed": 0, "files_total": 10,
               "bytes_done": int(self.t) * 2**20, "bytes_total": 10 * 2**20, "reason": "", **self.live, **extra}
        at = time.time() * 1000
        owner, _ = self.store.publish(self.job_id, self.attempt, [("interval", time.time(), rec)],
                                      fields={"progress": json.dumps(rec)})
        assert owner
        return at

    def event(self, kind: str, data: dict) -> None:
        assert self.store.publish(self.job_id, self.attempt, [(kind, time.time(), data)])[0]

    def release(self) -> None:
        assert self.store.release(self.job_id, self.attempt, "agent stopping (test restart)")

    def finish(self, state: str = "succeeded") -> None:
        assert self.store.finish(self.job_id, self.attempt, self.entry, state=state,
                                 result={"files": 10, "bytes": 10 * 2**20, "verified_files": 10, "failed_files": 0})

    def close(self) -> None:
        self.client.close()


def _seen(frame, view: str, bps: float, timeout_ms: int = 15_000) -> float:
    """When (ms, wall clock) the page showed ``bps`` for the first time."""
    frame.wait_for_function("([v, b]) => window.fstreamSeen && window.fstreamSeen.some(s => s.view === v && "
                            "s.throughput_bps === b)", arg=[view, bps], timeout=timeout_ms)
    return frame.evaluate("([v, b]) => window.fstreamSeen.find(s => s.view === v && s.throughput_bps === b).at",
                          [view, bps])


def _shot(page, name: str) -> None:
    """docs/airflow/img/NAME with FSTREAM_SCREENSHOTS=1, or DIR/NAME with FSTREAM_DOCS_SCREENSHOTS=DIR."""
    where = os.environ.get("FSTREAM_DOCS_SCREENSHOTS") or (
        str(SHOTS) if os.environ.get("FSTREAM_SCREENSHOTS", "") not in ("", "0") else "")
    if where:
        page.screenshot(path=os.path.join(where, name))


# ---------------------------------------------------------------------------------------------------- tests
def test_the_overview_and_the_transfer_tab_follow_a_running_job_live(site, bus):
    base, run_id = site["base"], site["runs"][DAG]["run_id"]
    job = Driven(bus, _job_id(site, DAG, "transfer"))
    delays: dict[str, list[float]] = {"overview": [], "job": []}
    try:
        job.claim()
        job.event("tuning", {"t": 0.5, "reason": "start: 2 channels x 4 streams for 10 files",
                             "layouts": {"all": [2, 4, 2]}})
        for bps in (1.5e8, 2.5e8):
            job.interval(bps)
        job.event("file", {"path": "a/shot000.h5", "source": "/data/a/shot000.h5", "size": 2**20, "status": "failed",
                           "reason": "connection reset"})
        job.event("file", {"path": "a/shot000.h5", "source": "/data/a/shot000.h5", "size": 2**20,
                           "status": "committed", "checksum": "0123456789abcdef0123", "algo": "xxh3_128"})
        for i in (1, 2, 3):
            job.event("file", {"path": f"a/shot00{i}.h5", "source": f"/data/a/shot00{i}.h5", "size": 2**20,
                               "status": "committed" if i < 3 else "skipped"})
        job.interval(3.25e8, cc=4, reason="raise cc: throughput below target",
                     eta={"s": 42.0, "lo": 30.0, "hi": 54.0, "rate_bps": 3.25e8, "basis": "rolling"},
                     lag={"oldest_s": 3.5, "p50_s": 1.2, "p99_s": 2.9, "landed": 4},
                     deadline={"at": time.time() + 60, "target_bps": 4e8, "state": "at-risk",
                               "message": "the ETA's upper bound passes the deadline by 14 s"})
        with browser_page(base, site["admin"]) as page:
            page.set_viewport_size({"width": 1600, "height": 1000})
            # the top-level "FStream" page of Airflow's navigation, framing /fstream/live
            page.goto(base + "/plugin/fstream")
            ov = plugin_frame(page, "/fstream/live")
            row = ov.locator(f"tr[data-job='{job.job_id}']")
            row.wait_for(timeout=30_000)
            assert page.get_by_text("FStream", exact=True).first.is_visible()  # the nav entry
            ov.wait_for_function(f"() => document.querySelector(\"tr[data-job='{job.job_id}'] .rate\")"
                                 f".textContent.startsWith('{format_rate(3.25e8)}')", timeout=15_000)
            text = row.inner_text()
            for want in ("running", "live-test-agent", "42 s ± 12 s", "p50 1.2 s", "4/4/2", "3 / 7 / 0", "at-risk",
                         "raise cc: throughput below target", f"{DAG}.transfer"):
                assert want in text, (want, text)
            assert "risk" in row.get_attribute("class")  # the row turns red
            assert row.locator("svg.spark polyline").count() == 1  # the sparkline
            for bps in (3.5e8, 3.75e8):
                at = job.interval(bps)
                delays["overview"].append(_seen(ov, "overview", bps) - at)
            _shot(page, "live-overview.png")
            # from the overview to the task instance's "Transfer" tab
            ov.get_by_role("link", name=f"{DAG}.transfer").click()
            page.wait_for_url(re.compile(rf".*/tasks/transfer/plugin/{TAB}$"), timeout=15_000)
            jv = plugin_frame(page, "/fstream/page/")
            jv.locator("#summary dd.rate").wait_for(timeout=30_000)
            jv.wait_for_function(f"() => document.querySelector('#summary dd.rate').textContent === '{format_rate(3.75e8)}'",
                                 timeout=15_000)
            summary = jv.locator("#summary").inner_text()
            for want in ("running", "live-test-agent / 1", format_rate(4e8), "42 s ± 12 s", "oldest waiting 3.5 s",
                         "at-risk", "2/4/2", "5 done / 5 pending / 0 failed of 10"):  # (cc back to 2)
                assert want in summary, (want, summary)
            assert "risk" in jv.locator("#summary").get_attribute("class")
            assert jv.locator("#chart polyline.thr").count() == 1 and jv.locator("#chart polyline.tgt").count() == 1
            assert jv.locator("#chart line.chg title").first.text_content().endswith("raise cc: throughput below target")
            assert "start: 2 channels x 4 streams" in jv.locator("#decisions").inner_text()
            files = jv.locator("#files tbody tr").first.inner_text()
            assert "a/shot000.h5" in files and "committed" in files and "xxh3_128 0123456789abcdef" in files
            assert files.split("\t")[-1].strip() == "1"  # one failed attempt before
            assert jv.locator("img#plot").count() == 1
            assert jv.locator("a", has_text="task log").get_attribute("href").endswith(
                f"/dags/{DAG}/runs/{quote(run_id, safe='')}/tasks/transfer")
            # pushed: each new interval record reaches the page without a reload
            for i in range(5):
                bps = 3.0e8 + i * 1.25e7
                at = job.interval(bps, reason=f"hold {i}")
                delays["job"].append(_seen(jv, "job", bps) - at)
            jv.wait_for_function(f"() => document.querySelector('#summary dd.rate').textContent === '{format_rate(3.5e8)}'",
                                 timeout=15_000)
            _shot(page, "live-job.png")
            shown = jv.evaluate("() => [document.querySelector('#chart polyline.thr').getAttribute('points').split(' ')"
                                ".length, document.querySelectorAll('#files tbody tr').length]")
            events = job.store.all_events(job.job_id)
            assert shown == [sum(1 for _i, e in events if e["kind"] == "interval"), 4]  # matches the job's events
            # a reload shows the same state (a snapshot, then the stream again)
            page.reload()
            jv = plugin_frame(page, "/fstream/page/")
            jv.wait_for_function(f"() => document.querySelector('#summary dd.rate') && document.querySelector("
                                 f"'#summary dd.rate').textContent === '{format_rate(3.5e8)}'", timeout=30_000)
            assert jv.evaluate("() => document.querySelector('#chart polyline.thr').getAttribute('points')"
                               ".split(' ').length") == shown[0]
            # the agent restarts: the job is released and claimed again (attempt 2); its events keep coming
            job.release()
            job.claim("live-test-agent-2")
            bps = 3.9e8
            job.interval(bps)
            _seen(jv, "job", bps)
            jv.wait_for_function("() => document.querySelector('#summary').textContent.includes('live-test-agent-2 / 2')",
                                 timeout=15_000)
            assert "claimed by live-test-agent-2 (attempt 2)" in jv.locator("#events").inner_text()
            # the job finishes while the page is open: its final state, and the stream is closed
            job.finish("succeeded")
            jv.wait_for_function("() => document.getElementById('status').textContent === 'finished: succeeded'",
                                 timeout=15_000)
            assert "succeeded" in jv.locator("#title").inner_text()
            ov_page = page.context.new_page()
            ov_page.goto(base + "/fstream/live")
            ov_page.locator(f"tr[data-job='{job.job_id}'] .state").wait_for(timeout=30_000)
            ov_page.wait_for_function(f"() => document.querySelector(\"tr[data-job='{job.job_id}'] .state\")"
                                      ".textContent.startsWith('succeeded')", timeout=15_000)
    finally:
        job.close()
        print(f"\nfreshness (interval published -> value on the page), ms: overview "
              f"{[round(d) for d in delays['overview']]}, job view {[round(d) for d in delays['job']]}")
    assert delays["job"] and delays["overview"]


def test_the_job_stream_resumes_after_last_event_id_without_gaps(site, bus):
    base, tok = site["base"], site["admin"]
    job = Driven(bus, _job_id(site, DAG, "shard", 0))
    try:
        job.claim()
        job.interval(1e8)
        path = "/fstream/stream/" + _ti_path(site, DAG, "shard", 0)
        with _sse(base, path, tok) as s:
            hello, snap = s.next(), s.next()
            assert hello[0] == "hello" and snap[0] == "snapshot" and snap[2]["job_id"] == job.job_id
            assert [r["throughput_bps"] for r in snap[2]["intervals"]] == [1e8] and snap[1] == snap[2]["events_last_id"]
            job.interval(2e8)
            ev = s.next()
            assert ev[0] == "event" and ev[2]["kind"] == "interval" and ev[2]["throughput_bps"] == 2e8
            assert ev[1] == ev[2]["id"] and re.match(r"^\d+-\d+$", ev[1])  # SSE id = the Redis stream id
            row = s.next()
            assert row[0] == "row" and row[2]["throughput_bps"] == 2e8 and row[2]["attempt"] == 1
            last = ev[1]
        job.interval(3e8)  # while nobody listens
        job.interval(4e8)
        with _sse(base, path, tok, last_event_id=last) as s:
            assert s.next()[0] == "hello"
            assert s.next()[0] == "resume"
            got = []
            while len(got) < 2:
                e = s.next()
                if e[0] == "event":
                    got.append(e)
            assert [e[2]["throughput_bps"] for e in got] == [3e8, 4e8]  # both, once each, in order
            assert all(tuple(map(int, e[1].split("-"))) > tuple(map(int, last.split("-"))) for e in got)
        job.finish()
        with _sse(base, path, tok, last_event_id=last) as s:  # a late reconnect after the job ended
            kinds = [s.next()[0] for _ in range(2)]
            while kinds[-1] != "end":
                kinds.append(s.next()[0])
            assert "resume" in kinds and kinds[-1] == "end"
    finally:
        job.close()


def test_mapped_and_unmapped_task_instances_each_show_their_own_job(site, bus):
    base, tok = site["base"], site["admin"]
    jobs = {mi: Driven(bus, _job_id(site, DAG, "shard", mi)) for mi in (0, 1)}
    try:
        jobs[1].claim()
        old = {"t": 1.0, "throughput_bps": 7.5e8}  # an older agent's record: no cc/p/pp, files, ETA, lag, deadline
        assert jobs[1].store.publish(jobs[1].job_id, jobs[1].attempt, [("interval", time.time(), old)],
                                     fields={"progress": json.dumps(old)})[0]
        for mi in (0, 1):
            status, _, body = http(base + "/fstream/job/" + _ti_path(site, DAG, "shard", mi), tok)
            assert status == 200 and json.loads(body)["job_id"] == jobs[mi].job_id
        # an unmapped task: the UI leaves {MAP_INDEX} in the href as it is
        status, ctype, body = http(base + "/fstream/page/" + _ti_path(site, DAG, "transfer", "%7BMAP_INDEX%7D"), tok)
        assert status == 200 and ctype.startswith("text/html")
        assert json.loads(re.search(r'id="fstream-config" type="application/json">(.*?)</script>',
                                    body.decode()).group(1))["job_id"] == _job_id(site, DAG, "transfer")
        # a task instance with no job (yet): a note on the page, ``nojob`` on the stream (the browser asks again)
        assert http(base + "/fstream/job/" + _ti_path(site, DAG, "nope"), tok)[0] == 404
        status, _, body = http(base + "/fstream/page/" + _ti_path(site, DAG, "nope"), tok)
        assert status == 200 and "has no FStream job" in body.decode() and 'id="plot"' not in body.decode()
        with _sse(base, "/fstream/stream/" + _ti_path(site, DAG, "nope"), tok) as s:
            event, _id, data = s.next()
            assert event == "nojob" and "has no FStream job" in data["message"]
        run = quote(site["runs"][DAG]["run_id"], safe="")
        with browser_page(base, tok) as page:
            page.goto(f"{base}/dags/{DAG}/runs/{run}/tasks/shard/mapped/1")
            page.get_by_text("Transfer", exact=True).click(timeout=30_000)
            jv = plugin_frame(page, "/fstream/page/")
            jv.wait_for_function(f"() => document.getElementById('title').textContent.includes('{jobs[1].job_id}')",
                                 timeout=30_000)
            jv.wait_for_function(f"() => document.querySelector('#summary dd.rate').textContent === "
                                 f"'{format_rate(7.5e8)}'", timeout=15_000)
            assert "/shard/1" in jv.url
            summary = jv.locator("#summary").inner_text()
            for name in ("ETA", "lag", "deadline", "cc/p/pp", "target"):  # what the older agent did not say: "-"
                assert re.search(rf"^{re.escape(name)}\n-$", summary, re.M), (name, summary)
            assert "- done / - pending / - failed" in summary
            # its "task log" link takes the UI (not the frame) to the task instance's log
            jv.get_by_role("link", name="task log").click()
            page.wait_for_url(re.compile(r".*/tasks/shard/mapped/1$"), timeout=15_000)
            page.get_by_text("Logs", exact=True).first.wait_for(timeout=15_000)
    finally:
        for j in jobs.values():
            j.close()


def test_access_is_airflows_a_user_sees_only_the_transfers_of_dags_they_may_read(site, bus):
    base, admin, viewer = site["base"], site["admin"], site["viewer"]
    hidden = _job_id(site, HIDDEN_DAG, "transfer")
    visible = _job_id(site, DAG, "transfer")
    client = connect(bus)
    try:  # a job no Airflow task submitted (``fstream submit``): for those who may read the bus's connection
        free, _ = JobStore(client, signer=authkit.signer()).submit(
            TransferSpec(sources=["/data/free"], destination="fstream://127.0.0.1:9/x", label="cli job"))
    finally:
        client.close()
    ti_hidden = _ti_path(site, HIDDEN_DAG, "transfer")
    routes = ["/fstream/live", "/fstream/live/data", "/fstream/live/stream", "/fstream/page/" + ti_hidden,
              "/fstream/job/" + ti_hidden, "/fstream/stream/" + ti_hidden]
    for r in routes:  # no token: refused
        assert http(base + r)[0] in (401, 403), r
    ids = lambda tok: {j["job_id"] for j in json.loads(http(base + "/fstream/live/data", tok)[2])["jobs"]}  # noqa: E731
    assert {hidden, visible, free} <= ids(admin)
    seen = ids(viewer)
    assert visible in seen and free not in seen and hidden not in seen  # (tests/test_live_view_access.py: more)
    assert json.loads(http(base + "/fstream/live/data", viewer)[2])["hidden"]["jobs"] >= 1
    for r in routes[3:]:
        assert http(base + r, viewer)[0] == 403, r
    assert http(base + routes[3], admin)[0] == 200 and http(base + routes[4], admin)[0] == 200
    with _sse(base, routes[5], admin) as s:  # (the admin may read it: the stream opens)
        assert s.next()[0] == "hello"
    # which Redis: only an existing fstream connection
    assert http(base + "/fstream/live/data?conn_id=nope", admin)[0] == 404
    assert http(base + "/fstream/live/data?conn_id=not_fstream", admin)[0] == 400
    with browser_page(base, viewer) as page:
        page.goto(base + "/plugin/fstream")
        ov = plugin_frame(page, "/fstream/live")
        ov.locator(f"tr[data-job='{visible}']").wait_for(timeout=30_000)
        assert hidden not in ov.content() and HIDDEN_DAG not in ov.content() and free not in ov.content()
        assert "of DAGs you may not read are not shown" in ov.locator("#hidden").inner_text()


@pytest.mark.slow
def test_a_real_agent_moves_files_and_the_pages_show_its_numbers(site, bus, tmp_path, secret):
    from agentkit import make_files, start_receiver
    from transfer_agent.daemon.worker import Agent

    base, tok = site["base"], site["admin"]
    make_files(tmp_path / "src", {f"run/img_{i:03d}.h5": 3 * 2**20 for i in range(8)})
    rx = start_receiver(tmp_path / "dst", secret)
    agent = Agent(bus, policy=authkit.policy(str(secret)), name="live-view-agent", keys=Keys(AGENT_NS),
                  block_ms=200, poll_interval=0.1, flush_interval=0.2)
    t = threading.Thread(target=agent.run, name="agent", daemon=True)
    t.start()
    conf = {"source": str(tmp_path / "src" / "run"), "destination": f"fstream://127.0.0.1:{rx.port}/landed",
            "target": "8Mbps"}
    dag = subprocess.Popen([sys.executable, "-c", _RUN_DAGS, AGENT_DAG, json.dumps(conf)], env=site["env"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = connect(bus)
    store = JobStore(client, keys=Keys(AGENT_NS))
    try:
        job = wait_until(lambda: next((j for j in store.list(10) if j.state == "running" and j.progress), None),
                         120, "the agent's job to report an interval")
        ref = job.idempotency_key.split("/")
        assert ref[0] == AGENT_DAG and ref[2] == "transfer"
        run = quote(ref[1], safe="")
        with browser_page(base, tok) as page:
            page.goto(f"{base}/fstream/live?conn_id=fstream_live_agent")
            page.locator(f"tr[data-job='{job.job_id}'] .rate").wait_for(timeout=30_000)
            assert "live-view-agent" in page.locator("#agents").inner_text()  # its heartbeat
            jp = page.context.new_page()
            jp.goto(f"{base}/dags/{AGENT_DAG}/runs/{run}/tasks/transfer")
            jp.get_by_text("Transfer", exact=True).click(timeout=30_000)
            jv = plugin_frame(jp, "/fstream/page/")
            jv.locator("#summary dd.rate").wait_for(timeout=30_000)
            rates_shown, files_shown = [], []
            for _ in range(600):  # as intervals arrive the numbers change, each one of the job's records
                for seen, sel in ((rates_shown, "rate"), (files_shown, "files")):
                    txt = jv.locator(f"#summary dd.{sel}").text_content()
                    if txt not in seen and not txt.startswith("-"):
                        seen.append(txt)
                if len(files_shown) >= 3 or "succeeded" in jv.locator("#title").inner_text():
                    break
                jv.wait_for_timeout(100)
            ov_rate = page.locator(f"tr[data-job='{job.job_id}'] .rate").text_content()  # (read before the records)
            records = [e for _i, e in store.all_events(job.job_id) if e["kind"] == "interval"]
            final = store.get(job.job_id)
            if final.terminal and final.result:  # a finished job's rate is its average (bus.live.job_row)
                records.append({**final.progress, "throughput_bps": final.result["throughput_bps"]})
            rates = {format_rate(r["throughput_bps"]) for r in records} | {format_rate(0)}
            files = {f"{r['files_done']} done / {r['files_pending']} pending / {r['files_failed']} failed of "
                     f"{r['files_total']}" for r in records}
            assert len(files_shown) >= 2 and set(files_shown) <= files, (files_shown, files)
            assert rates_shown and set(rates_shown) <= rates, (rates_shown, rates)
            assert ov_rate in rates, (ov_rate, rates)  # the overview shows the same records
            # it finishes while the tab is open: the final state, every file committed
            jv.wait_for_function("() => document.getElementById('status').textContent === 'finished: succeeded'",
                                 timeout=180_000)
            assert jv.locator("#files tbody tr").count() == 8
            assert "committed" in jv.locator("#files tbody").inner_text()
        out, _ = dag.communicate(timeout=240)
        m = re.search(r"^RESULT_JSON (.*)$", out, re.M)
        assert m and json.loads(m.group(1))["state"] == "success", out[-3000:]
        assert len(list((tmp_path / "dst" / "landed").iterdir())) == 8
    finally:
        if dag.poll() is None:
            dag.kill()
            dag.wait(30)
        client.close()
        agent.stop()
        t.join(timeout=30)
        rx.stop()


def test_a_stream_ends_when_its_client_goes_and_gives_its_slot_back(bus):
    import asyncio

    from fstream_provider.ui import bus_conn, sse

    client = connect(bus)
    try:
        job_id, _ = JobStore(client, signer=authkit.signer()).submit(
            TransferSpec(sources=["/data/slot"], destination="fstream://127.0.0.1:9/x", label="slot"))
    finally:
        client.close()

    class Request:  # the client goes after the stream's second look
        looks = 0

        async def is_disconnected(self) -> bool:
            self.looks += 1
            return self.looks > 2

    slots = sse.Slots(1)
    assert slots.take() and not slots.take()  # the one slot is this stream's
    resp = sse.response(sse.job_stream(Request(), bus_conn.Bus("test", bus, "fstream"), job_id, block_ms=100), slots)

    async def drain() -> list[str]:
        return [c async for c in resp.body_iterator]

    chunks = asyncio.run(asyncio.wait_for(drain(), 30))
    assert chunks[0].startswith("retry: 3000\nevent: hello") and "event: snapshot" in chunks[1]
    assert slots.open == 0 and slots.take()  # given back when the stream ended


def test_the_overview_hides_what_would_name_a_hidden_job():
    from fstream_provider.ui.access import HIDDEN, Scope, visible_overview

    ov = {"generated_at": 1.0,
          "agents": [{"name": "a1", "job_id": "j-secret"}, {"name": "a2", "job_id": "j-open"}, {"name": "a3"}],
          "jobs": [{"job_id": "j-secret", "airflow": {"dag_id": "secret_dag"}},
                   {"job_id": "j-open", "airflow": {"dag_id": "open_dag"}}, {"job_id": "j-cli", "airflow": None}],
          "pools": [{"src": "s", "dst": "d", "grants": {"j-secret": {"streams": 2}, "j-open": {"streams": 3},
                                                        "j-unlisted": {"streams": 1}}}],
          "board": {"j-secret": {"state": "running"}, "j-open": {"state": "waiting"}, "j-unknown": {}}}
    seen = visible_overview(ov, {"open_dag"})  # a job without a task (j-cli): the bus's readers only
    assert [j["job_id"] for j in seen["jobs"]] == ["j-open"]
    assert [a.get("job_id") for a in seen["agents"]] == [HIDDEN, "j-open", None]
    # a grant of a job the listing does not hold is masked too (deny by default, as agents and the board)
    assert seen["pools"][0]["grants"] == {HIDDEN: {"streams": 3}, "j-open": {"streams": 3}}
    assert set(seen["board"]) == {"j-open"} and seen["hidden"] == {"jobs": 2, "board": 2}
    everything = visible_overview(ov, Scope(frozenset(), whole_bus=True))
    assert [j["job_id"] for j in everything["jobs"]] == ["j-secret", "j-open", "j-cli"]
    assert everything["hidden"]["jobs"] == 0 and "j-unlisted" in everything["pools"][0]["grants"]
    assert ov["jobs"][0]["job_id"] == "j-secret"  # the shared snapshot is not changed


# ---------------------------------------------------------------------------------------------------- helpers
class _sse:
    """A server-sent-events client on a raw HTTP connection: ``next()`` -> ``(event, id, data)``."""

    def __init__(self, base: str, path: str, tok: str, last_event_id: str | None = None) -> None:
        u = urllib.parse.urlsplit(base)
        self.conn = httpclient.HTTPConnection(u.hostname, u.port, timeout=15)
        headers = {"Authorization": f"Bearer {tok}", "Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        self.conn.request("GET", path, headers=headers)
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, (self.resp.status, self.resp.read()[:500])
        assert self.resp.getheader("content-type", "").startswith("text/event-stream")

    def __enter__(self) -> "_sse":
        return self

    def __exit__(self, *exc) -> None:
        self.conn.close()

    def next(self) -> tuple[str, str | None, object]:
        event, eid, data = "message", None, []
        while True:
            line = self.resp.readline().decode()
            assert line, "the stream ended"
            line = line.rstrip("\n")
            if not line:
                if data:
                    return event, eid, json.loads("\n".join(data))
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "id":
                eid = value
            elif name == "data":
                data.append(value)
