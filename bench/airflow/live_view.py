"""Issue 27, two goals of the live view: freshness measured in a browser, and the plugin's CPU on the api-server.

``fstream bench live-view [--jobs 50 --pages 5 --seconds 60 --interval 1]``

A real ``redis-server`` and a real ``airflow api-server`` (SimpleAuthManager, one admin) with the provider's
plugin; ``dag.test()`` of one DAG whose mapped task submits ``--jobs`` jobs through ``FStreamHook`` and records
them in its XComs (``job_id``, ``fstream_conn_id``), as the operator does. The bench claims every job and a
publisher thread drives them as agents' runners do (``JobStore.publish`` of an ``interval`` event plus the
``progress`` field), one record per job per ``--interval``, the jobs staggered across the interval (agents are
not in step). Record k of a job carries ``t`` = k, its publish wall time, and a throughput of k × 10 kbit/s,
a text the page shows differently for every k.

- **Freshness** (goal: agent interval -> value on the page, p50 ≤ 1 s, p99 ≤ 2 s): Debian's Chromium
  (Playwright, the system browser) opens ``--pages`` pages, each in its own browser context: the overview
  (``/fstream/live``) and ``--pages - 1`` job views (``/fstream/page/{dag}/{run}/transfer/{map}``, the
  "Transfer" tab's page, opened directly: the UI that frames it is Airflow's cost, not the plugin's). An init
  script puts a ``MutationObserver`` on each document: when a rate cell's text changes (``#summary dd.rate``;
  the overview's ``tr[data-job] .rate``) it decodes k and notes ``Date.now()`` the first time k is in the
  DOM. Delay = seen − published (``time.time()`` just before ``publish``; same machine clock), for every
  record published during phase (b); a record a page never showed (a later one replaced it first) is
  counted as missed.
- **CPU** (goal: the plugin adds ≤ 5 % CPU to the api-server with 50 running jobs watched by 5 pages): the
  api-server's process tree (user + system of each process and of the children it reaped, from ``/proc``)
  over three phases of ``--seconds`` each in one run, the publisher running throughout: (a) no page open,
  (b) the pages open (the window starts once every page shows a value, so page load and the plot PNGs are
  outside it and reported apart), (c) no page open again. Added = b − mean(a, c), in % of one core (and
  relative to the baseline). The browser's and Redis's CPU per phase are reported apart, not counted.
  Nothing is pinned; the load average is recorded at start and end.

Writes ``bench/results/live-view-<stamp>.json`` (raw delays, per-second CPU, provenance) and ``.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

from fstream_bench.airflow.api_server import login, serve
from fstream_bench.airflow.browser import CHROMIUM, CHROMIUM_ARGS

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
MODULES = ("fstream_provider.ui", "fstream_provider.bus", "fstream_bench.airflow.live_view",
           "fstream_bench.airflow.api_server", "fstream_bench.airflow.browser", "fstream_bench.core.cpu_meter")
DAG_ID, TASK_ID = "fstream_live_view_bench", "transfer"
STEP_BPS = 1e4  # record k shows k × STEP_BPS: a distinct text (format_rate) for every k < 100,000
PASSWORD = "fstream-live-view-bench"
SETTLE_S = 4.0  # after the pages close, before (c): the server's streams notice within sse.BLOCK_MS (2 s)
GRACE_S = 3.0  # after (b), before reading the pages: the last records of (b) reach them
GOALS = {"p50_ms": 1000.0, "p99_ms": 2000.0, "added_pct_core": 5.0}

DAG_SRC = '''
"""The live-view benchmark's DAG (bench/airflow/live_view.py): each mapped task submits one job and records it."""
from datetime import datetime

from airflow.sdk import DAG, task

