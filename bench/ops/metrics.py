"""Issue 30: what Prometheus metrics cost the daemons: CPU-seconds per GB of ``fstream receive`` + ``fstream agent``,
metrics off against metrics on with a scraper.

``fstream bench metrics [--repeats 5 --bytes 1GiB --files 1 --cc 1 --p 4 --pp 1 --scrape-interval 1s]``

The pinned loopback transfer of ``fstream bench loopback`` (its case "a: 1 GiB, p=4" by default; the source and
destination trees on tmpfs, the agent pinned to CPU 0 and the receiver to CPU 1 with ``taskset``), moved as a job:
a real ``redis-server`` (unpinned, not measured), ``fstream agent`` and ``fstream receive`` started fresh for every
run, without ``--metrics-listen`` (off) or with ``--metrics-listen 127.0.0.1:0`` (on). With metrics on, a scraper
thread GETs both daemons' ``/metrics`` every ``--scrape-interval`` for the whole run, as Prometheus would. Runs
alternate in ABBA order over ``--repeats`` pairs. Each daemon's CPU is its process tree's user + system
(``cpu_meter.ServerCpu``: read just before the job is submitted, again once the tree is quiet after the job
finished), per GB moved: both daemons together and each, medians and ranges, the on/off ratio of each pair and of
the medians. Goal: metrics add at most 2 % CPU per GB (ratio of the medians <= 1.02).

Writes ``bench/results/metrics-<stamp>.json`` (every run, provenance) and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
MODULES = ("transfer_agent", "fstream_provider.bus", "fstream_provider.authz",
           "fstream_provider.model", "fstream_provider.watch",
           "fstream_provider.tuning", "fstream_bench.ops.metrics", "fstream_bench.datapath.loopback",
           "fstream_bench.core.cpu_meter", "fstream_bench.peers", "fstream_bench.core.runstats")
GOAL = 1.02
_METRICS_AT = re.compile(r"metrics on (http://\S+)/metrics")


class Scraper:
    """GETs each URL every ``interval`` seconds in a thread, as Prometheus does; counts what it got."""

    def __init__(self, urls: list[str], interval: float) -> None:
        self.urls, self.interval = urls, interval
        self.ok = self.failed = self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-scraper", daemon=True)

    def start(self) -> "Scraper":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            for url in self.urls:
                try:
                    with urllib.request.urlopen(url, timeout=2) as r:
                        self.bytes += len(r.read())
                    self.ok += 1
                except OSError:
                    self.failed += 1
            self._stop.wait(self.interval)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(10)
        return {"ok": self.ok, "failed": self.failed, "bytes": self.bytes}


def dataset(root: Path, total: int, files: int, seed: int = 0) -> Path:
    """``files`` files of ``total // files`` bytes under ``root/data`` (seeded content, as the loopback bench's)."""
    from fstream_bench.core.workload_gen import content_block, write_file

    block = content_block(seed)
    src = root / "data"
    for i in range(files):
        write_file(src / f"f{i:05d}.dat", total // files, block, key=f"{seed}:metrics:{i}")
    return src


def one_run(ctx: dict, mode: str, rep: int) -> dict:
    """One transfer through a fresh agent and receiver, metrics ``on`` or ``off``; both daemons' CPU."""
    from fstream_bench.core.cpu_meter import ServerCpu
    from fstream_bench.peers import fstream as fs_peer
    from fstream_bench.peers.base import wait_logged
    from fstream_provider.bus.jobs import JobStore
    from fstream_provider.bus.keys import Keys
    from fstream_provider.model.spec import TransferSpec

    work, sites, on = ctx["work"], ctx["sites"], mode == "on"
    extra = ["--metrics-listen", "127.0.0.1:0"] if on else []
    dst = work / "dst"
    shutil.rmtree(dst, ignore_errors=True)
    ns = f"metricsbench{rep}{mode}"
    log = work / f"agent-{rep}-{mode}.log"
    rx = fs_peer.FStreamReceiver(sites=sites, workdir=work / f"rx-{rep}-{mode}", root=dst, extra_args=extra)
    agent = None
    scraper = None
    try:
        rx.__enter__()
        policy = work / f"policy-{rep}-{mode}.toml"  # the agent's key "default" is the receiver's secret
        policy.write_text(f'[agent]\nroots = ["{ctx["src"]}"]\ndestinations = ["{rx.url("")}"]\n'
                          f'[agent.keys]\ndefault = "{rx.secret}"\n'
                          f'[submitters.bench]\npublic_key_file = "{ctx["key"]}.pub"\n')
        agent = fs_peer.FStreamAgent(sites=sites, redis_url=ctx["redis_url"], namespace=ns, policy=policy,
                                     name=f"bench-{rep}-{mode}", extra_args=extra, log=log,
                                     env={"FSTREAM_STATE_DIR": str(work / "state")}).__enter__()
        if on:
            urls = [wait_logged(p, _METRICS_AT, proc, f"{what} metrics address").group(1) + "/metrics"
                    for p, proc, what in ((rx.log, rx.proc, "fstream receive"), (log, agent.proc, "fstream agent"))]
            scraper = Scraper(urls, ctx["scrape_interval"]).start()
        store = JobStore(ctx["client"], keys=Keys(ns), signer=ctx["signer"])
        spec = TransferSpec(sources=[str(ctx["src"])], destination=rx.url("in"), tuner="fixed", **ctx["knobs"])
        cpu_rx, cpu_agent = ServerCpu(rx.proc.pid).start(), ServerCpu(agent.proc.pid).start()
        t0 = time.monotonic()
        job_id, _ = store.submit(spec)
        while not (job := store.get(job_id)).terminal:
            if time.monotonic() - t0 > ctx["timeout"]:
                raise RuntimeError(f"job {job_id} ({mode}, repeat {rep}) not done after {ctx['timeout']:.0f} s")
            time.sleep(0.05)  # polling the job's state with a deadline
        wall = time.monotonic() - t0
        rx_s, agent_s = cpu_rx.stop(), cpu_agent.stop()
        scrapes = scraper.stop() if scraper is not None else None
        landed = sum(p.stat().st_size for p in (dst / "in").rglob("*") if p.is_file())
        if job.state != "succeeded" or landed != ctx["bytes"]:
            raise RuntimeError(f"run {mode}/{rep}: job {job.state} ({job.error}); {landed} of {ctx['bytes']} bytes")
        gb = ctx["bytes"] / 1e9
        return {"mode": mode, "repeat": rep, "seconds": wall, "cpu_rx_s": rx_s, "cpu_agent_s": agent_s,
                "cpu_s_per_gb": (rx_s + agent_s) / gb, "rx_s_per_gb": rx_s / gb, "agent_s_per_gb": agent_s / gb,
                "scrapes": scrapes}
    finally:
        if scraper is not None:
            scraper.stop()
        if agent is not None:
            agent.__exit__(None, None, None)
        rx.__exit__(None, None, None)
        shutil.rmtree(dst, ignore_errors=True)


def run(work: Path, *, repeats: int, total: int, files: int, knobs: dict, scrape_interval: float, pin: bool,
        timeout: float, log=print) -> dict:
    from fstream_bench.datapath.loopback import _warm
    from fstream_bench.peers.base import Sites
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.embedded import RedisServer
    from fstream_provider.authz.ed25519 import ensure_pair
    from fstream_provider.authz.signing import Signer

    pinned = pin and shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
    sites = Sites(src_prefix=("taskset", "-c", "0"), dst_prefix=("taskset", "-c", "1")) if pinned else Sites()
    src = dataset(work, total, files)
    _warm(sorted(src.iterdir()))
    key = work / "submitter.key"
    ensure_pair(key, "bench")  # Ed25519: the agents' policy names key.pub
    server = RedisServer(str(work / "redis"))
    server.start()
    client = connect(server.url)
    ctx = {"work": work, "sites": sites, "src": src, "bytes": (total // files) * files, "knobs": knobs,
           "key": key, "redis_url": server.url, "client": client, "signer": Signer.from_file("bench", str(key)),
           "scrape_interval": scrape_interval, "timeout": timeout}
    runs: list[dict] = []
    try:
        for rep in range(repeats):
            for mode in (("off", "on") if rep % 2 == 0 else ("on", "off")):
                r = one_run(ctx, mode, rep)
                runs.append(r)
                log(f"metrics: [{rep + 1}/{repeats}] {mode}: {r['seconds']:.2f} s, CPU receiver {r['cpu_rx_s']:.3f} s "
                    f"+ agent {r['cpu_agent_s']:.3f} s = {r['cpu_s_per_gb']:.3f} s/GB"
                    + (f", {r['scrapes']['ok']} scrapes ({r['scrapes']['failed']} failed)" if r["scrapes"] else ""))
    finally:
        client.close()
        server.stop()
    return summarize(runs, pinned=pinned, total=ctx["bytes"], files=files, knobs=knobs,
                     scrape_interval=scrape_interval)


def summarize(runs: list[dict], **setup) -> dict:
    from fstream_bench.core import runstats

    doc: dict = {"bench": "metrics", "setup": setup, "runs": runs, "goal_ratio_max": GOAL}
    for key in ("cpu_s_per_gb", "rx_s_per_gb", "agent_s_per_gb", "seconds"):
        doc[key] = {m: runstats.series([r[key] for r in runs if r["mode"] == m], "s/GB" if key != "seconds" else "s")
                    for m in ("off", "on")}
    off = [r["cpu_s_per_gb"] for r in runs if r["mode"] == "off"]
    on = [r["cpu_s_per_gb"] for r in runs if r["mode"] == "on"]
    doc["pair_ratios"] = runstats.pair_ratios(off, on)
    doc["ratio"] = statistics.median(on) / statistics.median(off) if off and on and statistics.median(off) else None
    doc["goal_met"] = doc["ratio"] is not None and doc["ratio"] <= GOAL
    return doc


def markdown(doc: dict) -> str:
    from fstream_bench.core import runstats

    s = doc["setup"]
    lines = [f"Command: `{doc['provenance']['command']}`  ", runstats.provenance_line(doc["provenance"]), "",
             f"{s['files']} file(s), {s['total'] / 2**30:.2f} GiB, fixed cc={s['knobs']['cc']} p={s['knobs']['p']} "
             f"pp={s['knobs']['pp']}; agent on CPU 0, receiver on CPU 1: {'yes' if s['pinned'] else 'no (unpinned)'}; "
             f"scraper every {s['scrape_interval']:g} s with metrics on; ABBA pairs: {len(doc['pair_ratios'])}.", "",
             "| metrics | CPU-s per GB, both daemons | receiver | agent | seconds |", "|---|---|---|---|---|"]
    for m in ("off", "on"):
        lines.append(f"| {m} | {runstats.med_range(doc['cpu_s_per_gb'][m]['values'], '{:.3f}')} | "
                     f"{runstats.med_range(doc['rx_s_per_gb'][m]['values'], '{:.3f}')} | "
                     f"{runstats.med_range(doc['agent_s_per_gb'][m]['values'], '{:.3f}')} | "
                     f"{runstats.med_range(doc['seconds'][m]['values'], '{:.2f}')} |")
    ratio = f"{doc['ratio']:.3f}" if doc["ratio"] is not None else "-"
    pairs = ", ".join(f"{x:.3f}" for x in doc["pair_ratios"])
    lines += ["", "| goal | measured |", "|---|---|",
              f"| metrics on / off, CPU-s per GB of both daemons (ratio of the medians) <= {GOAL} | {ratio} "
              f"({'met' if doc['goal_met'] else 'not met'}; per pair: {pairs}) |"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="fstream bench metrics", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="ABBA pairs (default 5)")
    ap.add_argument("--bytes", default="1GiB", help="bytes moved per run (default 1GiB, the loopback bench's case a)")
    ap.add_argument("--files", type=int, default=1, help="split into this many files (default 1)")
    ap.add_argument("--cc", type=int, default=1)
    ap.add_argument("--p", type=int, default=4)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--scrape-interval", default="1s", help="how often the scraper GETs /metrics (default 1s)")
    ap.add_argument("--timeout", default="10m", help="a run that takes longer fails (default 10m)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the agent to CPU 0 and the receiver to CPU 1")
    ap.add_argument("--workdir", default=None, help="where the trees go (default: a new directory on tmpfs)")
    ap.add_argument("--results", default=str(RESULTS_DIR))
    a = ap.parse_args(argv)
    from fstream_bench.core import provenance, runstats
    from fstream_bench.datapath.loopback import _tmpfs_root
    from fstream_provider.model.units import parse_duration, parse_size

    total, files = parse_size(a.bytes), a.files
    if files < 1 or total < files or a.repeats < 1:
        ap.error("--files and --repeats must be at least 1, and --bytes at least one byte per file")
    prov = provenance.start("metrics", argv, MODULES)
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="fstream-bench-metrics-",
                                                                   dir=_tmpfs_root()))
    work.mkdir(parents=True, exist_ok=True)
    try:
        doc = run(work, repeats=a.repeats, total=total, files=files, knobs={"cc": a.cc, "p": a.p, "pp": a.pp},
                  scrape_interval=parse_duration(a.scrape_interval), pin=not a.no_pin,
                  timeout=parse_duration(a.timeout))
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    doc["provenance"] = provenance.finish(prov)
    md = markdown(doc)
    jp, mp = runstats.write_result(a.results, "metrics", doc, md)
    print(md)
    print(f"results: {jp}, {mp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
