"""One port, several receiver processes (issue 43): ``fstream receive --workers N`` as a user starts it.

Real router and worker processes on loopback, real senders: a job's control and data connections meet in the
process its route names, two jobs run in two processes, a killed worker is restarted and its job resumes, SIGTERM
drains, claims across processes are exclusive, and what the router holds before handing a connection over is
bounded (an attacker's idle and half-sent connections)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agentkit import jobs_on_workers, make_files, send, trees_identical, wait_until, write_secret
from transfer_agent.errors import FStreamError
from transfer_agent.receiving.claims import ProcessClaims
from transfer_agent.receiving.keyring import ReceiverKey
from transfer_agent.receiving.router import quota_groups, route


class RouterProc:
    """``fstream receive --workers N`` in its own process; its stderr is collected (``log``)."""

    def __init__(self, tmp: Path, secret: Path, *extra: str, workers: int = 2, config: Path | None = None) -> None:
        self.root = tmp / "dst"
        env = {**os.environ, "FSTREAM_STATE_DIR": str(tmp / "state")}
        if config is not None:
            env["FSTREAM_CONFIG"] = str(config)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "transfer_agent.cli", "-v", "receive", "--listen", "127.0.0.1:0", "--root",
             str(self.root), "--secret-file", str(secret), "--no-fsync", "--workers", str(workers), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        self.lines: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        first = self.proc.stdout.readline()  # type: ignore[union-attr]
        m = re.match(r"listening on 127\.0\.0\.1:(\d+)", first)
        assert m, f"no 'listening on' line: {first!r}; stderr: {self.log}"
        self.port = int(m.group(1))

    def _drain(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            self.lines.append(line)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def worker_pids(self) -> list[int]:
        m = wait_until(lambda: re.search(r"worker processes \(pids ([\d, ]+)\)", self.log), 10, "the router's pids")
        return [int(x) for x in m.group(1).split(", ")]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    return write_secret(tmp_path / "secret")


@pytest.fixture
def router(tmp_path: Path, secret: Path):
    r = RouterProc(tmp_path, secret)
    yield r
    r.stop()


def test_two_jobs_through_one_port_run_in_two_worker_processes(tmp_path, secret, router):
    jobs = jobs_on_workers(2)
    srcs = [make_files(tmp_path / f"src{w}", {f"f{i:02d}.bin": 200_000 + i for i in range(24)}, seed=w)
            for w in range(2)]
    results: dict[int, Any] = {}

    def run(w: int) -> None:
        results[w] = send(srcs[w], router.port, secret, dest=f"out{w}", job_id=jobs[w], cc=3, p=2, pp=2)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for w in range(2):
        assert results[w].ok, results[w].error
        assert trees_identical(srcs[w], router.root / f"out{w}")
    # each job's session was served by the worker its route names, and its data connections reached that worker
    for w in range(2):
        assert re.search(rf"fstream\.receiver\.worker{w} INFO session \w+ from .* job {jobs[w]} attempt 1",
                         router.log), router.log
    assert "unknown session" not in router.log
    assert len(set(router.worker_pids())) == 2


def test_a_killed_worker_is_restarted_and_its_job_resumes(tmp_path, secret, router):
    job = jobs_on_workers(2)[1]
    src = make_files(tmp_path / "src", {f"f{i:03d}.bin": 400_000 for i in range(60)}, seed=7)
    pids = router.worker_pids()
    result: dict[str, Any] = {}
    landed = lambda: len(list((router.root / "out").glob("f*.bin"))) if (router.root / "out").exists() else 0  # noqa
    t = threading.Thread(target=lambda: result.update(r=send(src, router.port, secret, job_id=job, cc=2, p=1,
                                                               max_session_retries=10)))
    t.start()
    wait_until(lambda: landed() >= 5, 60, "5 files landed")
    os.kill(pids[1], signal.SIGKILL)
    t.join(180)
    assert result["r"].ok, result["r"].error
    assert trees_identical(src, router.root / "out")
    assert re.search(rf"worker 1 \(pid {pids[1]}\) exited with -9; restarting it", router.log), router.log
    assert router.log.count("fstream.receiver.worker1 INFO session") >= 2  # the job's second session, new process


def test_sigterm_drains_the_workers_and_the_router_exits(tmp_path, secret):
    r = RouterProc(tmp_path, secret, "--drain-grace", "5s")
    pids = r.worker_pids()
    r.proc.send_signal(signal.SIGTERM)
    assert r.proc.wait(40) == 0
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    assert r.log.count("drained: no session open") == 2, r.log


def test_tls_with_workers_is_refused_naming_why(tmp_path, secret):
    base = [sys.executable, "-m", "transfer_agent.cli", "receive", "--listen", "127.0.0.1:0", "--root",
            str(tmp_path / "dst"), "--workers", "2"]
    env = {**os.environ, "FSTREAM_STATE_DIR": str(tmp_path / "state")}
    tls = subprocess.run(base + ["--tls-cert", "c", "--tls-key", "k", "--tls-ca", "a"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert tls.returncode == 2 and "with TLS the HELLO" in tls.stderr, tls.stderr


def _http(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _samples(text: str, name: str) -> dict[tuple, float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


def test_one_metrics_address_serves_every_workers_metrics_by_worker(tmp_path, secret):
    """``--workers 2 --metrics-listen``: one scrape of the router's address has both workers' receiver metrics,
    labelled ``worker``, counting what each received (a job per worker); ``/readyz`` checks each worker. A worker
    killed with SIGKILL is ``fstream_router_worker_up 0`` until the router restarted it; then
    it is up again with its restart counted and its counters from zero."""
    port = _free_port()
    r = RouterProc(tmp_path, secret, "--metrics-listen", f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    try:
        jobs = jobs_on_workers(2)
        srcs = [make_files(tmp_path / f"src{w}", {f"f{i}.bin": 50_000 for i in range(5 + 3 * w)}, seed=w)
                for w in range(2)]
        for w in range(2):
            assert send(srcs[w], r.port, secret, dest=f"out{w}", job_id=jobs[w], cc=1, p=1).ok
        status, text = _http(f"{base}/metrics")
        assert status == 200
        files = _samples(text, "fstream_receiver_files_total")
        assert files[(("outcome", "ok"), ("worker", "0"))] == 5 and files[(("outcome", "ok"), ("worker", "1"))] == 8
        up = _samples(text, "fstream_router_worker_up")
        assert up == {(("worker", "0"),): 1.0, (("worker", "1"),): 1.0}
        handed = _samples(text, "fstream_router_connections_handed_total")
        assert all(handed[(("worker", str(w)),)] >= 2 for w in range(2)), handed  # a control and a data connection
        assert sum(1 for k in _samples(text, "fstream_receiver_file_latency_seconds_count") if k) == 2  # histograms
        status, ready = _http(f"{base}/readyz")
        assert status == 200 and "ok: worker 0" in ready and "ok: worker 1" in ready, ready

        victim = r.worker_pids()[1]
        os.kill(victim, signal.SIGKILL)
        seen_down = wait_until(lambda: _samples(_http(f"{base}/metrics")[1], "fstream_router_worker_up").get(
            (("worker", "1"),)) == 0.0, 10, "worker 1 down in a scrape")
        assert seen_down
        wait_until(lambda: _samples(_http(f"{base}/metrics")[1], "fstream_router_worker_up").get(
            (("worker", "1"),)) == 1.0, 30, "worker 1 up again")
        text = _http(f"{base}/metrics")[1]
        assert _samples(text, "fstream_router_worker_restarts_total")[(("worker", "1"),)] == 1.0
        files = _samples(text, "fstream_receiver_files_total")
        assert files[(("outcome", "ok"), ("worker", "0"))] == 5  # the other worker's counts are untouched
        assert files.get((("outcome", "ok"), ("worker", "1")), 0.0) == 0.0  # a new process: a counter reset
        assert wait_until(lambda: _http(f"{base}/readyz")[0] == 200, 10, "ready again")
    finally:
        r.stop()


def test_a_reload_moves_the_routers_metrics_address(tmp_path, secret):
    """The router's metrics address from the config file, moved by a reload (SIGHUP): served on the new address with
    both workers' series, the old address closed; the workers keep their loopback ports (their command line)."""
    first, second = _free_port(), _free_port()
    cfg = tmp_path / "fstream.toml"
    cfg.write_text(f'[metrics]\nlisten = "127.0.0.1:{first}"\n')
    r = RouterProc(tmp_path, secret, config=cfg)
    try:
        assert _http(f"http://127.0.0.1:{first}/metrics")[0] == 200
        cfg.write_text(f'[metrics]\nlisten = "127.0.0.1:{second}"\n')
        r.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: any("configuration reloaded" in x and f"127.0.0.1:{second}" in x for x in r.lines), 20,
                   "the router's reload")
        up = _samples(_http(f"http://127.0.0.1:{second}/metrics")[1], "fstream_router_worker_up")
        assert up == {(("worker", "0"),): 1.0, (("worker", "1"),): 1.0}
        with pytest.raises(OSError):
            _http(f"http://127.0.0.1:{first}/metrics")
    finally:
        r.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_router_bounds_idle_and_half_sent_connections_and_serves_a_sender_meanwhile(tmp_path, secret):
    r = RouterProc(tmp_path, secret, "--max-unauth-per-addr", "4", "--handshake-timeout", "2s")
    try:
        src = make_files(tmp_path / "src", {f"f{i}.bin": 100_000 for i in range(10)}, seed=1)

        def sender() -> None:
            result = send(src, r.port, secret, cc=2, p=2)  # from 127.0.0.1, during the flood
            assert result.ok, result.error
            assert trees_identical(src, r.root / "out")

        # half of them send a HELLO's first bytes, then nothing (slowloris)
        closed = _idle_from_another_address(r.port, 12, sender, lambda i: b"FS\x03" if i % 2 else b"")
        assert len(closed) == 12
        early = sorted(closed.values())[:8]  # over the per-address cap of 4: closed at once
        late = sorted(closed.values())[8:]  # held until the handshake timeout (2 s), then closed
        assert max(early) < 1.0, closed
        assert all(1.5 <= x < 10.0 for x in late), closed
    finally:
        r.stop()


