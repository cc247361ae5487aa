"""Issue 30, "Prometheus metrics" and "Health": what the daemons expose and how it stays bounded.

Real receivers and transfers over loopback, a real redis-server; the metrics read back through the HTTP endpoint
(the exposition Prometheus parses), the readiness checks each made to fail for one reason, named.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

import authkit
from agentkit import make_files, send, start_receiver, wait_until, write_secret
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.model.spec import TransferSpec
from transfer_agent.daemon.worker import Agent
from transfer_agent.service import labels
from transfer_agent.service.endpoint import ServiceEndpoint
from transfer_agent.service.health import agent_readiness, free_space, receiver_readiness, root_writable
from transfer_agent.service.metrics import AgentMetrics, ReceiverMetrics
from transfer_agent.service.queue_depth import QueueDepth

FSTREAM = (sys.executable, "-m", "transfer_agent.cli")


def _get(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, str, str]:
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of an exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _scrape(ep: ServiceEndpoint) -> dict:
    code, ctype, body = _get(ep.url + "/metrics")
    assert code == 200 and ctype.startswith("text/plain"), (code, ctype)
    return _samples(body)


def _never_ready() -> list:
    raise AssertionError("readiness was not asked for")


@pytest.fixture
def rx_metrics(rx: Any) -> Iterator[tuple[Any, ServiceEndpoint]]:
    m = ReceiverMetrics(rx)
    ep = ServiceEndpoint(("127.0.0.1", 0), m.registry, receiver_readiness([rx.root], 1)).start()
    try:
        yield m, ep
    finally:
        ep.stop()
        m.close()


# -- the receiver ------------------------------------------------------------------------------------------
def test_receiver_metrics_count_a_real_transfer(tmp_path: Path, rx: Any, secret: Path, rx_metrics: Any) -> None:
    sizes = {"a.bin": 1000, "b.bin": 250_000, "sub/c.bin": 3 * 2**20}
    make_files(tmp_path / "src", sizes, seed=1)
    assert send(tmp_path / "src", rx.port, secret).ok
    _m, ep = rx_metrics
    got = _scrape(ep)
    assert got[("fstream_receiver_received_bytes_total", ())] == sum(sizes.values())
    assert got[("fstream_receiver_files_total", (("outcome", "ok"),))] == 3
    assert got[("fstream_receiver_file_latency_seconds_count", ())] == 3
    assert 0 < got[("fstream_receiver_file_latency_seconds_sum", ())] < 60
    assert got[("fstream_receiver_sessions_total", ())] >= 1
    assert got[("fstream_receiver_disk_free_bytes", (("root", rx.root),))] == pytest.approx(
        os.statvfs(rx.root).f_bavail * os.statvfs(rx.root).f_frsize, rel=0.01)
    # every outcome and reason is there from the start (a dashboard's rate() needs the zero)
    outcomes = {dict(k[1])["outcome"] for k in got if k[0] == "fstream_receiver_files_total"}
    assert outcomes == set(labels.RECEIVER_OUTCOMES)
    reasons = {dict(k[1])["reason"] for k in got if k[0] == "fstream_receiver_auth_refusals_total"}
    assert reasons == set(labels.PREAUTH_REASONS)
    # a second send finds every file there with the same digest: skipped, not received again
    assert send(tmp_path / "src", rx.port, secret).ok
    again = _scrape(ep)
    assert again[("fstream_receiver_files_total", (("outcome", "skipped"),))] == 3
    assert again[("fstream_receiver_received_bytes_total", ())] == sum(sizes.values())


def test_refusals_before_authentication_are_counted_by_reason(tmp_path: Path, secret: Path) -> None:
    rx = start_receiver(tmp_path / "dst", secret, max_unauth_per_addr=1, require_encryption=True)
    m = ReceiverMetrics(rx)
    ep = ServiceEndpoint(("127.0.0.1", 0), m.registry, _never_ready).start()
    held = socket.create_connection(("127.0.0.1", rx.port))  # says nothing: holds the one pre-auth slot
    try:
        def refusal(reason: str) -> float:
            return _scrape(ep)[("fstream_receiver_auth_refusals_total", (("reason", reason),))]

        wait_until(lambda: _scrape(ep)[("fstream_receiver_unauthenticated_connections", ())] == 1, what="slot held")
        extra = socket.create_connection(("127.0.0.1", rx.port), timeout=10)
        wait_until(lambda: extra.recv(1) == b"", what="the connection over the cap closed")
        extra.close()
        assert refusal("too_many_unauthenticated") == 1
        held.close()
        wait_until(lambda: refusal("disconnected") == 1, what="the silent connection's hang-up counted")
        make_files(tmp_path / "src", {"x": 10})
        r = send(tmp_path / "src", rx.port, secret, max_session_retries=0)  # does not encrypt: refused
        assert not r.ok and "requires encryption" in r.failures[0]["reason"]
        wait_until(lambda: refusal("auth_failed") == 1, what="the refusal counted")
        # a sender with the wrong secret checks the receiver's proof first, and hangs up
        r = send(tmp_path / "src", rx.port, write_secret(tmp_path / "wrong"), max_session_retries=0, encrypt=True)
        assert not r.ok and "does not know our shared secret" in r.failures[0]["reason"]
        wait_until(lambda: refusal("disconnected") == 2, what="the wrong secret's hang-up counted")
        junk = socket.create_connection(("127.0.0.1", rx.port))
        junk.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"x" * 64)
        wait_until(lambda: refusal("protocol_error") == 1, what="junk counted")
        junk.close()
        assert refusal("handshake_timeout") == 0 and refusal("evicted") == 0 and refusal("auth_failed") == 1
    finally:
        held.close()
        ep.stop()
        rx.stop()


def test_a_handshake_deadline_is_counted_as_a_timeout_not_a_hang_up(tmp_path: Path, secret: Path) -> None:
    rx = start_receiver(tmp_path / "dst", secret, handshake_timeout=0.3)
    m = ReceiverMetrics(rx)
    slow = socket.create_connection(("127.0.0.1", rx.port), timeout=10)
    try:
        assert slow.recv(1) == b""  # the watchdog cut it
        with ServiceEndpoint(("127.0.0.1", 0), m.registry, _never_ready) as ep:
            got = wait_until(lambda: (g := _scrape(ep))[("fstream_receiver_unauthenticated_connections", ())] == 0
                             and g, what="the handler ended")
        assert got[("fstream_receiver_auth_refusals_total", (("reason", "handshake_timeout"),))] == 1
        assert got[("fstream_receiver_auth_refusals_total", (("reason", "disconnected"),))] == 0
    finally:
        slow.close()
        rx.stop()


def test_each_daemon_has_its_own_registry_and_the_global_one_stays_empty(tmp_path: Path, secret: Path) -> None:
    a = start_receiver(tmp_path / "a", secret)
    b = start_receiver(tmp_path / "b", secret)
    try:
        ma, mb = ReceiverMetrics(a), ReceiverMetrics(b)  # the same names twice: no "Duplicated timeseries"
        AgentMetrics()
        make_files(tmp_path / "src", {"f": 5000})
        assert send(tmp_path / "src", a.port, secret).ok
        with ServiceEndpoint(("127.0.0.1", 0), ma.registry, _never_ready) as ea, \
                ServiceEndpoint(("127.0.0.1", 0), mb.registry, _never_ready) as eb:
            assert _scrape(ea)[("fstream_receiver_received_bytes_total", ())] == 5000
            assert _scrape(eb)[("fstream_receiver_received_bytes_total", ())] == 0
        assert not [n for n in REGISTRY._names_to_collectors if n.startswith("fstream_")]  # noqa: SLF001
    finally:
        a.stop()
        b.stop()


# -- the agent ---------------------------------------------------------------------------------------------
def test_agent_metrics_follow_a_real_transfers_events(tmp_path: Path, rx: Any, secret: Path) -> None:
    sizes = {f"d/f{i}.bin": 40_000 + i for i in range(20)}
    make_files(tmp_path / "src", sizes, seed=2)
    m = AgentMetrics()
    spec = TransferSpec(sources=[str(tmp_path / "src")], destination=f"fstream://127.0.0.1:{rx.port}/o", tuner="fixed")
    observe = m.job(spec)
    assert send(tmp_path / "src", rx.port, secret, dest="o", on_event=observe, sample_interval="100ms").ok
    with ServiceEndpoint(("127.0.0.1", 0), m.registry, _never_ready) as ep:
        got = _scrape(ep)
    path = ("path", f"127.0.0.1:{rx.port}")
    assert got[("fstream_agent_files_total", (("outcome", "committed"), path))] == 20
    assert got[("fstream_agent_file_bytes_total", (("outcome", "committed"), path))] == sum(sizes.values())
    assert got[("fstream_agent_sent_bytes_total", (path,))] == sum(sizes.values())
    assert got[("fstream_agent_tuning_decisions_total", (("reason", "fixed"), ("tuner", "fixed")))] == 1
    assert got[("fstream_agent_channels", (("cluster", "all"),))] >= 1  # the last interval's layout, still fresh
    assert m.observer_errors == 0


def test_an_event_the_metrics_cannot_read_never_reaches_the_transfer(caplog: Any) -> None:
    m = AgentMetrics()
    observe = m.job(TransferSpec(sources=["/x"], destination="fstream://h:1/x"))
    observe("interval", {"bytes": 10, "clusters": ["not", "a", "dict"]})  # would raise inside the observer
    observe("interval", {"bytes": 5, "clusters": {"small": {"cc": 2, "p": 1, "pp": 4}}})
    assert m.observer_errors == 1 and "could not be counted" in caplog.text
    assert m.sent.labels("h:1")._value.get() == 15  # noqa: SLF001 - the counter itself: later events still count


def test_labels_stay_bounded_whatever_the_jobs_say() -> None:
    m = AgentMetrics(path_cap=3)
    for i in range(50):
        spec = TransferSpec(sources=["/x"], destination=f"fstream://host{i}.example:{4000 + i}/x",
                            tuner="fixed" if i % 2 else "fstream")
        obs = m.job(spec)
        obs("file", {"status": ["committed", "failed", "weird", None][i % 4], "size": 1, "path": f"file{i}"})
        obs("tuning", {"reason": f"fstream: something new #{i} happened", "layouts": {}})
        obs("interval", {"bytes": 1, "clusters": {f"cluster{i}": {"cc": 1, "p": 1, "pp": 1}}})
    with ServiceEndpoint(("127.0.0.1", 0), m.registry, _never_ready) as ep:
        got = _scrape(ep)
    paths = {dict(k[1])["path"] for k in got if k[0] == "fstream_agent_files_total"}
    assert len(paths) == 4 and "other" in paths  # three kept, the rest folded
    outcomes = {dict(k[1])["outcome"] for k in got if k[0] == "fstream_agent_files_total"}
    assert outcomes == {"committed", "failed", "other"}
    kinds = {dict(k[1])["reason"] for k in got if k[0] == "fstream_agent_tuning_decisions_total"}
    assert kinds == {"other"}
    clusters = {dict(k[1])["cluster"] for k in got if k[0] == "fstream_agent_channels"}
    assert clusters == {*labels.CLUSTERS, "other"}
    assert not any("file" in v for k in got for _l, v in k[1])  # no per-file label anywhere


@pytest.mark.parametrize("reason,kind", [
    ("fstream: heuristic small: cc=2 p=1 pp=8", "heuristic"),
    ("fstream: start large: cc=4 p=2 pp=1 (given cc=4)", "start"),
    ("fstream: measuring (1.0 of 3.0 s)", "measuring"),
    ("fstream: profiling: 1.20 Gbit/s within 10% of 1.30 Gbit/s", "profiling"),
    ("fstream: plateau: cc 4->8 gave 1 Gbit/s->1 Gbit/s", "profiling"),
    ("fstream: qos 800 Mbit/s target: hold cc=2", "qos"),
    ("fixed settings cc=1 p=1 pp=1", "fixed"),
    ("globus: preset for avg 1.0 MiB: cc=2 p=2 pp=4", "preset"),
    ("adaptivecc: utility 1 Gbit/s at cc=2 improved, cc=3", "profiling"),
    ("tuner error, layout kept: ZeroDivisionError: division by zero", "error"),
    ("", "other"),
    ("!!! 42", "other"),
])
def test_reason_kinds_come_from_the_first_word(reason: str, kind: str) -> None:
    assert labels.reason_kind(reason) == kind
    assert kind in labels.REASON_KINDS


# -- queue depth -------------------------------------------------------------------------------------------
def test_queue_depth_is_the_consumer_groups_lag_read_at_scrape(redis_url: str, redis_client: Any) -> None:
    keys = Keys("qd")
    store = JobStore(redis_client, keys=keys, signer=authkit.signer())
    for i in range(3):
        store.submit(TransferSpec(sources=["/x"], destination="fstream://h:1/x", label=str(i)))
    m = AgentMetrics(queue=QueueDepth(redis_url, keys, max_age=0.0))
    with ServiceEndpoint(("127.0.0.1", 0), m.registry, _never_ready) as ep:
        got = _scrape(ep)
        assert got[("fstream_agent_jobs_waiting", ())] == 3 and got[("fstream_agent_jobs_pending", ())] == 0
        redis_client.xreadgroup(keys.jobs_group(), "someone", {keys.jobs_stream(): ">"}, count=1)
        got = _scrape(ep)
        assert got[("fstream_agent_jobs_waiting", ())] == 2 and got[("fstream_agent_jobs_pending", ())] == 1
        first_waiting = redis_client.xrange(keys.jobs_stream(), count=2)[1][0]
        redis_client.xdel(keys.jobs_stream(), first_waiting)  # a deletion: Redis may no longer know the lag
        assert _scrape(ep)[("fstream_agent_jobs_waiting", ())] == 1
    m.close()


def test_queue_depth_keeps_its_last_value_and_counts_a_failed_read(redis_url: str, redis_client: Any) -> None:
    keys = Keys("qd2")
    JobStore(redis_client, keys=keys).ensure_group()
    q = QueueDepth(redis_url, keys, max_age=0.0)
    assert q.read() == (0, 0) and q.errors == 0
    port = socket.socket()
    port.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused at once
    dead = QueueDepth(f"redis://127.0.0.1:{port.getsockname()[1]}/0", keys, max_age=0.0)
    try:
        assert dead.read() is None and dead.errors == 1 and "ConnectionError" in dead.last_error
        m = AgentMetrics(queue=dead)
        with ServiceEndpoint(("127.0.0.1", 0), m.registry, _never_ready) as ep:
            got = _scrape(ep)
        assert ("fstream_agent_jobs_waiting", ()) not in got  # never known: no made-up zero
        assert got[("fstream_agent_queue_read_errors_total", ())] == 2
        q._client.close()  # noqa: SLF001 - the bus goes away under a reader that had answered
        q._client, q.redis_url = None, dead.redis_url  # noqa: SLF001
        assert q.read() == (0, 0) and q.errors == 1  # the last value stays
    finally:
        port.close()
        q.close()
        dead.close()


# -- health --------------------------------------------------------------------------------------------------
def test_endpoint_serves_health_readiness_openmetrics_and_nothing_else(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    m = AgentMetrics()
    state = {"floor": 1}
    with ServiceEndpoint(("127.0.0.1", 0), m.registry,
                         lambda: receiver_readiness([str(root)], state["floor"])()) as ep:
        assert _get(ep.url + "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
        code, _ct, body = _get(ep.url + "/readyz")
        assert code == 200 and body.startswith("ready\n") and f"ok: data root {root} writable" in body
        state["floor"] = 1 << 60  # seen once the last result (at most ready_cache = 1 s old) has aged out
        code, _ct, body = wait_until(lambda: (r := _get(ep.url + "/readyz"))[0] == 503 and r, what="not ready")
        assert body.startswith("not ready\n")
        assert f"failed: data root {root} free space:" in body and "below the floor of" in body
        assert "(--free-space-floor)" in body
        code, ctype, body = _get(ep.url + "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
        assert code == 200 and ctype.startswith("application/openmetrics-text") and body.endswith("# EOF\n")
        assert _get(ep.url + "/metrics", method="HEAD")[0] == 200
        assert _get(ep.url + "/nope")[0] == 404
        assert _get(ep.url + "/metrics", method="POST")[0] == 501
    assert list(root.iterdir()) == []  # the writability probe left nothing behind


def test_receiver_readiness_fails_for_each_reason_naming_it(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    c = root_writable(str(afile))
    assert not c.ok and c.name == f"data root {afile} writable" and "Not a directory" in c.detail
    c = root_writable(str(tmp_path / "missing"))
    assert not c.ok and "No such file or directory" in c.detail
    c = free_space(str(tmp_path), 1 << 60)
    assert not c.ok and "free, below the floor of" in c.detail
    c = free_space(str(tmp_path / "missing"), 1)
    assert not c.ok and "cannot read it" in c.detail
    assert root_writable(str(tmp_path)).ok and free_space(str(tmp_path), 1).ok

    class Draining:
        def is_set(self) -> bool:
            return True

    checks = receiver_readiness([str(tmp_path)], 1, Draining())()
    assert [c.ok for c in checks] == [True, True, False] and "draining" in checks[-1].detail


def test_agent_readiness_fails_for_each_reason_naming_it(tmp_path: Path, redis_url: str, redis_client: Any) -> None:
    keys = Keys("ready")
    src = tmp_path / "src"
    src.mkdir()
    afile = tmp_path / "afile"
    afile.write_text("x")
    checks = agent_readiness(redis_url, keys, [str(src), str(afile)])()
    byname = {c.name: c for c in checks}
    assert byname["redis reachable"].ok and str(redis_url) in byname["redis reachable"].detail
    group = byname["jobs consumer group present"]
    assert not group.ok and "no group 'agents' on stream '{ready}:jobs'" in group.detail
    assert byname[f"source root {src} readable"].ok
    assert not byname[f"source root {afile} readable"].ok and "Not a directory" in byname[
        f"source root {afile} readable"].detail
    JobStore(redis_client, keys=keys).ensure_group()
    assert all(c.ok for c in agent_readiness(redis_url, keys, [str(src)])())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        down = agent_readiness(f"redis://:hunter2@127.0.0.1:{s.getsockname()[1]}/0", keys, [str(src)])()
    redis_check = down[0]
    assert not redis_check.ok and "ConnectionError" in redis_check.detail
    assert "hunter2" not in "".join(c.line() for c in down)  # the password never shows
    assert not agent_readiness(redis_url, keys, [])()[-1].ok  # no roots: nothing would be served


# -- the command line --------------------------------------------------------------------------------------------
def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*FSTREAM, *argv], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_check_runs_the_readiness_checks_once(tmp_path: Path, redis_url: str, redis_client: Any) -> None:
    root = tmp_path / "root"
    root.mkdir()
    r = _run("receive", "--root", str(root), "--check")
    assert r.returncode == 0 and r.stdout.startswith("ready\n") and "free space" in r.stdout, r.stderr
    r = _run("receive", "--root", str(root), "--check", "--free-space-floor", "1000TiB")
    assert r.returncode == 1 and "failed: data root" in r.stdout and "below the floor of 1000.00 TiB" in r.stdout
    r = _run("receive", "--root", str(root), "--check", "--free-space-floor", "lots")
    assert r.returncode == 2 and "--free-space-floor 'lots'" in r.stderr
    r = _run("receive", "--root", str(root), "--listen", "127.0.0.1:0", "--metrics-listen", "9464")
    assert r.returncode == 2 and "--metrics-listen '9464': expected HOST:PORT" in r.stderr
    policy = authkit.policy_file(tmp_path, write_secret(tmp_path / "secret"), roots=(str(root),))
    args = ("agent", "--redis", redis_url, "--namespace", "chk", "--policy", policy, "--check")
    r = _run(*args)  # the first start on this bus: the agent makes the stream and group (tests/test_agent_check.py)
    assert r.returncode == 0 and "ok: jobs consumer group present: no stream '{chk}:jobs' yet" in r.stdout, r.stdout
    JobStore(redis_client, keys=Keys("chk")).ensure_group()
    r = _run(*args)
    assert r.returncode == 0 and f"ok: source root {root} readable" in r.stdout, r.stdout + r.stderr


def test_without_metrics_listen_prometheus_client_is_never_imported(tmp_path: Path) -> None:
    code = ("import sys; from transfer_agent.cli.main import build_parser; "
            "from transfer_agent.service.attach import ReceiverService, AgentService; "
            f"a = build_parser({{}}).parse_args(['receive', '--root', {str(tmp_path)!r}, '--listen', '127.0.0.1:0']); "
            "s = ReceiverService(a); s.start(None); s.stop(); "
            "b = build_parser({}).parse_args(['agent', '--root', '/']); AgentService(b).start(None, '', None); "
            "print('prometheus_client' in sys.modules, 'http.server' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False False", out.stderr


# -- the documentation and the dashboard -----------------------------------------------------------------------
DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_docs_and_dashboard_name_exactly_the_metrics_the_daemons_expose(tmp_path: Path, rx: Any, redis_url: str,
                                                                        redis_client: Any) -> None:
    import json
    import re

    keys = Keys("docs")
    JobStore(redis_client, keys=keys).ensure_group()
    exposed: set[str] = set()
    from prometheus_client import CollectorRegistry

    from transfer_agent.receiving.router import Router
    from transfer_agent.service.worker_metrics import WorkersCollector

    router = CollectorRegistry()  # ``receive --workers``: the router's own families (a worker not started yet)
    router.register(WorkersCollector(lambda: [(0, None, 0)], Router(listen=("127.0.0.1", 0), workers=1)))
    for registry, m in ((None, ReceiverMetrics(rx)), (None, AgentMetrics(queue=QueueDepth(redis_url, keys))),
                        (router, None)):
        with ServiceEndpoint(("127.0.0.1", 0), registry or m.registry, _never_ready) as ep:
            _c, _t, body = _get(ep.url + "/metrics")
        exposed |= {fam.name + ("_total" if fam.type == "counter" else "") for fam in text_string_to_metric_families(body)
                    if not fam.name.endswith("_created")}  # prometheus_client's own series (docs/metrics.md says so)
        if m is not None:
            m.close()
    documented = set(re.findall(r"`(fstream_[a-z_]+)`", (DOCS / "metrics.md").read_text()))
    assert documented == exposed, (documented ^ exposed)
    dashboard = json.loads((DOCS / "grafana" / "fstream.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {re.sub(r"_bucket$", "", n) for e in exprs for n in re.findall(r"fstream_[a-z_]+", e)}
    assert used <= exposed, used - exposed
    router_only = {n for n in exposed if n.startswith("fstream_router_")}  # only with --workers: no panel needs them
    assert used >= exposed - router_only - {"fstream_agent_queue_read_errors_total", "fstream_receiver_errors_total",
                                            "fstream_receiver_sessions_total",
                                            "fstream_receiver_unauthenticated_connections",
                                            "fstream_agent_file_bytes_total"}, exposed - used


def test_agent_latency_histogram_observes_the_seconds_file_events_carry() -> None:
    m = AgentMetrics()
    observe = m.job(TransferSpec(sources=["/x"], destination="fstream://h:1/x"))
    observe("file", {"status": "committed", "size": 3, "seconds": 0.2})
    observe("file", {"status": "failed", "size": 3, "seconds": 9.0})  # only landed files are timed
    observe("file", {"status": "committed", "size": 3})  # a sender that does not time its files
    with ServiceEndpoint(("127.0.0.1", 0), m.registry, _never_ready) as ep:
        got = _scrape(ep)
    assert got[("fstream_agent_file_latency_seconds_count", ())] == 1
    assert got[("fstream_agent_file_latency_seconds_bucket", (("le", "0.1"),))] == 0
    assert got[("fstream_agent_file_latency_seconds_bucket", (("le", "0.25"),))] == 1


# -- review of issue 30: the endpoint stays bounded, whoever connects -----------------------------------------
def _conn_threads() -> int:
    import threading

    return sum(t.name == "fstream-metrics-conn" for t in threading.enumerate())


def _until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends before it closes the connection (fails on the client's own timeout)."""
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got


