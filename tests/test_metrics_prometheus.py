"""Issue 30, "Prometheus metrics": a real Prometheus (``/usr/bin/prometheus``) scrapes a real ``fstream receive``
and ``fstream agent`` (both as the CLI runs them, with ``--metrics-listen 127.0.0.1:0``) every second while a real
job moves files through them over loopback (real redis-server); once Prometheus has scraped both after the job
finished, its query API gives exactly the transfer's bytes and files.

Skipped (saying why) when Prometheus is not installed, unless ``FSTREAM_REQUIRE_WAN=1``: then it fails.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import authkit
from agentkit import make_files, trees_identical, wait_until, write_secret
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.model.spec import TransferSpec

PROMETHEUS = "/usr/bin/prometheus"
NS = Keys("promtest")
FSTREAM = (sys.executable, "-m", "transfer_agent.cli")


@pytest.fixture(autouse=True)
def _prometheus_installed() -> None:
    if not os.access(PROMETHEUS, os.X_OK):
        if os.environ.get("FSTREAM_REQUIRE_WAN") == "1":
            pytest.fail(f"{PROMETHEUS} is not installed and FSTREAM_REQUIRE_WAN=1 (bench/install-deps.sh installs it)")
        pytest.skip(f"{PROMETHEUS} is not installed (bench/install-deps.sh installs it; FSTREAM_REQUIRE_WAN=1 "
                    "makes this a failure)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class Daemon:
    """An ``fstream`` daemon in a subprocess, its output in files (read while it runs, never a full pipe)."""

    def __init__(self, argv: list[str], workdir: Path, name: str, env: dict[str, str]) -> None:
        self.out, self.err = workdir / f"{name}.out", workdir / f"{name}.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)

    def find(self, pattern: str, what: str) -> re.Match:
        def found() -> re.Match | None:
            assert self.proc.poll() is None, f"{what}: the daemon exited ({self.err.read_text()[-2000:]})"
            return re.search(pattern, self.out.read_text() + self.err.read_text())

        return wait_until(found, 30, what)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    try:
        yield started
    finally:
        for d in reversed(started):
            d.stop()


def _prometheus(workdir: Path, targets: dict[str, str], daemons: list[Daemon], env: dict[str, str]) -> str:
    """Start Prometheus scraping ``targets`` (job -> host:port) every second; its base URL once it is ready."""
    jobs = "".join(f"  - job_name: {job}\n    static_configs:\n      - targets: ['{addr}']\n"
                   for job, addr in targets.items())
    cfg = workdir / "prometheus.yml"
    cfg.write_text(f"global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n"
                   f"scrape_configs:\n{jobs}")
    port = _free_port()
    prom = Daemon([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                   f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], workdir, "prometheus", env)
    daemons.append(prom)
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert prom.proc.poll() is None, f"prometheus exited: {prom.err.read_text()[-2000:]}"
        try:
            return _get(base + "/-/ready", 1.0)[0] == 200
        except OSError:
            return False

    wait_until(ready, 30, "Prometheus ready")
    return base


def _scraped_after(base: str, since: float) -> bool:
    """Every target was scraped, successfully, after ``since`` (unix seconds)."""
    code, body = _get(base + "/api/v1/targets")
    assert code == 200, body
    active = json.loads(body)["data"]["activeTargets"]
    def at(t: dict) -> float:  # RFC 3339 with nanoseconds: "2026-11-26T06:14:54.123456789Z" (or "+01:00")
        m = re.fullmatch(r"(.+T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", t["lastScrape"])
        assert m, t["lastScrape"]
        zone = "+00:00" if m.group(3) == "Z" else m.group(3)
        return datetime.fromisoformat(m.group(1) + zone).timestamp() + float(m.group(2) or 0)

    return bool(active) and all(t["health"] == "up" and at(t) > since for t in active)


def _query(base: str, promql: str) -> dict[str, float]:
    """An instant query's samples: {their labels as 'k=v,...' (job and instance left out): value}."""
    code, body = _get(base + "/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert code == 200, body
    out = {}
    for r in json.loads(body)["data"]["result"]:
        lab = ",".join(f"{k}={v}" for k, v in sorted(r["metric"].items()) if k not in ("job", "instance", "__name__"))
        out[lab] = float(r["value"][1])
    return out


def test_prometheus_scrapes_exactly_the_transfers_bytes_and_files(tmp_path: Path, redis_url: str, redis_client: Any,
                                                                  daemons: list[Daemon]) -> None:
    sizes = {f"run/img_{i:03d}.h5": 100_000 + 7919 * i for i in range(12)} | {"run/big.h5": 6 * 2**20}
    src = make_files(tmp_path / "src", sizes, seed=30)
    total, count = sum(sizes.values()), len(sizes)
    secret = write_secret(tmp_path / "secret")
    env = {**os.environ, "FSTREAM_STATE_DIR": str(tmp_path / "state")}
    rx = Daemon([*FSTREAM, "receive", "--listen", "127.0.0.1:0", "--root", str(tmp_path / "dst"), "--secret-file", str(secret),
                 "--metrics-listen", "127.0.0.1:0"], tmp_path, "receive", env)
    daemons.append(rx)
    rx_port = int(rx.find(r"listening on 127\.0\.0\.1:(\d+)", "the receiver listening").group(1))
    rx_metrics = rx.find(r"metrics on http://(127\.0\.0\.1:\d+)/metrics", "the receiver's metrics address").group(1)
    agent = Daemon([*FSTREAM, "agent", "--redis", redis_url, "--namespace", NS.namespace, "--name", "prom-agent",
                    "--policy", authkit.policy_file(tmp_path, secret, destinations=authkit.receiver(rx_port)),
                    "--metrics-listen", "127.0.0.1:0"],
                   tmp_path, "agent", env)
    daemons.append(agent)
    agent_metrics = agent.find(r"metrics on http://(127\.0\.0\.1:\d+)/metrics", "the agent's metrics address").group(1)
    base = _prometheus(tmp_path, {"fstream-receiver": rx_metrics, "fstream-agent": agent_metrics}, daemons, env)
    wait_until(lambda: _scraped_after(base, 0), 30, "a first scrape of both daemons")

    store = JobStore(redis_client, keys=NS, signer=authkit.signer())
    job_id, _ = store.submit(TransferSpec(sources=[str(src)], destination=f"fstream://127.0.0.1:{rx_port}/out",
                                          tuner="fixed", cc=2, p=2, pp=4))
    job = wait_until(lambda: (j := store.get(job_id)) and j.terminal and j, 60, "the job to finish")
    assert job.state == "succeeded", job.error
    assert trees_identical(src, tmp_path / "dst" / "out")
    done = time.time()
    wait_until(lambda: _scraped_after(base, done), 30, "both daemons scraped after the job finished")

    path = f"path=127.0.0.1:{rx_port}"
    assert _query(base, "sum(up)") == {"": 2.0}
    assert _query(base, "fstream_receiver_received_bytes_total") == {"": total}
    assert _query(base, "fstream_receiver_files_total")["outcome=ok"] == count
    assert _query(base, "fstream_receiver_file_latency_seconds_count") == {"": count}
    assert _query(base, "fstream_receiver_sessions_open") == {"": 0.0}  # the session ended with the job
    assert _query(base, 'fstream_agent_files_total{outcome="committed"}') == {f"outcome=committed,{path}": count}
    assert _query(base, 'fstream_agent_file_bytes_total{outcome="committed"}') == {f"outcome=committed,{path}": total}
    assert _query(base, "fstream_agent_sent_bytes_total") == {path: total}
    assert _query(base, 'fstream_agent_jobs_total{outcome="succeeded"}') == {"outcome=succeeded": 1.0}
    assert _query(base, "fstream_agent_jobs_waiting") == {"": 0.0}
    assert _query(base, "fstream_agent_tuning_decisions_total") == {"reason=fixed,tuner=fixed": 1.0}
    # every expression of the Grafana dashboard is PromQL this Prometheus evaluates, and finds series for (rates
    # need two samples of a series: the agent's per-path ones appeared with the job)
    wait_until(lambda: _scraped_after(base, done + 1.5), 30, "two more scrapes")
    dashboard = json.loads((Path(__file__).resolve().parent.parent / "docs" / "grafana" / "fstream.json").read_text())
    for expr in (t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])):
        assert _query(base, expr), f"dashboard expression found no series: {expr}"