def _idle_from_another_address(port: int, n: int, meanwhile: Any = None,
                                first: Any = lambda i: b"") -> dict[int, float]:
    """``n`` connections from 127.0.0.2, each sending ``first(i)`` and then nothing: seconds until each was closed by
    the other end (``meanwhile()`` runs while they are held)."""
    held, closed, t0 = [], {}, time.monotonic()
    for i in range(n):  # from another source address: the caps are per address
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        s.connect(("127.0.0.1", port))
        if first(i):
            s.sendall(first(i))
        held.append(s)

    def watch(i: int, s: socket.socket) -> None:
        s.settimeout(30)
        try:
            s.recv(1)
        except OSError:
            pass
        closed[i] = time.monotonic() - t0

    watchers = [threading.Thread(target=watch, args=(i, s)) for i, s in enumerate(held)]
    for w in watchers:
        w.start()
    if meanwhile is not None:
        meanwhile()
    for w in watchers:
        w.join(40)
    for s in held:
        s.close()
    return closed


def test_sighup_reloads_the_routers_own_caps_and_handshake_time(tmp_path, secret):
    """The router holds connections before a worker takes them, within caps of its own: a reload (``systemctl
    reload``: SIGHUP, the config file read again) changes them in the router too, not only in the workers. Started
    at 16 per address and 30 s; reloaded to 2 and 2 s: of 6 idle connections from one address, 4 are closed at once
    and 2 at the new handshake time (before the fix the router kept 16 and 30 s: none closed within 10 s)."""
    cfg = tmp_path / "fstream.toml"
    cfg.write_text('[receive]\nmax-unauth-per-addr = 16\nhandshake-timeout = "30s"\n')
    r = RouterProc(tmp_path, secret, config=cfg)
    try:
        r.worker_pids()
        cfg.write_text('[receive]\nmax-unauth-per-addr = 2\nhandshake-timeout = "2s"\n')
        r.proc.send_signal(signal.SIGHUP)
        line = wait_until(lambda: next((x for x in r.lines if "router: at most" in x), None), 20, "the router's reload")
        assert "(2 per address), 2.0 s each" in line, line
        closed = _idle_from_another_address(r.port, 6)
        assert len(closed) == 6
        order = sorted(closed.values())
        assert max(order[:4]) < 1.0, closed  # over the new cap of 2: closed at once
        assert all(1.5 <= x < 10.0 for x in order[4:]), closed  # held until the new handshake time
        wanted = "max_unauth_per_addr: 16 -> 2"
        assert sum(wanted in x and "configuration reloaded" in x for x in r.lines) >= 1, r.log
        # metrics added by a reload: refused by the router and each worker (they were started without ports of
        # their own)
        cfg.write_text('[receive]\nmax-unauth-per-addr = 16\nhandshake-timeout = "2s"\n'
                       '[metrics]\nlisten = "127.0.0.1:0"\n')  # refused whole: the caps stay at 2 (below)
        r.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: sum("reload refused" in x and "started without --metrics-listen" in x for x in r.lines)
                   >= 1, 20, "the router refusing a metrics address")
        wait_until(lambda: sum("reload refused" in x and "not in a worker" in x for x in r.lines) >= 2, 20,
                   "both workers refusing it")
        assert r.proc.poll() is None
        result = send(make_files(tmp_path / "src", {"a.bin": 1000}, seed=2), r.port, secret, cc=1, p=1)
        assert result.ok, result.error  # still serving (one control and one data connection: within 2)
    finally:
        r.stop()