def test_idle_connections_are_capped_answered_503_beyond_the_cap_and_closed_after_the_timeout() -> None:
    import time

    m = AgentMetrics()
    with ServiceEndpoint(("127.0.0.1", 0), m.registry, _never_ready) as ep:  # the daemons' defaults
        assert (ep.max_connections, ep.timeout) == (16, 5.0)
        idle: list[socket.socket] = []
        try:
            for _ in range(ep.max_connections):
                idle.append(socket.create_connection(ep.address, timeout=12))
            t0 = time.monotonic()
            wait_until(lambda: _conn_threads() == ep.max_connections, what="every slot taken by an idle client")
            extra = [socket.create_connection(ep.address, timeout=12) for _ in range(4)]
            idle += extra
            for s in extra:  # over the cap: answered at once, no thread started for them
                assert _until_closed(s).startswith(b"HTTP/1.0 503 Service Unavailable\r\n")
            assert ep.refused == 4 and _conn_threads() == ep.max_connections
            assert time.monotonic() - t0 < 3
            for s in idle[:ep.max_connections]:  # each idle one is closed by the server after its 5 s
                assert _until_closed(s) == b""
            waited = time.monotonic() - t0
            assert 4.0 < waited < 10.0, waited
            code, _t, body = wait_until(lambda: (r := _get(ep.url + "/metrics"))[0] == 200 and r, timeout=5,
                                        what="a scrape served once the idle clients are gone")
            assert "fstream_agent_sent_bytes_total" in body
        finally:
            for s in idle:
                s.close()


