"""Graceful drain (issue 30): an agent told to stop finishes the files it has open, starts no other, hands its job
back, and the next agent sends only the rest; a receiver told to stop refuses new sessions and lets open ones
finish; both tell systemd (``sd_notify``). Real agents, receivers and redis-server over loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import authkit
from agentkit import PacedReceiver, make_files, part_files, start_receiver, trees_identical, wait_until, write_secret
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.model.spec import TransferSpec
from transfer_agent.daemon.worker import Agent


def _agent(redis_url: str, keys: Keys, name: str, secret: Path, **kw: Any) -> tuple[Agent, threading.Thread]:
    opts = dict(keys=keys, block_ms=50, flush_interval=0.05, poll_interval=0.05, claim_idle_ms=300,
                policy=authkit.policy(secret))
    opts.update(kw)
    agent = Agent(redis_url, name=name, **opts)
    th = threading.Thread(target=agent.run, name=f"agent-{name}", daemon=True)
    th.start()
    return agent, th


def _files_by_attempt(store: JobStore, job_id: str) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    attempt = 0
    for _, ev in store.events(job_id, count=100_000):
        if ev["kind"] == "claimed":
            attempt = int(ev.get("attempt", attempt + 1))
        elif ev["kind"] == "file":
            out.setdefault(attempt, []).append(ev)
    return out


@pytest.fixture
def site(tmp_path: Path, redis_url: str, redis_client: Any):
    secret = write_secret(tmp_path / "secret")
    keys = Keys("drain")
    store = JobStore(redis_client, keys=keys, signer=authkit.signer())
    agents: list[Agent] = []
    receivers: list[Any] = []
    yield {"secret": secret, "keys": keys, "store": store, "agents": agents, "receivers": receivers}
    for a in agents:
        a.stop()
    for r in receivers:
        r.stop()


def test_drain_finishes_open_files_and_the_next_agent_sends_only_the_rest(tmp_path, redis_url, site):
    src = make_files(tmp_path / "src", {f"f{i:03d}.bin": 64 * 1024 for i in range(240)}, seed=3)
    rcv = start_receiver(tmp_path / "dst", site["secret"], cls=PacedReceiver, rate=1.5e6)
    site["receivers"].append(rcv)
    spec = TransferSpec(sources=[str(src)], destination=f"fstream://127.0.0.1:{rcv.port}/out", tuner="fixed",
                        cc=2, p=1, pp=2)
    store = site["store"]
    job_id, _ = store.submit(spec)
    a, ta = _agent(redis_url, site["keys"], "a", site["secret"], drain_grace=20.0)
    site["agents"].append(a)
    wait_until(lambda: len(_files_by_attempt(store, job_id).get(1, [])) >= 20, 30, "20 files landed by agent a")
    t0 = time.monotonic()
    a.drain()
    ta.join(25)
    took = time.monotonic() - t0
    assert not ta.is_alive() and took < 20.0, f"the drain took {took:.1f} s (grace 20 s)"
    job = store.get(job_id)
    assert job.state == "queued", job.state  # handed back, not failed, not finished
    first = _files_by_attempt(store, job_id)[1]
    assert all(f["status"] == "committed" for f in first)
    landed = {f["path"] for f in first}
    assert 20 <= len(landed) < 240
    assert part_files(tmp_path / "dst") == []  # every open file finished: no part left to resume
    assert [ev["kind"] for _, ev in store.events(job_id, count=100_000)][-1] == "released"

    b, _tb = _agent(redis_url, site["keys"], "b", site["secret"])
    site["agents"].append(b)
    wait_until(lambda: store.get(job_id).state == "succeeded", 60, "agent b finished the job")
    result = store.get(job_id).result
    second = _files_by_attempt(store, job_id)[2]
    committed = {f["path"] for f in second if f["status"] == "committed"}
    skipped = {f["path"] for f in second if f["status"] == "skipped"}
    assert skipped == landed and not committed & landed  # nothing sent twice
    assert len(committed) + len(landed) == 240  # nothing lost
    assert result["bytes_sent"] == 64 * 1024 * len(committed) and result["resumed_bytes"] == 0
    assert trees_identical(src, tmp_path / "dst" / "out")


def test_grace_over_cuts_open_files_at_their_checkpoint_and_they_resume(tmp_path, redis_url, site):
    src = make_files(tmp_path / "src", {"big.bin": 24 * 2**20}, seed=4)
    rcv = start_receiver(tmp_path / "dst", site["secret"], cls=PacedReceiver, rate=3e6, flush_interval=0.1)
    site["receivers"].append(rcv)
    spec = TransferSpec(sources=[str(src)], destination=f"fstream://127.0.0.1:{rcv.port}/out", tuner="fixed",
                        cc=1, p=1, pp=1, block_size=2**20)
    store = site["store"]
    job_id, _ = store.submit(spec)
    a, ta = _agent(redis_url, site["keys"], "a", site["secret"], drain_grace=2.0)
    site["agents"].append(a)
    wait_until(lambda: rcv._bytes >= 3 * 2**20, 30, "3 MiB taken in by the receiver")  # noqa: SLF001
    t0 = time.monotonic()
    a.drain()
    ta.join(10)
    took = time.monotonic() - t0
    assert not ta.is_alive() and took < 2.0, f"the cut drain took {took:.2f} s (grace 2 s)"
    assert store.get(job_id).state == "queued"
    assert len(part_files(tmp_path / "dst")) >= 1  # cut mid-file: its part stays, with its ranges

    b, _tb = _agent(redis_url, site["keys"], "b", site["secret"])
    site["agents"].append(b)
    wait_until(lambda: store.get(job_id).state == "succeeded", 60, "agent b finished the job")
    result = store.get(job_id).result
    drained = [ev for _, ev in store.events(job_id, count=100_000) if ev["kind"] == "drained"]
    assert len(drained) == 1 and drained[0]["bytes_sent"] > 0 and drained[0]["verified_files"] == 0  # cut mid-file
    assert "cut" in drained[0]["error"] and "handed back" in drained[0]["error"]
    assert not _files_by_attempt(store, job_id).get(1)  # handed back, never reported as a failed file
    # what the first attempt put on the wire and did not land, the second sent again: bytes in flight at the cut
    assert 0 <= drained[0]["bytes_sent"] + result["bytes_sent"] - 24 * 2**20 <= drained[0]["bytes_sent"]
    assert result["resumed_bytes"] >= 2 * 2**20  # resumed from the ranges the cut left, not from zero
    assert result["bytes_sent"] == 24 * 2**20 - result["resumed_bytes"]
    assert trees_identical(src, tmp_path / "dst" / "out")


def test_a_draining_receiver_refuses_new_sessions_and_lets_open_ones_finish(tmp_path, site):
    from agentkit import send

    src = make_files(tmp_path / "src", {f"f{i}.bin": 256 * 1024 for i in range(16)}, seed=5)
    other = make_files(tmp_path / "other", {"x.bin": 1000}, seed=6)
    rcv = start_receiver(tmp_path / "dst", site["secret"], cls=PacedReceiver, rate=1e6)
    out: dict[str, Any] = {}
    sender = threading.Thread(target=lambda: out.setdefault("r", send(src, rcv.port, site["secret"], cc=1, p=1)))
    sender.start()
    wait_until(lambda: rcv._sessions, 10, "the first session open")  # noqa: SLF001 - the receiver's own table
    drained: dict[str, Any] = {}
    drainer = threading.Thread(target=lambda: drained.setdefault("left", rcv.drain(30.0)))
    drainer.start()
    wait_until(rcv.draining.is_set, 5, "draining")
    late = send(other, rcv.port, site["secret"], max_session_retries=0)
    assert not late.ok and "draining" in (late.error or "") and late.retryable
    sender.join(30)
    drainer.join(30)
    assert out["r"].ok and out["r"].verified_files == 16 and drained["left"] == 0
    assert trees_identical(src, tmp_path / "dst" / "out")


def _notify_socket(tmp_path: Path) -> tuple[socket.socket, str]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    s.bind(path)
    s.settimeout(20)
    return s, path


def test_fstream_receive_under_systemd_notifies_ready_and_drains_on_sigterm(tmp_path, site):
    sock, path = _notify_socket(tmp_path)
    env = {**os.environ, "NOTIFY_SOCKET": path, "FSTREAM_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "transfer_agent.cli", "receive", "--listen", "127.0.0.1:0",
                             "--root", str(tmp_path / "dst"), "--secret-file", str(site["secret"]),
                             "--drain-grace", "5s"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        ready = sock.recv(4096).decode()
        assert "READY=1" in ready.splitlines() and "listening on 127.0.0.1:" in ready
        proc.send_signal(signal.SIGTERM)
        stopping = sock.recv(4096).decode()
        assert "STOPPING=1" in stopping.splitlines() and "EXTEND_TIMEOUT_USEC=5000000" in stopping
        assert proc.wait(10) == 0
    finally:
        sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_fstream_agent_exits_0_on_sigterm_and_hands_its_job_back(tmp_path, redis_url, site):
    src = make_files(tmp_path / "src", {f"f{i:03d}.bin": 64 * 1024 for i in range(200)}, seed=7)
    rcv = start_receiver(tmp_path / "dst", site["secret"], cls=PacedReceiver, rate=1e6)
    site["receivers"].append(rcv)
    store = site["store"]
    job_id, _ = store.submit(TransferSpec(sources=[str(src)], destination=f"fstream://127.0.0.1:{rcv.port}/out",
                                          tuner="fixed", cc=1, p=1, pp=1))
    sock, path = _notify_socket(tmp_path)
    policy = authkit.policy_file(tmp_path, site["secret"], destinations=authkit.receiver(rcv.port))
    env = {**os.environ, "NOTIFY_SOCKET": path}
    proc = subprocess.Popen([sys.executable, "-m", "transfer_agent.cli", "agent", "--redis", redis_url,
                             "--namespace", "drain", "--policy", policy, "--name", "cli-agent", "--drain-grace", "15s"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "READY=1" in sock.recv(4096).decode().splitlines()
        wait_until(lambda: len(_files_by_attempt(store, job_id).get(1, [])) >= 5, 30, "5 files landed")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert time.monotonic() - t0 < 15.0
        assert "STOPPING=1" in sock.recv(4096).decode().splitlines()
        err = proc.stderr.read()
        assert "draining" in err and "released (agent stopping)" in err
        assert store.get(job_id).state == "queued"
    finally:
        sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_transfer_drained_before_it_starts_opens_nothing_and_fails_nothing(tmp_path, site):
    """Regression (issue 30 review): a drain that came before the session began (SIGTERM during the claim, or a retry
    after it) still opened pp files ahead per channel and reported the rest as failed although they were handed back."""
    from transfer_agent.sending.sender import Transfer

    src = make_files(tmp_path / "src", {f"f{i}.bin": 10_000 for i in range(12)}, seed=11)
    rcv = start_receiver(tmp_path / "dst", site["secret"])
    site["receivers"].append(rcv)
    spec = TransferSpec.from_options([str(src)], f"fstream://127.0.0.1:{rcv.port}/out", secret_file=str(site["secret"]),
                                     tuner="fixed", cc=2, p=1, pp=4)
    drain = threading.Event()
    drain.set()
    events: list[tuple[str, dict]] = []
    result = Transfer(spec, drain=drain, on_event=lambda k, d: events.append((k, d))).run()
    assert not result.ok and result.retryable and "12 file(s) not started were handed back" in result.error
    assert [d for k, d in events if k == "file"] == [] and result.failed_files == 0
    assert rcv.stats["sessions"] == 1 and not any((tmp_path / "dst").rglob("f*"))  # connected, opened nothing


def test_a_draining_agent_keeps_retrying_its_redis_writes_until_the_grace_ends(redis_url, site):
    """Regression (issue 30 review): a drain set the stop event that also ended the retries of a finished job's Redis
    writes, so a Redis blip during a drain left the job running until another agent took it again."""
    import redis

    from transfer_agent.daemon.jobrun import JobRun

    agent = Agent(redis_url, name="blip", keys=site["keys"], policy=authkit.policy(site["secret"]))
    agent.drain(grace=30.0)
    tries: list[float] = []

    def write() -> None:
        tries.append(time.monotonic())
        if len(tries) < 3:
            raise redis.ConnectionError("Redis is restarting")

    agent._through_outage(JobRun("j1", 1, "0-1"), "recording its outcome", write)  # noqa: SLF001
    assert len(tries) == 3  # retried through the blip although the agent is draining
    agent.stop()
    with pytest.raises(redis.ConnectionError):  # a hard stop gives up at once
        agent._through_outage(JobRun("j2", 1, "0-2"), "recording its outcome",  # noqa: SLF001
                              lambda: (_ for _ in ()).throw(redis.ConnectionError("down")))


def test_a_cancel_stops_opening_channels_between_two_of_them(tmp_path, site, monkeypatch):
    """Regression (issue 30, `fstream bench drain`): a grace cut that came while the tuner was opening channels waited
    for every one of them (on the WAN, p handshakes of a few round trips each), so the agent exited after its grace."""
    from transfer_agent.sending.connector import Connector
    from transfer_agent.sending.sender import Transfer

    rcv = start_receiver(tmp_path / "dst", site["secret"])
    site["receivers"].append(rcv)
    src = make_files(tmp_path / "src", {"big.bin": 8 * 2**20}, seed=12)
    cancel = threading.Event()
    opened_after_cancel: list[bool] = []
    real = Connector.connect_link

    def counting(self, **extra):
        if extra.get("role") == "data":
            opened_after_cancel.append(cancel.is_set())
            if len(opened_after_cancel) == 2:
                cancel.set()  # while the first layout (4 channels) is being opened
        return real(self, **extra)

    monkeypatch.setattr(Connector, "connect_link", counting)
    spec = TransferSpec.from_options([str(src)], f"fstream://127.0.0.1:{rcv.port}/out", secret_file=str(site["secret"]),
                                     tuner="fixed", cc=4, p=1, pp=1)
    result = Transfer(spec, cancel=cancel).run()
    assert result.cancelled
    assert opened_after_cancel == [False, False]  # the third and fourth channels were not opened