def _claim_in_child(lock: str, dkey: tuple[int, int], name: str, ready: Path, release: Path) -> subprocess.Popen:
    code = (f"import time, os, sys\nfrom transfer_agent.receiving.claims import ProcessClaims\n"
            f"c = ProcessClaims({lock!r})\nc[({dkey!r}, {name!r})] = 'session'\n"
            f"open({str(ready)!r}, 'w').close()\n"
            f"while not os.path.exists({str(release)!r}): time.sleep(0.02)\n"
            f"c.pop(({dkey!r}, {name!r}))\nopen({str(ready)!r} + '.released', 'w').close()\ntime.sleep(30)\n")
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_claim_held_by_another_process_is_busy_until_it_is_released_or_that_process_dies(tmp_path):
    lock = str(tmp_path / "claims.lock")
    dkey, name = (1, 2), "data.bin"
    ready, release = tmp_path / "ready", tmp_path / "release"
    child = _claim_in_child(lock, dkey, name, ready, release)
    try:
        wait_until(ready.exists, 30, "the other process's claim")
        mine = ProcessClaims(lock)
        with pytest.raises(FStreamError, match="busy: another receiver process") as err:
            mine[(dkey, name)] = "me"
        assert err.value.retryable
        assert mine.elsewhere(dkey, name) and not mine.elsewhere(dkey, "other.bin")
        mine[(dkey, "other.bin")] = "me"  # another file: no conflict
        release.touch()
        wait_until(Path(str(ready) + ".released").exists, 30, "the release")
        mine[(dkey, name)] = "me"
        assert mine.pop((dkey, name)) == "me"
        # a process that dies holds nothing: the kernel drops its record locks
        ready.unlink()
        release.unlink()
        child.kill()
        child.wait()
        child = _claim_in_child(lock, dkey, name, ready, release)
        wait_until(ready.exists, 30, "the second claim")
        assert mine.elsewhere(dkey, name)
        child.kill()
        child.wait()
        wait_until(lambda: not mine.elsewhere(dkey, name), 10, "the dead process's claim dropped")
        mine[(dkey, name)] = "me"
    finally:
        child.kill()


