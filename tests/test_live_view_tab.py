"""The task instance's "Transfer" tab says how fresh its numbers are and shows them right (issue 41).

One real ``airflow api-server`` for the module, a real ``redis-server`` (with AOF, so the test can stop it and start
it again on the same port and data), task instances made by ``dag.test()`` (one job per mapped task, each test its
own), Debian's Chromium driven by Playwright. The jobs are driven through ``JobStore`` exactly as an agent publishes
(``tests/test_airflow_live_view.py``'s ``Driven``), with the fields the agent's records and file events carry
(``active_files``, ``bytes_left``, a file's ``seconds``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import quote

import pytest

pytest.importorskip("airflow")
pytest.importorskip("playwright")

from fstream_provider.bus.embedded import RedisServer  # noqa: E402
from fstream_provider.model.units import format_bytes, format_rate  # noqa: E402

import authkit  # noqa: E402
from airflowkit import api_server, browser_page, token  # noqa: E402
from airflowkit import plugin_frame  # noqa: E402
from agentkit import pump  # noqa: E402
from test_airflow_live_view import Driven, _run_dags, _xcom_value  # noqa: E402

DAG = "fstream_live_tab"
SHARDS = 7
TAB = "fstream-transfer"

DAGS = r'''
"""DAG of tests/test_live_view_tab.py: one job per mapped task (driven by the test), and a task with no job."""
from datetime import datetime

from airflow.sdk import DAG, task


with DAG("fstream_live_tab", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    @task
    def shard(part, **context):
        from fstream_provider.hooks.fstream import FStreamHook
        from fstream_provider.model.spec import TransferSpec

        ti = context["ti"]
        spec = TransferSpec(sources=[f"/data/tab-{part}"], destination="fstream://127.0.0.1:9/landed",
                            label=f"tab-{part}", target_throughput_bps=4e8)
        job_id, _ = FStreamHook().submit(spec, idempotency_key=f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{ti.map_index}")
        ti.xcom_push(key="job_id", value=job_id)
        ti.xcom_push(key="fstream_conn_id", value="fstream_default")

    @task
    def nojob():
        return "not a transfer"

    shard.expand(part=list(range(%d)))
    nojob()
''' % SHARDS


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    server = RedisServer(str(tmp_path_factory.mktemp("redis")), appendonly=True)  # AOF: a restart keeps the jobs
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def site(tmp_path_factory, redis):
    """AIRFLOW_HOME (migrated), the DAG run of the job tasks, and a running api-server: a dict."""
    home = tmp_path_factory.mktemp("airflow-home")
    dags = home / "dags"
    dags.mkdir()
    (dags / "fstream_live_tab_dags.py").write_text(DAGS)
    conn = redis.url.replace("redis://", "fstream://", 1) + "?" + authkit.conn_query()
    env = dict(os.environ, AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__CORE__DAGS_FOLDER=str(dags), AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
               FSTREAM_STATE_DIR=str(home / "fstream-state"), AIRFLOW_CONN_FSTREAM_DEFAULT=conn)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True,
                   timeout=300)
    runs = _run_dags(env, [DAG])
    with api_server(env) as base:
        yield {"base": base, "run": runs[DAG], "admin": token(base)}


def _job(site: dict, redis: RedisServer, part: int) -> Driven:
    return Driven(redis.url, _xcom_value(site["run"]["xcom"][f"shard[{part}]:job_id"]))


def _tab(site: dict, task: str = "shard", map_index: int = -1) -> str:
    """The tab's page itself (what Airflow's UI frames)."""
    run = quote(site["run"]["run_id"], safe="")
    return f"{site['base']}/fstream/page/{DAG}/{run}/{task}/{map_index}"


def _text_is(page, selector: str, want: str, timeout_ms: int = 15_000) -> None:
    page.wait_for_function("([s, w]) => { const e = document.querySelector(s); return !!e && e.textContent === w; }",
                           arg=[selector, want], timeout=timeout_ms)


def _summary(page, name: str) -> str:
    return page.locator(f"#summary dd.{name}").text_content()


# ---------------------------------------------------------------------------------------------------- item 1
def test_the_tab_says_stale_while_redis_is_down_and_clears_it_when_reads_succeed(site, redis):
    job = _job(site, redis, 0)
    try:
        job.claim()
        job.interval(2e8)
        with browser_page(site["base"], site["admin"]) as page:
            page.goto(_tab(site, map_index=0))
            _text_is(page, "#summary dd.rate", format_rate(2e8))
            _text_is(page, "#status", "live")
            # no record for more than two intervals (1 s each): each value of the record says how old it is
            page.wait_for_function("() => /^\\d+(\\.\\d)? s old$/.test(document.querySelector('#summary dd.rate')"
                                   ".getAttribute('data-age') || '')", timeout=15_000)
            shown = page.evaluate("() => getComputedStyle(document.querySelector('#summary dd.eta'), '::after')"
                                  ".content")
            assert re.search(r"\d s old", shown), shown  # (what the eye sees after the value)
            job.interval(2.5e8)  # a new record: fresh again, no age
            _text_is(page, "#summary dd.rate", format_rate(2.5e8))
            assert page.locator("#summary dd.rate").get_attribute("data-age") is None
            # Redis goes away: "live" turns to "stale since HH:MM:SS" (UTC, 24-hour) and the red line says why
            redis.stop()
            down_at = time.time()
            try:
                page.wait_for_function("() => document.getElementById('status').textContent.startsWith('stale since')",
                                       timeout=20_000)
                status = page.locator("#status").text_content()
                assert "Redis unreachable" in page.locator("#problem").text_content()
            finally:
                redis.start()
            m = re.fullmatch(r"stale since (\d\d):(\d\d):(\d\d)", status)
            assert m, status
            since = dt.datetime.fromtimestamp(down_at, dt.timezone.utc).replace(
                hour=int(m[1]), minute=int(m[2]), second=int(m[3]), microsecond=0)
            assert -30 <= since.timestamp() - down_at <= 2, (status, down_at)  # the last good read, in UTC
            # back: the line clears and the tab is live again, new records keep coming
            page.wait_for_function("() => document.getElementById('problem').textContent === '' && "
                                   "document.getElementById('status').textContent === 'live'", timeout=30_000)
            job.interval(3e8)
            _text_is(page, "#summary dd.rate", format_rate(3e8))
            # another outage, and the job finishes right after Redis returns: finished, no red line left
            redis.stop()
            try:
                page.wait_for_function("() => document.getElementById('problem').textContent.includes("
                                       "'Redis unreachable')", timeout=20_000)
            finally:
                redis.start()
            job.finish("succeeded")
            _text_is(page, "#status", "finished: succeeded", 30_000)
            assert page.locator("#problem").text_content() == ""
            assert page.locator("#summary dd.rate").get_attribute("data-age") is None  # final numbers do not age
    finally:
        job.close()


class Cut:
    """A TCP relay between the browser and the api-server whose cable the test can pull (``cut``: the open
    connections drop and new ones are refused) and plug back (``mend``)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream, self.down, self.socks = upstream_port, False, []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.down:
                client.close()
                continue
            up = socket.create_connection(("127.0.0.1", self.upstream))
            self.socks += [client, up]
            for a, b in ((client, up), (up, client)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    def cut(self) -> None:
        self.down = True
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self.socks = []

    def mend(self) -> None:
        self.down = False

    def close(self) -> None:
        self.cut()
        self.server.close()


def test_the_tab_says_reconnecting_when_its_stream_drops(site, redis):
    job = _job(site, redis, 6)
    relay = Cut(int(site["base"].rsplit(":", 1)[1]))
    base = f"http://127.0.0.1:{relay.port}"
    try:
        job.claim()
        job.interval(1e8)
        with browser_page(base, site["admin"]) as page:
            page.goto(_tab(site, map_index=6).replace(site["base"], base))
            _text_is(page, "#status", "live")
            relay.cut()  # the stream drops, and reconnecting fails for a while
            page.wait_for_function("() => document.getElementById('status').textContent.startsWith('reconnecting')",
                                   timeout=20_000)
            page.wait_for_function("() => /^reconnecting · stale since \\d\\d:\\d\\d:\\d\\d$/.test("
                                   "document.getElementById('status').textContent)", timeout=20_000)
            relay.mend()
            job.interval(1.5e8)
            _text_is(page, "#summary dd.rate", format_rate(1.5e8), 30_000)
            _text_is(page, "#status", "live")
    finally:
        relay.close()
        job.close()


# ---------------------------------------------------------------------------------------------------- items 2, 6
def test_the_tuners_last_reason_stays_and_a_finished_job_has_no_eta(site, redis):
    job = _job(site, redis, 1)
    try:
        with browser_page(site["base"], site["admin"]) as page:
            page.goto(_tab(site, map_index=1))
            _text_is(page, "#summary dd.agent", "not claimed yet")  # not "- / 0": nobody holds it
            job.claim()
            job.event("tuning", {"t": 0.5, "reason": "start: 2 channels x 4 streams", "layouts": {"all": [2, 4, 2]}})
            job.interval(2e8, cc=4, reason="raise cc: throughput below target")
            _text_is(page, "#summary dd.reason", "raise cc: throughput below target")
            _text_is(page, "#summary dd.agent", "live-test-agent / 1")
            job.interval(2.2e8, cc=4)  # the next records carry reason "" (nothing new was decided)
            job.interval(2.4e8, cc=4, eta={"s": 12.0, "lo": 12.0, "hi": 12.0, "rate_bps": 2.4e8, "basis": "rolling"})
            _text_is(page, "#summary dd.rate", format_rate(2.4e8))
            assert _summary(page, "reason") == "raise cc: throughput below target"
            assert _summary(page, "eta") == "12 s"  # a steady rate: no "± 0.0 s"
            job.finish("succeeded")
            _text_is(page, "#status", "finished: succeeded")
            assert _summary(page, "reason") == "raise cc: throughput below target"
            assert _summary(page, "eta") == "finished"
            page.reload()  # as a reload shows it
            _text_is(page, "#status", "finished: succeeded")
            assert _summary(page, "reason") == "raise cc: throughput below target"
            assert _summary(page, "eta") == "finished"
    finally:
        job.close()


# ---------------------------------------------------------------------------------------------------- item 4
# what a tab shows of a job's numbers: the chart's throughput line, its last point, and every value of the summary
_SHOWN = """() => ({line: document.querySelector('#chart polyline.thr').getAttribute('points'),
  last: document.querySelector('#chart circle.thr title').textContent,
  summary: [...document.querySelectorAll('#summary dt')].map(t => t.textContent + ': ' + t.nextSibling.textContent)})"""


def test_an_open_tab_folds_the_last_sliver_as_a_reload_shows_it(site, redis):
    """The transfer's last interval lasts 0.08 s (a sliver, its rate a dip): the stream sends it folded into the
    interval before it, and the open tab shows what a freshly loaded tab shows: the same line with the merged last
    point (replaced, not added), the same numbers; finished, the same average."""
    from fstream_provider.model.intervals import fold

    job = _job(site, redis, 3)
    try:
        job.claim()
        job.interval(1e8)
        job.interval(2e8)
        with browser_page(site["base"], site["admin"]) as page:
            page.goto(_tab(site, map_index=3))
            _text_is(page, "#summary dd.rate", format_rate(2e8))
            before = page.evaluate(_SHOWN)
            job.interval(5e7, t=2.08, dt=0.08)  # the sliver that ends the transfer
            merged = fold({"dt": 1.0, "throughput_bps": 2e8}, {"dt": 0.08, "throughput_bps": 5e7})["throughput_bps"]
            _text_is(page, "#chart circle.thr title", format_rate(merged))
            shown = page.evaluate(_SHOWN)
            assert len(shown["line"].split()) == len(before["line"].split()) == 2, (before, shown)
            assert f"throughput: {format_rate(merged)}" in shown["summary"], shown  # no dip to 50 Mbit/s
            reloaded = page.context.new_page()
            reloaded.goto(_tab(site, map_index=3))
            _text_is(reloaded, "#chart circle.thr title", format_rate(merged))
            assert reloaded.evaluate(_SHOWN) == shown
            average = (1e8 + 2e8 + 5e7 * 0.08) / 2.08
            assert job.store.finish(job.job_id, job.attempt, job.entry, state="succeeded",
                                    result={"files": 10, "bytes": int(average * 2.08 / 8), "seconds": 2.08,
                                            "throughput_bps": average, "verified_files": 10, "failed_files": 0})
            _text_is(page, "#status", "finished: succeeded")
            _text_is(page, "#summary dd.rate", format_rate(average))
            reloaded.reload()
            _text_is(reloaded, "#status", "finished: succeeded")
            assert reloaded.evaluate(_SHOWN) == page.evaluate(_SHOWN)
    finally:
        job.close()


# ---------------------------------------------------------------------------------------------------- items 3, 5
def test_files_show_their_rate_and_the_files_in_flight_are_counted(site, redis):
    job = _job(site, redis, 2)
    mib = 2**20
    try:
        job.claim()
        job.event("file", {"path": "a/f0.h5", "source": "/data/a/f0.h5", "size": 4 * mib, "status": "committed",
                           "resumed": 0, "seconds": 2.0})
        job.interval(1e8, files_done=1, files_pending=6, files_total=10, active_files=3, bytes_done=4 * mib,
                     bytes_total=40 * mib, bytes_left=30 * mib)
        with browser_page(site["base"], site["admin"]) as page:
            page.goto(_tab(site, map_index=2))
            _text_is(page, "#summary dd.rate", format_rate(1e8))
            # 3 files in flight; 40 - 30 - 4 = 6 MiB of them sent, counted done only at their commit
            assert _summary(page, "inflight") == f"3 files, {format_bytes(6 * mib)} sent, not committed yet"
            assert _summary(page, "files") == "1 done / 6 pending / 0 failed of 10"
            assert "bytes committed" in page.locator("#summary").inner_text()
            row = page.locator("#files tbody tr", has_text="a/f0.h5").inner_text().split("\t")
            assert row[4].strip() == format_rate(4 * mib * 8 / 2.0)  # from the snapshot
            job.event("file", {"path": "a/f1.h5", "source": "/data/a/f1.h5", "size": 8 * mib, "status": "committed",
                               "resumed": 0, "seconds": 0.5})
            job.interval(1.2e8, files_done=2, files_pending=6, files_total=10, active_files=2, bytes_done=12 * mib,
                         bytes_total=40 * mib, bytes_left=24 * mib)
            _text_is(page, "#summary dd.inflight", f"2 files, {format_bytes(4 * mib)} sent, not committed yet")
            row = page.locator("#files tbody tr", has_text="a/f1.h5").inner_text().split("\t")
            assert row[4].strip() == format_rate(8 * mib * 8 / 0.5)  # from the live event
    finally:
        job.close()


# ---------------------------------------------------------------------------------------------------- items 7, 8
def test_one_line_per_tuner_decision_and_the_plot_stays_in_the_tab(site, redis):
    job = _job(site, redis, 4)
    try:
        job.claim()
        job.interval(1e8)
        reason = "raise cc: throughput below target"
        job.event("tuning", {"t": 1.5, "reason": reason, "layouts": {"all": {"cc": 4, "p": 4, "pp": 2}}})
        job.interval(2e8, cc=4, reason=reason)  # the agent's record after a decision carries its reason too
        job.interval(2.1e8, cc=4)
        run = quote(site["run"]["run_id"], safe="")
        with browser_page(site["base"], site["admin"]) as page:
            page.set_viewport_size({"width": 1280, "height": 800})
            page.goto(f"{site['base']}/dags/{DAG}/runs/{run}/tasks/shard/mapped/4/plugin/{TAB}")
            jv = plugin_frame(page, "/fstream/page/")
            _text_is(jv, "#summary dd.rate", format_rate(2.1e8), 30_000)
            lines = jv.locator("#decisions li").all_inner_texts()
            assert sum(reason in line for line in lines) == 1, lines
            assert any("cc/p/pp 2/4/2 → 4/4/2: " + reason in line for line in lines), lines
            # "plot" stays in the tab: it shows the plot drawn in the page, the tab is still there
            jv.locator("img#plot").evaluate("img => img.complete || new Promise(r => img.onload = r)")
            jv.get_by_role("link", name="plot", exact=True).click()
            jv.wait_for_function("() => location.hash === '#plot-section'")
            assert "/fstream/page/" in jv.url and jv.locator("#view").is_visible()
            assert jv.locator("img#plot").evaluate("img => img.naturalWidth") > 0
            box, vh = jv.locator("img#plot").bounding_box(), jv.evaluate("() => innerHeight")
            assert box["y"] < vh, (box, vh)  # scrolled into view
            with page.expect_download() as dl:  # the PNG itself: downloaded, not opened over the tab
                jv.get_by_role("link", name="download PNG").click()
            with open(dl.value.path(), "rb") as fh:
                assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
            assert "/fstream/page/" in jv.url and jv.locator("#view").is_visible()
            # a task without a job: a note, and no plot to link to
            page.goto(_tab(site, "nojob"))
            page.locator("#note").wait_for(timeout=15_000)
            page.wait_for_function("() => document.getElementById('note').textContent.includes('has no FStream job')")
            assert page.locator("#links a").all_inner_texts() == ["task log"]
            assert page.locator("#plot-section").is_hidden()
    finally:
        job.close()


# ---------------------------------------------------------------------------------------------------- item 12
def test_a_finished_tab_fetches_its_plot_once(site, redis):
    job = _job(site, redis, 5)
    try:
        job.claim()
        for bps in (1e8, 2e8, 3e8):
            job.interval(bps)
        job.finish("succeeded")
        with browser_page(site["base"], site["admin"]) as page:
            plots = []
            page.on("request", lambda r: plots.append(r.url) if "/plot/" in r.url else None)
            page.goto(_tab(site, map_index=5))
            _text_is(page, "#status", "finished: succeeded")
            page.wait_for_function("() => { const i = document.getElementById('plot'); return i && i.complete && "
                                   "i.naturalWidth > 0; }", timeout=15_000)
            page.wait_for_load_state("networkidle")
            assert len(plots) == 1, plots
    finally:
        job.close()


def test_the_plots_throughput_axis_has_headroom_above_its_lines():
    from fstream_provider.model.plot import render_plot

    for target, rates in ((4e8, [1e8, 2e8, 4e8]), (1e8, [1e8, 3e8, 2e8])):
        fig = render_plot([{"t": i, "throughput_bps": r, "cc": 2, "p": 1, "pp": 1, "files_pending": 1}
                           for i, r in enumerate(rates)], target)
        top = fig.axes[0].get_ylim()[1]
        highest = max(rates + [target]) / 1e6
        assert top >= highest * 1.1, (top, highest)  # the highest line is not drawn on the frame
