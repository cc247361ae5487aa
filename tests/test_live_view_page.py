"""The top-level "FStream" page as a person reads it (issue 41): fresh or stale, in Airflow's time, units and width.

One real ``airflow api-server`` for the module (tests/airflowkit.py), a real ``redis-server`` on a fixed port (stopped
and started again for the outage), one task instance made by ``dag.test()`` whose job the test drives as an agent's
runner publishes (``JobStore.claim``/``publish``), and Debian's Chromium (Playwright) in a browser set to a
12-hour, non-UTC locale, so a page that used the browser's clock would show it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
pytest.importorskip("airflow")
pytest.importorskip("playwright")

from fstream_provider.bus.client import connect  # noqa: E402
from fstream_provider.bus.embedded import RedisServer, free_port  # noqa: E402
from fstream_provider.bus.jobs import JobStore  # noqa: E402
from fstream_provider.provider_info import DOC_PAGES  # noqa: E402
from fstream_provider.tuning.deadline import plan  # noqa: E402
from fstream_provider.tuning.eta import Eta  # noqa: E402

import authkit  # noqa: E402
from airflowkit import api_server, browser_page, http, plugin_frame, token  # noqa: E402

DAG = "fstream_live_page_layout_of_a_long_dag_name"
TASK = "copy_the_detector_shots_to_the_cluster"
BROWSER = {"timezone_id": "America/Los_Angeles", "locale": "en-US"}  # 12-hour clock, UTC-8/-7

DAGS = r'''
"""DAG of tests/test_live_view_page.py: a task submitting a job (driven by the test), labelled as the operator does."""
from datetime import datetime

from airflow.sdk import DAG, task


with DAG("%(dag)s", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    @task(task_id="%(task)s")
    def transfer(**context):
        from fstream_provider.hooks.fstream import FStreamHook
        from fstream_provider.model.spec import TransferSpec

        ti = context["ti"]
        spec = TransferSpec(sources=["/data/run0042/detector"], destination="fstream://127.0.0.1:9/landed",
                            label=f"airflow {ti.dag_id}/{ti.run_id}/{ti.task_id}", target_throughput_bps=4e8)
        job_id, _ = FStreamHook().submit(spec, idempotency_key=f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/-1")
        ti.xcom_push(key="job_id", value=job_id)
        ti.xcom_push(key="fstream_conn_id", value="fstream_default")

    transfer()
''' % {"dag": DAG, "task": TASK}

_RUN = r"""
import json, os
from airflow.dag_processing.dagbag import DagBag
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
assert not bag.import_errors, bag.import_errors
dr = bag.dags[os.environ["FSTREAM_TEST_DAG"]].test()
with create_session() as s:
    x = {x.key: x.value for x in s.query(XComModel).filter(XComModel.run_id == dr.run_id)}