def test_a_client_trickling_its_request_is_cut_at_the_deadline() -> None:
    import threading
    import time

    m = AgentMetrics()
    with ServiceEndpoint(("127.0.0.1", 0), m.registry, _never_ready, timeout=1.0, deadline=2.0) as ep:
        sock = socket.create_connection(ep.address, timeout=10)
        stop = threading.Event()

        def trickle() -> None:  # one byte every 0.2 s: never silent for the 1 s timeout, never done
            try:
                sock.sendall(b"GET /metrics HTTP/1.0\r\nX-Slow: ")
                while not stop.wait(0.2):
                    sock.sendall(b"x")
            except OSError:
                pass  # cut by the server

        th = threading.Thread(target=trickle, daemon=True)
        t0 = time.monotonic()
        th.start()
        try:
            try:
                closed = sock.recv(1) == b""
            except ConnectionResetError:
                closed = True  # cut with the trickled bytes unread
            took = time.monotonic() - t0
            assert closed and 1.5 < took < 5.0, took
        finally:
            stop.set()
            th.join(5)
            sock.close()


def test_a_flood_of_readyz_makes_one_round_of_disk_probes_per_period(tmp_path: Path) -> None:
    import time
    from concurrent.futures import ThreadPoolExecutor

    root = tmp_path / "root"
    root.mkdir()
    real = receiver_readiness([str(root)], 1)
    probes: list[float] = []

    def counted() -> list:  # each call is one create + write + fsync + unlink in the root
        probes.append(time.monotonic())
        return real()

    m = AgentMetrics()
    with ServiceEndpoint(("127.0.0.1", 0), m.registry, counted) as ep:
        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: _get(ep.url + "/readyz"), range(80)))
        took = time.monotonic() - t0
        assert all(code == 200 and f"ok: data root {root} writable" in body for code, _t, body in answers)
        assert 1 <= len(probes) <= 2 + int(took / 1.0), (len(probes), took)  # 80 asked, ready_cache = 1 s
        assert ep.readiness.runs == len(probes)
        before = len(probes)
        wait_until(lambda: _get(ep.url + "/readyz")[0] == 200 and len(probes) > before, timeout=5,
                   what="a new round once the result is older than 1 s")
        assert probes[-1] - probes[before - 1] >= 1.0
    assert list(root.iterdir()) == []