def test_prometheus_scrapes_a_multi_process_receiver_through_its_router(tmp_path: Path, daemons: list[Daemon]) -> None:
    """Issue 43: ``fstream receive --workers 2 --metrics-listen``, one Prometheus target. Two jobs, routed to the two
    workers, land; Prometheus then has each worker's receiver series under ``worker``, and their sums are exactly
    the transfers' bytes and files."""
    from agentkit import jobs_on_workers, send

    secret = write_secret(tmp_path / "secret")
    env = {**os.environ, "FSTREAM_STATE_DIR": str(tmp_path / "state")}
    rx = Daemon([*FSTREAM, "receive", "--listen", "127.0.0.1:0", "--root", str(tmp_path / "dst"), "--secret-file",
                 str(secret), "--workers", "2", "--metrics-listen", "127.0.0.1:0"], tmp_path, "receive", env)
    daemons.append(rx)
    port = int(rx.find(r"listening on 127\.0\.0\.1:(\d+)", "the router listening").group(1))
    target = rx.find(r"receive --workers: metrics on http://(127\.0\.0\.1:\d+)/metrics", "the router's metrics").group(1)
    base = _prometheus(tmp_path, {"fstream-receiver": target}, daemons, env)
    wait_until(lambda: _scraped_after(base, 0), 30, "a first scrape of the router")
    sizes = [{f"w{w}/f{i}.bin": 30_000 + 1000 * i + w for i in range(4 + 5 * w)} for w in range(2)]
    for w, job in enumerate(jobs_on_workers(2)):
        src = make_files(tmp_path / f"src{w}", sizes[w], seed=40 + w)
        result = send(src, port, secret, dest=f"out{w}", job_id=job, cc=1, p=2)
        assert result.ok, result.error
        assert trees_identical(src, tmp_path / "dst" / f"out{w}")
    done = time.time()
    wait_until(lambda: _scraped_after(base, done), 30, "the router scraped after both jobs")
    assert _query(base, 'fstream_receiver_files_total{outcome="ok"}') == {"outcome=ok,worker=0": 4.0,
                                                                          "outcome=ok,worker=1": 9.0}
    assert _query(base, "sum(fstream_receiver_received_bytes_total)") == {"": float(sum(sum(s.values()) for s in sizes))}
    assert _query(base, "fstream_router_worker_up") == {"worker=0": 1.0, "worker=1": 1.0}
    assert _query(base, "sum(up)") == {"": 1.0}