def test_routes_put_a_jobs_connections_together_and_quota_groups_in_one_process():
    hello = {"role": "control", "key": "lcls", "job": "j1", "session": "s1"}
    data = {**hello, "role": "data"}
    assert route(hello, 4, {}, 0) == route(data, 4, {}, 99)  # the session's data connections: same worker
    spread = {route({**hello, "job": f"j{i}"}, 4, {}, 0) for i in range(64)}
    assert spread == {0, 1, 2, 3}  # jobs of one key spread over every worker
    keys = [ReceiverKey("a", b"x" * 32, subtree="lcls", quota=10), ReceiverKey("b", b"y" * 32, subtree="lcls/run1"),
            ReceiverKey("c", b"z" * 32, subtree="sra"), ReceiverKey("d", b"w" * 32, subtree="sra2", quota=5)]
    groups = quota_groups(keys)
    assert groups == {"a": "a", "b": "a", "d": "d"}  # b writes under a's quota; c overlaps no quota
    by_a = {route({**hello, "key": k, "job": f"j{i}"}, 4, groups, 0) for k in ("a", "b") for i in range(32)}
    assert len(by_a) == 1  # every session that may charge a's quota: one process
    assert route(None, 4, groups, 6) == 2 and route({"role": "doctor"}, 4, groups, 7) == 3  # round-robin