def test_a_hung_readiness_round_holds_one_thread_and_the_others_say_so(tmp_path: Path) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    real = receiver_readiness([str(tmp_path)], 1)
    hung, release = threading.Event(), threading.Event()

    def hanging() -> list:  # a data root on a hung file system
        hung.set()
        release.wait(20)
        return real()

    m = AgentMetrics()
    with ServiceEndpoint(("127.0.0.1", 0), m.registry, hanging, timeout=1.0, deadline=30.0) as ep:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(_get, ep.url + "/readyz")
            assert hung.wait(10)
            code, _t, body = _get(ep.url + "/readyz")
            assert code == 503 and "failed: readiness checks: a round of checks still running after 1 s" in body
            assert _get(ep.url + "/healthz")[0] == 200
            release.set()
            assert first.result(10)[0] == 200


class _ReloadedAgent(Agent):
    """An agent whose ``observer`` a SIGHUP reload clears right after each read (the race of the review)."""

    @property  # type: ignore[override]
    def observer(self) -> Any:
        value = self.__dict__.get("_observer")
        self.__dict__["_observer"] = None  # the reload (``agent.observer = None``) lands here
        return value

    @observer.setter
    def observer(self, value: Any) -> None:
        self.__dict__["_observer"] = value


def test_a_reload_clearing_the_observer_mid_claim_does_not_strand_the_job(tmp_path: Path, rx: Any, secret: Path,
                                                                          redis_url: str, redis_client: Any) -> None:
    keys = Keys("obs")
    sizes = {f"f{i}.bin": 10_000 + i for i in range(5)}
    make_files(tmp_path / "src", sizes, seed=4)
    store = JobStore(redis_client, keys=keys, signer=authkit.signer())
    job_id, _ = store.submit(TransferSpec(sources=[str(tmp_path / "src")],
                                          destination=f"fstream://127.0.0.1:{rx.port}/o", tuner="fixed"))
    m = AgentMetrics()
    agent = _ReloadedAgent(redis_url, name="obs", keys=keys, block_ms=50, flush_interval=0.05, poll_interval=0.05,
                           policy=authkit.policy(secret))
    agent.observer = m
    try:
        agent.run(once=True)
    finally:
        agent.stop()
    assert store.get(job_id).state == "succeeded"
    assert agent.observer is None  # the reload happened
    with ServiceEndpoint(("127.0.0.1", 0), m.registry, _never_ready) as ep:
        got = _scrape(ep)
    assert got[("fstream_agent_files_total", (("outcome", "committed"), ("path", f"127.0.0.1:{rx.port}")))] == 5