out = {"state": str(dr.state), "run_id": dr.run_id, "job_id": x.get("job_id")}
print("RESULT_JSON " + json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    """A redis-server on a fixed port with AOF, so the outage test can stop it and start it again as it was."""
    server = RedisServer(str(tmp_path_factory.mktemp("redis")), appendonly=True, port=free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def site(tmp_path_factory, redis):
    home = tmp_path_factory.mktemp("airflow-home")
    dags = home / "dags"
    dags.mkdir()
    (dags / "fstream_live_page_dags.py").write_text(DAGS)
    conn = redis.url.replace("redis://", "fstream://", 1) + "?" + authkit.conn_query()
    env = dict(os.environ, AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__CORE__DAGS_FOLDER=str(dags), AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
               FSTREAM_STATE_DIR=str(home / "fstream-state"), AIRFLOW_CONN_FSTREAM_DEFAULT=conn, FSTREAM_TEST_DAG=DAG)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True,
                   timeout=300)
    p = subprocess.run([sys.executable, "-c", _RUN], env=env, capture_output=True, text=True, timeout=300)
    found = re.findall(r"^RESULT_JSON (.*)$", p.stdout, re.M)
    assert found, f"dag.test failed (rc {p.returncode}):\n{(p.stdout + p.stderr)[-4000:]}"
    run = json.loads(found[-1])
    job_id = json.loads(run["job_id"]) if str(run["job_id"]).startswith('"') else run["job_id"]
    with api_server(env) as base:
        yield {"base": base, "admin": token(base), "run_id": run["run_id"], "job_id": job_id}


class Job:
    """The task's job, driven as an agent's runner drives it (claimed once; ``interval`` publishes a record)."""

    def __init__(self, url: str, job_id: str) -> None:
        self.client = connect(url)
        self.store = JobStore(self.client)
        self.job_id, self.t = job_id, 0.0
        entry = next(eid for eid, f in self.client.xrange(self.store.keys.jobs_stream()) if f.get("job_id") == job_id)
        claim = self.store.claim(job_id, entry, worker="dtn07.beamline.example.org-agent-3", max_deliveries=9)
        assert claim.outcome == "claimed", claim
        self.attempt = claim.attempt

    def interval(self, bps: float, **extra) -> None:
        self.t += 1.0
        total = 40 * 8 * 2**20
        done = int(self.t) * 8 * 2**20
        deadline = plan(t=self.t, deadline_t=30.0, remaining_bytes=total - done, remaining_files=40 - self.t,
                        best_bps=4.2e8, eta=Eta(s=26.0, lo=20.0, hi=34.0, rate_bps=bps, basis="rolling"))
        rec = {"t": self.t, "dt": 1.0, "throughput_bps": bps, "cc": 4, "p": 8, "pp": 2, "target_bps": 4e8,
               "clusters": {"small": {"cc": 2, "p": 4, "pp": 8}, "large": {"cc": 4, "p": 8, "pp": 0}},
               "files_done": int(self.t), "files_pending": 40 - int(self.t), "files_failed": 0, "files_total": 40,
               "bytes_done": done, "bytes_total": total,
               "reason": "raise cc: throughput 12 % below target for 3 intervals while the RTT stayed flat",
               "eta": {"s": 26.0, "lo": 20.0, "hi": 34.0, "rate_bps": bps, "basis": "rolling"},
               "lag": {"oldest_s": 3.5, "p50_s": 1.2, "p99_s": 2.9, "landed": 4},
               "deadline": {**deadline.as_dict(), "at": time.time() + 30}, **extra}
        owner, _ = self.store.publish(self.job_id, self.attempt, [("interval", time.time(), rec)],
                                      fields={"progress": json.dumps(rec)})
        assert owner

    def close(self) -> None:
        self.client.close()


@pytest.fixture(scope="module")
def job(site, redis):
    j = Job(redis.url, site["job_id"])
    j.interval(3.25e8)
    try:
        yield j
    finally:
        j.close()


def _utc(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%H:%M:%S")


# ---------------------------------------------------------------------------------------------------- tests
def test_sizes_in_the_deadline_and_the_tuners_reasons_are_binary_as_in_the_tables():
    """Item 9: the deadline's message and the tuner's reasons said "MB" (decimal) beside the tables' MiB."""
    from fstream_provider.model.units import format_bytes
    from fstream_provider.tuning.common import fmt_size

    msg = plan(t=1.0, deadline_t=30.0, remaining_bytes=312 * 2**20, remaining_files=39, best_bps=4.2e8,
               eta=None).message
    assert "312 MiB left" in msg, msg
    assert fmt_size(8 * 2**20) == "8 MiB" and format_bytes(8 * 2**20) == "8.00 MiB"
    assert fmt_size(3 * 2**30) == "3 GiB" and fmt_size(1536) == "1.5 KiB"


@pytest.mark.slow
def test_times_are_utc_24_hour_on_both_pages_and_sizes_one_unit(site, job):
    """Item 9: in a browser on a 12-hour clock in Los Angeles, every time the pages show is UTC HH:MM:SS (the date
    before it when not today) and every size is binary."""
    base = site["base"]
    with browser_page(base, site["admin"], viewport={"width": 1400, "height": 1000}, **BROWSER) as page:
        page.goto(base + "/fstream/live")
        row = page.locator(f"tr[data-job='{job.job_id}']")
        row.wait_for(timeout=30_000)
        page.wait_for_function("() => /read at/.test(document.getElementById('generated').textContent)")
        generated = page.locator("#generated").inner_text()
        read_at = json.loads(http(base + "/fstream/live/data", site["admin"])[2])["generated_at"]
        shown = re.search(r"read at (\d\d:\d\d:\d\d) UTC", generated)
        assert shown, generated
        assert abs(dt.datetime.strptime(shown.group(1), "%H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp() % 86400
                   - read_at % 86400) < 60, (generated, _utc(read_at))
        deadline = row.locator("td.deadline").inner_text()
        due = re.search(r"\(due ([0-9: -]+)\)", deadline)
        assert due and re.fullmatch(r"\d\d:\d\d:\d\d", due.group(1)), deadline
        # the formatter both pages share: a known instant, today and another day
        yesterday = time.time() - 86400
        got = page.evaluate("ts => [FS.when(ts[0]), FS.when(ts[1])]", [1_700_000_000.0 + 13 * 3600, yesterday])
        assert got[1] == dt.datetime.fromtimestamp(yesterday, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        assert got[0] == "2023-11-15 11:13:20", got  # 13:13:20 in Los Angeles would be 03:13:20 AM
        text = page.locator("body").inner_text()
        assert "MiB" in text and not re.search(r"\d\s?[kMGT]B\b", text), text
        assert not re.search(r"\b(AM|PM)\b", text), text
        # the task instance's "Transfer" tab (job.html) shows its events' times with the same formatter
        run = site["run_id"]
        page.goto(f"{base}/fstream/page/{DAG}/{run}/{TASK}/-1")
        page.locator("#events li").first.wait_for(timeout=30_000)
        claimed = next(e for _i, e in job.store.all_events(job.job_id) if e["kind"] == "claimed")
        events = page.locator("#events").inner_text()
        assert f"{_utc(claimed['ts'])} claimed by" in events, (events, _utc(claimed["ts"]))
        tab = page.locator("body").inner_text()
        assert not re.search(r"\b(AM|PM)\b", tab) and not re.search(r"\d\s?[kMGT]B\b", tab), tab


@pytest.mark.slow
def test_the_jobs_table_fits_1280_px_inside_airflows_frame(site, job):
    """Item 10: at a 1,280 px window, Airflow's "FStream" page (the plugin framed by the UI) shows every column of
    the jobs table whole: each header and cell inside the window and the frame; what is cut has its title."""
    base = site["base"]
    with browser_page(base, site["admin"], viewport={"width": 1280, "height": 900}, **BROWSER) as page:
        page.goto(base + "/plugin/fstream")
        ov = plugin_frame(page, "/fstream/live")
        ov.locator(f"tr[data-job='{job.job_id}'] .rate").wait_for(timeout=30_000)
        frame_box = page.locator("iframe").first.bounding_box()
        right = min(1280, frame_box["x"] + frame_box["width"])
        # the page redraws the table's rows every second (replaceChildren), so a cell located one call and measured
        # the next may be detached; every cell is measured in one call, in the frame's coordinates, plus the
        # frame's content origin on the page (its box plus its border)
        origin = page.evaluate("() => { const f = document.querySelector('iframe'), r = f.getBoundingClientRect();"
                               " return [r.left + f.clientLeft, r.top + f.clientTop]; }")
        boxes = ov.evaluate("""() => [...document.querySelectorAll('#jobs th, #jobs td')].map(e => {
            const r = e.getBoundingClientRect(); return [e.innerText, r.left, r.width]; })""")
        assert len(boxes) == 9 * 2, boxes  # the header row and the job's row: nine columns each
        for text, left, width in boxes:
            x = origin[0] + left
            assert x >= frame_box["x"] - 0.5 and x + width <= right + 0.5, (
                text, x, width, right, ov.evaluate("() => [...document.querySelectorAll('#jobs th')]"
                                                   ".map(e => Math.round(e.offsetWidth))"))
        assert ov.evaluate("() => document.documentElement.scrollWidth <= document.documentElement.clientWidth")
        cut = ov.evaluate("""() => [...document.querySelectorAll('#jobs .cut, #jobs .clamp')]
            .filter(e => e.scrollWidth > e.clientWidth + 1 || e.scrollHeight > e.clientHeight + 1)
            .map(e => [e.textContent, e.title || e.closest('td').title])""")
        assert cut, "nothing long enough to cut: the test data should overflow the task and run columns"
        for full, title in cut:
            assert title == full, (full, title)
        row = ov.locator(f"tr[data-job='{job.job_id}']").inner_text()
        assert f"{DAG}.{TASK}" in ov.locator(f"tr[data-job='{job.job_id}'] td.task a").text_content()
        assert f"airflow {DAG}/" not in row  # the operator's label repeated the task column
        for want in ("4/8/2" if "small" not in row else "small 2/4/8", "1 / 39 / 0 of 40", "8.00 MiB of 320.00 MiB",
                     "26 s ± 7.0 s", "p50 1.2 s", "raise cc"):
            assert want in row, (want, row)


@pytest.mark.slow
def test_a_redis_outage_is_shown_and_clears_when_reads_succeed(site, job, redis):
    """Item 1: Redis stops: the page shows an outage line, 'live' turns to 'stale since HH:MM:SS UTC' (the last
    read), the running job's numbers say how old they are; Redis is back: the line clears, 'live' again."""
    base = site["base"]
    with browser_page(base, site["admin"], viewport={"width": 1400, "height": 1000}, **BROWSER) as page:
        page.goto(base + "/fstream/live")
        job.interval(3.5e8)
        status = page.locator("#status")
        page.wait_for_function("() => document.getElementById('status').textContent === 'live'", timeout=30_000)
        page.wait_for_function(f"() => document.querySelector(\"tr[data-job='{job.job_id}'] .rate\")"
                               "?.textContent.startsWith('350.00')", timeout=15_000)
        assert page.locator("#problem").inner_text() == ""
        redis.stop()
        try:
            page.wait_for_function("() => /Redis unreachable/.test(document.getElementById('problem').textContent)",
                                   timeout=20_000)
            problem = page.locator("#problem").inner_text()
            assert re.search(r"\(since \d\d:\d\d:\d\d UTC\)", problem), problem
            page.wait_for_function("() => /^stale since \\d\\d:\\d\\d:\\d\\d UTC$/.test("
                                   "document.getElementById('status').textContent)", timeout=15_000)
            since = re.search(r"(\d\d:\d\d:\d\d)", status.inner_text()).group(1)
            assert since in page.locator("#generated").inner_text()  # stale since the last good read
            page.wait_for_function(f"() => / s old$/.test(document.querySelector(\"tr[data-job='{job.job_id}'] "
                                   ".age\")?.textContent)", timeout=15_000)
            assert "stale" in status.get_attribute("class")
        finally:
            redis.start()
        # the agent goes on once Redis is back (a 30 s interval: on a loaded host the page may take over two 1 s
        # intervals to draw it, which would rightly show its age)
        job.interval(3.75e8, dt=30.0)
        page.wait_for_function("() => document.getElementById('problem').textContent === ''", timeout=30_000)
        page.wait_for_function("() => document.getElementById('status').textContent === 'live'", timeout=15_000)
        page.wait_for_function(f"() => document.querySelector(\"tr[data-job='{job.job_id}'] .rate\")"
                               "?.textContent.startsWith('375.00')", timeout=15_000)
        assert page.locator(f"tr[data-job='{job.job_id}'] .age").inner_text() == ""


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for name in ("href", "src"):
            if a.get(name):
                self.links.append(a[name])


def _parse(body: bytes) -> _Links:
    p = _Links()
    p.feed(body.decode())
    return p


def test_every_link_on_the_served_docs_pages_resolves(site):
    """Item 11: the provider's docs pages as the api-server serves them (the Providers page links the first): every
    relative link and image, followed as the browser resolves it, answers 200, and its #anchor is on the page."""
    base, tok = site["base"], site["admin"]
    todo = [f"{base}/fstream/docs/{p}" for p in DOC_PAGES]
    seen, bad = set(todo), []
    while todo:
        url = todo.pop()
        status, _ctype, body = http(url, tok)
        if status != 200:
            bad.append(f"{url}: {status}")
            continue
        if not url.endswith(".md"):
            continue
        for href in _parse(body).links:
            if urlsplit(href).scheme or href.startswith("#"):
                continue
            target = urljoin(url, href)
            page, _, anchor = target.partition("#")
            if anchor:
                s, _c, b = http(page, tok)
                if s == 200 and anchor not in _parse(b).ids:
                    bad.append(f"{url} -> {href}: no #{anchor}")
            if page not in seen:
                seen.add(page)
                todo.append(page)
    assert not bad, bad
    assert {f"{base}/fstream/docs/project/architecture.md", f"{base}/fstream/docs/project/authorization.md"} <= seen


@pytest.mark.slow
def test_no_attempt_0_no_zero_error_bar_and_a_finished_job_has_no_eta(site, job, redis):
    """Item 6 on this page, as the Transfer tab shows it: an idle agent (its heartbeat as the agent writes it) and a
    job nobody claimed yet show no "attempt 0"; a steady rate's ETA has no "± 0.0 s" (an uncertain one keeps its
    error bar); a finished job's ETA says "finished", not "0.0 s ± 0.0 s"."""
    from fstream_provider.model.spec import TransferSpec
    from transfer_agent.daemon.worker import Agent

    store, keys = job.store, job.store.keys
    spec = TransferSpec(sources=["/data/run0043"], destination="fstream://127.0.0.1:9/landed", label="item 6")
    ids = {what: store.submit(spec)[0] for what in ("queued", "steady", "finished")}
    entries = {f["job_id"]: eid for eid, f in job.client.xrange(keys.jobs_stream()) if f.get("job_id") in ids.values()}
    idle = Agent(redis.url, name="idle-agent-9", heartbeat_ttl=60)
    idle._client, idle._started_at = job.client, time.time()
    try:
        idle._beat()  # an agent's heartbeat while it runs no job: job "", attempt 0
        for what in ("steady", "finished"):
            claim = store.claim(ids[what], entries[ids[what]], worker=f"dtn08-{what}", max_deliveries=9)
            rec = {"t": 5.0, "dt": 1.0, "throughput_bps": 3e8, "files_done": 5, "files_total": 10,
                   "eta": {"s": 0.0 if what == "finished" else 12.0, "lo": 0.0 if what == "finished" else 12.0,
                           "hi": 0.0 if what == "finished" else 12.0, "rate_bps": 3e8, "basis": "rolling"}}
            assert store.publish(ids[what], claim.attempt, [("interval", time.time(), rec)],
                                 fields={"progress": json.dumps(rec)})[0]
        assert store.finish(ids["finished"], 1, entries[ids["finished"]], state="succeeded",
                            result={"files": 10, "bytes": 10 * 2**20, "seconds": 5.0, "throughput_bps": 3e8,
                                    "verified_files": 10, "failed_files": 0})
        with browser_page(site["base"], site["admin"], viewport={"width": 1400, "height": 1000}) as page:
            page.goto(site["base"] + "/fstream/live")
            for job_id in ids.values():
                page.locator(f"tr[data-job='{job_id}']").wait_for(timeout=30_000)
            page.locator("#agents tr", has_text="idle-agent-9").wait_for(timeout=30_000)

            def cell(job_id: str, css: str) -> str:
                return page.locator(f"tr[data-job='{job_id}'] td.{css}").inner_text()

            assert cell(ids["steady"], "agent").split("\n") == ["running", "dtn08-steady", "attempt 1"]
            assert cell(ids["queued"], "agent").split("\n") == ["queued", "not claimed yet"]
            assert page.locator(f"tr[data-job='{ids['steady']}'] .eta").inner_text() == "12 s"
            assert page.locator(f"tr[data-job='{job.job_id}'] .eta").inner_text() == "26 s ± 7.0 s"
            assert page.locator(f"tr[data-job='{ids['finished']}'] .eta").inner_text() == "finished"
            agent = page.locator("#agents tr", has_text="idle-agent-9").locator("td").all_inner_texts()
            assert agent[3:6] == ["yes", "idle", "-"], agent  # alive, no job, no attempt
            assert "attempt 0" not in page.locator("body").inner_text()
    finally:  # the other tests of the module see the task's job only
        job.client.delete(keys.agent(idle.name), *(k for j in ids.values() for k in (keys.job(j), keys.job_events(j))))
        job.client.srem(keys.agents(), idle.name)
        job.client.zrem(keys.job_index(), *ids.values())