def test_the_sweep_leaves_an_old_part_that_another_process_holds(tmp_path, secret):
    from transfer_agent.receiving.receiver import Receiver
    from transfer_agent.wire.auth import load_secret

    root = tmp_path / "dst"
    root.mkdir()
    part = root / ".data.bin.jobx.1.part"  # a resume's part: untouched for 8 days, then taken over by a worker
    part.write_bytes(b"x" * 10)
    old = time.time() - 8 * 86400
    os.utime(part, (old, old))
    st = os.stat(root)
    lock = str(tmp_path / "claims.lock")
    ready, release = tmp_path / "ready", tmp_path / "release"
    child = _claim_in_child(lock, (st.st_dev, st.st_ino), "data.bin", ready, release)
    rcv = Receiver(root=str(root), secret=load_secret(str(secret)), part_max_age=None, fsync=False).start()
    try:
        rcv._busy_parts = ProcessClaims(lock)  # what a worker's receiver holds (handoff.HandoffReceiver)
        wait_until(ready.exists, 30, "the other process's claim")
        assert rcv.sweep_parts(whole_tree=True, max_age=7 * 86400) == [] and part.exists()
        release.touch()
        wait_until(Path(str(ready) + ".released").exists, 30, "the release")
        assert rcv.sweep_parts(whole_tree=True, max_age=7 * 86400) == [part.name] and not part.exists()
    finally:
        rcv.stop()
        child.kill()


def test_a_hello_nested_too_deeply_does_not_stop_the_router(tmp_path, secret, router):
    """The router parsed the unauthenticated HELLO with ``json.loads`` alone: 2,000 nested brackets (a 4 KB body, within the pre-auth limit) raised
    RecursionError in its loop, which ended it, and the port took no connection after that."""
    from transfer_agent.wire.protocol import Frame, pack_control

    with socket.create_connection(("127.0.0.1", router.port)) as s:
        s.sendall(pack_control(Frame.HELLO, b"[" * 2000 + b"]" * 2000))
        s.settimeout(30)
        try:
            s.recv(4096)  # refused by the worker it went to (an ERROR, or a reset: the HELLO was not read)
        except OSError:
            pass
    src = make_files(tmp_path / "src", {"a.bin": 50_000}, seed=3)
    result = send(src, router.port, secret)
    assert result.ok, result.error
    assert trees_identical(src, router.root / "out")