with DAG("__DAG__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    @task
    def transfer(part, **context):
        from fstream_provider.hooks.fstream import FStreamHook
        from fstream_provider.model.spec import TransferSpec

        ti = context["ti"]
        spec = TransferSpec(sources=[f"/data/bench/{part}"], destination="fstream://127.0.0.1:9/landed",
                            label=f"live-view-bench-{part}", target_throughput_bps=4e8)
        key = f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{ti.map_index}"
        job_id, _ = FStreamHook().submit(spec, idempotency_key=key)
        ti.xcom_push(key="job_id", value=job_id)
        ti.xcom_push(key="fstream_conn_id", value="fstream_default")

    transfer.expand(part=list(range(__N__)))
'''

RUN_DAG = r"""
import json, os, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
assert not bag.import_errors, bag.import_errors
dr = bag.dags[sys.argv[1]].test()
out = {"state": str(dr.state), "run_id": dr.run_id, "jobs": {}}
with create_session() as s:
    for x in s.query(XComModel).filter(XComModel.run_id == dr.run_id, XComModel.dag_id == sys.argv[1],
                                       XComModel.key == "job_id"):
        v = x.value
        out["jobs"][x.map_index] = json.loads(v) if isinstance(v, str) and v.startswith('"') else v
print("RESULT_JSON " + json.dumps(out, default=str), flush=True)
"""

# in every frame before its own scripts: note when record k's rate is first in the DOM
OBSERVER_JS = """(() => {
  const STEP = __STEP__, UNIT = {'Gbit/s': 1e9, 'Mbit/s': 1e6, 'kbit/s': 1e3, 'bit/s': 1};
  const seen = window.__benchSeen = [], last = new Map();
  const seq = t => { const m = /^\\s*([0-9.]+) (\\S+)\\s*$/.exec(t || '');
                     return m && UNIT[m[2]] ? Math.round(Number(m[1]) * UNIT[m[2]] / STEP) : null; };
  const note = (key, el, at) => { const k = seq(el.textContent);
    if (k !== null && k > (last.get(key) || 0)) { last.set(key, k); seen.push([key, k, at]); } };
  new MutationObserver(() => {
    const at = Date.now();
    const jv = document.querySelector('#summary dd.rate');
    if (jv) note('job', jv, at);
    for (const el of document.querySelectorAll('tr[data-job] .rate')) note(el.closest('tr').dataset.job, el, at);
  }).observe(document, {childList: true, subtree: true, characterData: true});
})();"""


# ---------------------------------------------------------------------------------------------------- Airflow
def airflow_site(work: Path, redis_url: str, n_jobs: int) -> tuple[dict, str, dict[int, str]]:
    """AIRFLOW_HOME (migrated) and the DAG run: ``(env, run_id, {map_index: job_id})``."""
    home = work / "airflow"
    dags = home / "dags"
    dags.mkdir(parents=True)
    (dags / "fstream_live_view_bench_dag.py").write_text(
        DAG_SRC.replace("__DAG__", DAG_ID).replace("__N__", str(n_jobs)))
    from fstream_provider.authz.ed25519 import ensure_pair

    key = work / "submitter.key"
    ensure_pair(key, "live-view-bench")  # the submitter's Ed25519 private key (issue 40)
    conn = (redis_url.replace("redis://", "fstream://", 1)
            + f"?submitter=live-view-bench&submitter_key_file={quote(str(key), safe='')}")
    env = dict(os.environ, AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__CORE__DAGS_FOLDER=str(dags), AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
               FSTREAM_STATE_DIR=str(home / "fstream-state"), AIRFLOW_CONN_FSTREAM_DEFAULT=conn)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True,
                   timeout=600)
    p = subprocess.run([sys.executable, "-c", RUN_DAG, DAG_ID], env=env, capture_output=True, text=True,
                       timeout=300 + 20 * n_jobs)
    m = re.search(r"^RESULT_JSON (.*)$", p.stdout, re.M)
    out = json.loads(m.group(1)) if m else {}
    jobs = {int(k): v for k, v in out.get("jobs", {}).items()}
    if len(jobs) != n_jobs:
        raise RuntimeError(f"dag.test made {len(jobs)} of {n_jobs} jobs (rc {p.returncode}):\n"
                           f"{(p.stdout + p.stderr)[-4000:]}")
    return env, out["run_id"], jobs


# ---------------------------------------------------------------------------------------------------- the jobs
def claim_all(redis_url: str, job_ids: list[str]) -> dict[str, int]:
    """Claim every job as an agent does: ``{job_id: attempt}`` (the jobs are running from here on)."""
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.jobs import JobStore

    client = connect(redis_url)
    try:
        store = JobStore(client)
        entries = {f.get("job_id"): eid for eid, f in client.xrange(store.keys.jobs_stream())}
        attempts = {}
        for i, job_id in enumerate(job_ids):
            c = store.claim(job_id, entries[job_id], worker=f"bench-agent-{i:02d}", max_deliveries=9)
            if c.outcome != "claimed":
                raise RuntimeError(f"claim {job_id}: {c}")
            attempts[job_id] = c.attempt
        return attempts
    finally:
        client.close()


class Publisher(threading.Thread):
    """One interval record per job per ``interval``, job i at offset i/n of it; ``published[job][k]`` = wall time."""

    def __init__(self, redis_url: str, attempts: dict[str, int], interval: float) -> None:
        super().__init__(name="live-view-publisher", daemon=True)
        self.url, self.attempts, self.interval = redis_url, attempts, interval
        self.published: dict[str, dict[int, float]] = {j: {} for j in attempts}
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.late_s = 0.0  # the worst lateness of a slot (the publisher keeping up)

    def run(self) -> None:
        from fstream_provider.bus.client import connect
        from fstream_provider.bus.jobs import JobStore

        client = connect(self.url)
        try:
            store, jobs = JobStore(client), list(self.attempts)
            step, t0, slot = self.interval / len(jobs), time.monotonic(), 0
            while not self.halt.is_set():
                k, i = divmod(slot, len(jobs))
                job, k = jobs[i], k + 1
                self.late_s = max(self.late_s, time.monotonic() - (t0 + slot * step))
                at = time.time()
                rec = {"t": k, "seq": k, "published_at": at, "dt": self.interval, "throughput_bps": k * STEP_BPS,
                       "cc": 2, "p": 4, "pp": 2, "target_bps": 4e8, "files_done": k, "files_pending": 100,
                       "files_failed": 0, "bytes_done": k * 2**20, "reason": ""}
                owner, _ = store.publish(job, self.attempts[job], [("interval", at, rec)],
                                         fields={"progress": json.dumps(rec)})
                if not owner:
                    raise RuntimeError(f"job {job}: no longer ours (attempt {self.attempts[job]})")
                self.published[job][k] = at
                slot += 1
                self.halt.wait(max(0.0, t0 + slot * step - time.monotonic()))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc
        finally:
            client.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(30)


# ---------------------------------------------------------------------------------------------------- CPU
def browser_cpu() -> float:
    """CPU-seconds of the Chromium processes this process started (through Playwright's driver)."""
    import psutil

    total = 0.0
    for p in psutil.Process().children(recursive=True):
        try:
            if "chrom" in p.name():
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


class Meter:
    """The api-server's, the browser's and Redis's CPU-seconds, read once a second over a phase."""

    def __init__(self, api_pid: int, redis_pid: int) -> None:
        self.api_pid, self.redis_pid = api_pid, redis_pid

    def read(self) -> dict:
        from fstream_bench.core.cpu_meter import tree_cpu

        return {"t": time.monotonic(), "wall": time.time(), "api": tree_cpu(self.api_pid), "browser": browser_cpu(),
                "redis": tree_cpu(self.redis_pid)}

    def phase(self, name: str, pages: int, seconds: float) -> dict:
        series = [self.read()]
        end_at = series[0]["t"] + seconds
        while (now := time.monotonic()) < end_at:
            time.sleep(min(1.0, end_at - now))
            series.append(self.read())
        a, b = series[0], series[-1]
        wall = b["t"] - a["t"]
        per_s = [(y["api"] - x["api"]) / (y["t"] - x["t"]) for x, y in zip(series, series[1:])]
        return {"phase": name, "pages": pages, "wall_s": wall, "start_unix": a["wall"], "end_unix": b["wall"],
                "api_cpu_s": b["api"] - a["api"], "api_cores": (b["api"] - a["api"]) / wall,
                "browser_cores": (b["browser"] - a["browser"]) / wall, "redis_cores": (b["redis"] - a["redis"]) / wall,
                "api_cores_per_s": per_s, "api_cores_sd": statistics.pstdev(per_s) if per_s else None,
                "loadavg_end": list(os.getloadavg())}


# ---------------------------------------------------------------------------------------------------- pages
def page_plan(base: str, run_id: str, jobs: dict[int, str], pages: int) -> list[dict]:
    """The overview and ``pages - 1`` job views of jobs spread over the map indexes."""
    plan = [{"kind": "overview", "job": None, "url": base + "/fstream/live"}]
    n = len(jobs)
    for i in range(pages - 1):
        mi = i * n // max(1, pages - 1)
        plan.append({"kind": "job", "job": jobs[mi], "map_index": mi,
                     "url": f"{base}/fstream/page/{DAG_ID}/{quote(run_id, safe='')}/{TASK_ID}/{mi}"})
    return plan


def open_pages(browser, base: str, jwt: str, plan: list[dict]) -> list[dict]:
    opened = []
    for p in plan:
        ctx = browser.new_context()
        ctx.add_cookies([{"name": "_token", "value": jwt, "url": base}])
        ctx.add_init_script(OBSERVER_JS.replace("__STEP__", repr(STEP_BPS)))
        page = ctx.new_page()
        opened.append({**p, "ctx": ctx, "page": page})
        page.goto(p["url"], timeout=120_000)  # "load": the job view's plot PNG too
    for p in opened:
        p["page"].wait_for_function("() => window.__benchSeen && window.__benchSeen.length > 0", timeout=60_000)
    return opened


def pct(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1) of ``xs``."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def summarize(delays: list[float], expected: int) -> dict:
    return {"n": len(delays), "expected": expected, "missed": expected - len(delays), "p50_ms": pct(delays, 0.5),
            "p99_ms": pct(delays, 0.99), "max_ms": max(delays) if delays else None,
            "min_ms": min(delays) if delays else None, "mean_ms": statistics.fmean(delays) if delays else None}


def collect(opened: list[dict], published: dict[str, dict[int, float]], t_lo: float, t_hi: float) -> dict:
    """Per page kind: the delay (ms) of every record published in [t_lo, t_hi) that the page showed."""
    out: dict[str, dict] = {k: {"delays_ms": [], "expected": 0, "pages": []} for k in ("overview", "job")}
    for p in opened:
        first: dict[tuple[str, int], float] = {}
        for key, k, at in p["page"].evaluate("() => window.__benchSeen"):
            first.setdefault((p["job"] if key == "job" else key, int(k)), float(at))
        delays, expected = [], 0
        for job in ([p["job"]] if p["kind"] == "job" else list(published)):
            for k, pub in sorted(published[job].items()):
                if t_lo <= pub < t_hi:
                    expected += 1
                    if (job, k) in first:
                        delays.append(first[(job, k)] - pub * 1000.0)
        kind = out[p["kind"]]
        kind["delays_ms"] += delays
        kind["expected"] += expected
        kind["pages"].append({"url": p["url"], "job": p["job"], **summarize(delays, expected)})
    for kind in out.values():
        kind["summary"] = summarize(kind["delays_ms"], kind["expected"])
    return out


# ---------------------------------------------------------------------------------------------------- the run
def run(a: argparse.Namespace, prov: dict) -> dict:
    from playwright.sync_api import sync_playwright

    from fstream_provider.bus.embedded import RedisServer

    if not Path(CHROMIUM).exists():
        raise SystemExit(f"fstream bench live-view: {CHROMIUM} is not installed (bench/install-deps.sh installs it)")
    res: dict = {"bench": "live-view", "provenance": prov, "goals": GOALS,
                 "config": {"jobs": a.jobs, "pages": a.pages, "seconds": a.seconds, "interval_s": a.interval,
                            "warmup_s": a.warmup, "settle_s": SETTLE_S, "grace_s": GRACE_S, "step_bps": STEP_BPS,
                            "browser": CHROMIUM, "pages_opened": "directly (not framed by Airflow's UI)"}}
    with contextlib.ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="fstream-live-view-"))
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        redis = RedisServer(str(work / "redis"))
        redis.start()
        stack.callback(redis.stop)
        t0 = time.monotonic()
        env, run_id, jobs = airflow_site(work, redis.url, a.jobs)
        res["setup_s"] = {"airflow_and_jobs": time.monotonic() - t0}
        base, proc = stack.enter_context(serve(env, password=PASSWORD, passwords_file="bench-passwords.json"))
        jwt = login(base, "admin", PASSWORD)
        attempts = claim_all(redis.url, [jobs[i] for i in sorted(jobs)])
        pub = Publisher(redis.url, attempts, a.interval)
        pub.start()
        stack.callback(pub.stop)
        pw = stack.enter_context(sync_playwright())
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        stack.callback(browser.close)
        meter = Meter(proc.pid, redis.proc.pid)
        time.sleep(a.warmup)  # the publisher's first records, the browser started: then (a)
        phases = [meter.phase("a", 0, a.seconds)]
        print(f"(a) no page: api-server {phases[0]['api_cores'] * 100:.1f} % of a core", flush=True)
        before = meter.read()
        opened = open_pages(browser, base, jwt, page_plan(base, run_id, jobs, a.pages))
        time.sleep(2.0)  # the pages' first renders and image decodes done
        after = meter.read()
        res["page_open"] = {"wall_s": after["t"] - before["t"], "api_cpu_s": after["api"] - before["api"],
                            "browser_cpu_s": after["browser"] - before["browser"]}
        phases.append(meter.phase("b", len(opened), a.seconds))
        b = phases[-1]
        print(f"(b) {len(opened)} pages: api-server {b['api_cores'] * 100:.1f} % of a core", flush=True)
        time.sleep(GRACE_S)
        res["freshness"] = collect(opened, pub.published, b["start_unix"], b["end_unix"])
        for p in opened:
            p["ctx"].close()
        time.sleep(SETTLE_S)
        phases.append(meter.phase("c", 0, a.seconds))
        print(f"(c) no page: api-server {phases[-1]['api_cores'] * 100:.1f} % of a core", flush=True)
        pub.stop()
        if pub.error is not None:
            raise RuntimeError(f"the publisher failed: {pub.error!r}") from pub.error
        res["publisher"] = {"records": sum(len(v) for v in pub.published.values()), "worst_late_s": pub.late_s}
    base_cores = (phases[0]["api_cores"] + phases[2]["api_cores"]) / 2
    added = phases[1]["api_cores"] - base_cores
    res["cpu"] = {"phases": phases, "baseline_cores": base_cores, "added_cores": added,
                  "added_pct_core": added * 100, "api_total_pct_core": phases[1]["api_cores"] * 100,
                  "added_pct_of_baseline": added / base_cores * 100 if base_cores > 0 else None,
                  "browser_added_pct_core": (phases[1]["browser_cores"] - (phases[0]["browser_cores"]
                                                                           + phases[2]["browser_cores"]) / 2) * 100}
    f = res["freshness"]
    res["met"] = {"freshness": all(f[k]["summary"]["n"] and f[k]["summary"]["p50_ms"] <= GOALS["p50_ms"]
                                   and f[k]["summary"]["p99_ms"] <= GOALS["p99_ms"] for k in f),
                  "cpu": res["cpu"]["added_pct_core"] <= GOALS["added_pct_core"]}
    return res


def report(res: dict) -> str:
    from fstream_bench.core import runstats

    _ms = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    c, cfg = res["cpu"], res["config"]
    lines = [f"Command: `{res['provenance']['command']}`  ", runstats.provenance_line(res["provenance"]), "",
             f"{cfg['jobs']} running jobs, one interval record each per {cfg['interval_s']:g} s; {cfg['pages']} pages "
             f"(1 overview + {cfg['pages'] - 1} job views) in Chromium; {cfg['seconds']:g} s per phase.", "",
             "| view | pages | records shown (published) | p50 ms | p99 ms | max ms | goal p50 ≤ 1 s, p99 ≤ 2 s |",
             "|---|---|---|---|---|---|---|"]
    for kind, f in res["freshness"].items():
        s = f["summary"]
        ok = bool(s["n"]) and s["p50_ms"] <= GOALS["p50_ms"] and s["p99_ms"] <= GOALS["p99_ms"]
        lines.append(f"| {kind} | {len(f['pages'])} | {s['n']} ({s['expected']}) | {_ms(s['p50_ms'])} | "
                     f"{_ms(s['p99_ms'])} | {_ms(s['max_ms'])} | {'met' if ok else 'NOT met'} |")
    lines += ["", "| phase | pages | api-server CPU, % of a core (sd of 1-s samples) | browser | redis-server |",
              "|---|---|---|---|---|"]
    for p in c["phases"]:
        sd = "-" if p["api_cores_sd"] is None else f"{p['api_cores_sd'] * 100:.1f}"
        lines.append(f"| {p['phase']} | {p['pages']} | {p['api_cores'] * 100:.2f} ({sd}) | "
                     f"{p['browser_cores'] * 100:.1f} | {p['redis_cores'] * 100:.1f} |")
    rel = "-" if c["added_pct_of_baseline"] is None else f"{c['added_pct_of_baseline']:+.0f} %"
    po = res["page_open"]
    lines += ["", f"plugin adds {c['added_pct_core']:.2f} % of a core to the api-server (b − mean(a, c); goal ≤ "
              f"{GOALS['added_pct_core']:g} %: {'met' if res['met']['cpu'] else 'NOT met'}); api-server total in (b) "
              f"{c['api_total_pct_core']:.2f} %, {rel} over its baseline; browser adds "
              f"{c['browser_added_pct_core']:.1f} "
              f"% (not counted)", f"opening the pages (outside the phases): api-server {po['api_cpu_s']:.2f} CPU-s, "
              f"browser {po['browser_cpu_s']:.2f} CPU-s in {po['wall_s']:.1f} s"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="fstream bench live-view", description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=50, help="running jobs (default 50)")
    ap.add_argument("--pages", type=int, default=5, help="open pages: 1 overview + the rest job views (default 5)")
    ap.add_argument("--seconds", type=float, default=60.0, help="length of each CPU phase (default 60)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between a job's records (default 1)")
    ap.add_argument("--warmup", type=float, default=5.0, help="publishing before phase (a) (default 5)")
    ap.add_argument("--results", default=str(RESULTS_DIR))
    a = ap.parse_args(argv)
    if a.pages < 2 or a.jobs < 1 or a.pages - 1 > a.jobs:
        ap.error("--pages needs at least 2 (the overview and one job view) and no more job views than --jobs")
    from fstream_bench.core import provenance, runstats

    prov = provenance.start("live-view", argv, MODULES)
    res = run(a, prov)
    provenance.finish(prov)
    md = report(res)
    jp, _mp = runstats.write_result(a.results, "live-view", res, md)
    print(md)
    print(f"\nresults: {jp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
