"""Agent tests on a real redis-server: claiming, fencing, reclaim, dead-letter, retries, cancel, stop (fake data plane)."""

from __future__ import annotations

import random
from pathlib import Path
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.model.retry import RetryPolicy
from fstream_provider.model.spec import TransferSpec
from transfer_agent.errors import AuthError, NetworkError
from transfer_agent.daemon.runner import is_retryable
from transfer_agent.daemon.worker import Agent
import authkit

DEADLINE = 20.0


class FakeResult:
    def __init__(self, ok: bool = True, failures: list[dict] | None = None) -> None:
        self.ok = ok
        self.failures = failures or []

    def to_dict(self) -> dict:
        return {"files": 1, "bytes": 10, "seconds": 0.1, "throughput_bps": 800.0, "verified_files": int(self.ok),
                "skipped_files": 0, "failed_files": len(self.failures), "failures": self.failures, "intervals": []}


class FakeTransfer:
    """A data plane stand-in whose behaviour each test scripts with ``behave(call, transfer)``."""

    def __init__(self, spec: TransferSpec, *, job_id: str, attempt: int, on_event: Callable, cancel: threading.Event,
                 redis: Any, log: Any, behave: Callable, calls: list, history: Any = None, guard: Any = None,
                 drain: Any = None) -> None:
        self.spec, self.job_id, self.attempt = spec, job_id, attempt
        self.on_event, self.cancel = on_event, cancel
        self.behave, self.calls = behave, calls

    def run(self) -> FakeResult:
        self.calls.append(self)
        return self.behave(len(self.calls), self)


def factory(behave: Callable, calls: list) -> Callable:
    return lambda spec, **kw: FakeTransfer(spec, behave=behave, calls=calls, **kw)


def succeed(n: int, t: FakeTransfer) -> FakeResult:
    t.on_event("interval", {"t": 1.0, "throughput_bps": 1e6, "cc": 1, "p": 1, "pp": 0})
    t.on_event("file", {"path": "a", "size": 10, "status": "committed", "reason": ""})
    return FakeResult()


def poll(predicate: Callable[[], Any], what: str, deadline: float = DEADLINE) -> Any:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.005)  # polling a condition with a deadline
    raise AssertionError(f"timed out after {deadline} s waiting for {what}")


@pytest.fixture
def keys() -> Keys:
    return Keys("t")


@pytest.fixture
def store(redis_client: Any, keys: Keys) -> JobStore:
    return JobStore(redis_client, keys=keys, signer=authkit.signer())


@pytest.fixture
def spec(tmp_path: Any) -> TransferSpec:
    return TransferSpec(sources=[str(tmp_path)], destination="fstream://127.0.0.1:1/dst", tuner="fixed")


@pytest.fixture
def make_agent(redis_url: str, keys: Keys) -> Iterator[Callable[..., Agent]]:
    started: list[Agent] = []

    def make(name: str, behave: Callable = succeed, calls: list | None = None, **kw: Any) -> Agent:
        opts = dict(keys=keys, block_ms=50, flush_interval=0.02, poll_interval=0.05, retry_base_s=0.001,
                    retry_cap_s=0.01, rng=random.Random(1))
        opts.setdefault("policy", authkit.policy(authkit.key_file()))
        opts.update(kw)
        agent = Agent(redis_url, name=name, transfer_factory=factory(behave, calls if calls is not None else []),
                      **opts)
        started.append(agent)
        return agent

    yield make
    for agent in started:
        agent.stop()


def in_thread(agent: Agent) -> threading.Thread:
    th = threading.Thread(target=agent.run, daemon=True)
    th.start()
    return th


def pending(client: Any, keys: Keys) -> list[dict]:
    return client.xpending_range(keys.jobs_stream(), keys.jobs_group(), "-", "+", 100)


def kinds(store: JobStore, job_id: str) -> list[str]:
    return [e["kind"] for _, e in store.events(job_id, count=1000)]


def test_job_succeeds_and_done_is_the_last_event(make_agent, store, spec, redis_client, keys):
    job_id, _ = store.submit(spec)
    calls: list = []
    agent = make_agent("a1", calls=calls)
    agent.run(once=True)
    job = store.get(job_id)
    assert job.state == "succeeded" and job.attempt == 1 and job.deliveries == 1 and job.worker == "a1"
    assert job.result["verified_files"] == 1 and job.progress["cc"] == 1
    assert kinds(store, job_id) == ["queued", "claimed", "interval", "file", "done"]
    done = store.events(job_id, count=1000)[-1][1]
    assert done["state"] == "succeeded" and done["result"]["files"] == 1
    assert pending(redis_client, keys) == []  # acknowledged after the transfer returned
    assert redis_client.ttl(keys.job(job_id)) > 0  # expires only once terminal
    assert len(calls) == 1 and calls[0].attempt == 1


def test_the_agents_keyring_key_named_by_the_job_is_used(make_agent, store, spec, tmp_path):
    import dataclasses

    from fstream_provider.authz.policy import KeyEntry

    other = tmp_path / "lcls.key"
    other.write_text("k" * 32)
    other.chmod(0o600)
    pol = authkit.policy(authkit.key_file())
    grant = dataclasses.replace(pol.submitters[authkit.SUBMITTER], keys=frozenset({"default", "lcls"}))
    pol = dataclasses.replace(pol, keyring={**pol.keyring, "lcls": KeyEntry(secret_file=str(other))},
                              submitters={authkit.SUBMITTER: grant})
    store.submit(spec.replace(key="lcls"))
    store.submit(spec)
    calls: list = []
    agent = make_agent("a1", calls=calls, policy=pol)
    agent.run(once=True)
    agent.run(once=True)
    assert [(c.spec.key, c.spec.secret_file) for c in calls] == [("lcls", str(other)), (None, authkit.key_file())]


def test_cancel_queued_job_never_runs(make_agent, store, spec, redis_client, keys):
    job_id, _ = store.submit(spec)
    assert store.cancel(job_id, "not needed") is True
    job = store.get(job_id)
    assert job.state == "cancelled" and job.error == "not needed"
    calls: list = []
    make_agent("a1", calls=calls).run(once=True)
    assert calls == [] and pending(redis_client, keys) == []
    assert kinds(store, job_id)[-1] == "done"
    assert store.cancel(job_id) is False  # already terminal


def test_cancel_running_job_stops_transfer(make_agent, store, spec, redis_client, keys):
    job_id, _ = store.submit(spec)
    running = threading.Event()

    def block_until_cancel(n: int, t: FakeTransfer) -> FakeResult:
        running.set()
        assert t.cancel.wait(DEADLINE), "transfer never saw the cancel"
        return FakeResult(ok=False, failures=[{"path": "a", "reason": "cancelled", "retryable": False}])

    agent = make_agent("a1", block_until_cancel)
    th = in_thread(agent)
    assert running.wait(DEADLINE)
    assert store.get(job_id).state == "running"
    assert store.cancel(job_id, "operator said stop") is True
    job = store.wait(job_id, DEADLINE)
    assert job.state == "cancelled" and job.error == "operator said stop"
    assert kinds(store, job_id)[-2:] == ["cancel", "done"]
    assert pending(redis_client, keys) == []
    agent.stop()
    th.join(DEADLINE)
    assert not th.is_alive()


def test_stale_attempt_cannot_write_state_or_ack(store, spec, redis_client, keys):
    job_id, _ = store.submit(spec)
    stream, group = keys.jobs_stream(), keys.jobs_group()
    (entry_id, _fields), = redis_client.xreadgroup(group, "old", {stream: ">"}, count=1)[0][1]
    old = store.claim(job_id, entry_id, worker="old", max_deliveries=5)
    assert old.outcome == "claimed" and old.attempt == 1
    # another worker takes the entry over (as after a reclaim) and claims: attempt 2
    redis_client.xclaim(stream, group, "new", 0, [entry_id])
    new = store.claim(job_id, entry_id, worker="new", max_deliveries=5)
    assert new.attempt == 2
    assert store.publish(job_id, 1, [("file", time.time(), {"path": "x"})]) == (False, False)
    assert store.touch(job_id, 1, entry_id, "old") == (False, False)
    assert store.finish(job_id, 1, entry_id, state="succeeded") is False
    assert store.release(job_id, 1, "stale") is False
    job = store.get(job_id)
    assert job.state == "running" and job.worker == "new" and job.attempt == 2
    assert [p["consumer"] for p in pending(redis_client, keys)] == ["new"]  # not acknowledged by the stale one
    assert "x" not in [e.get("path") for _, e in store.events(job_id)]
    assert store.finish(job_id, 2, entry_id, state="succeeded", result={"files": 0}) is True
    assert pending(redis_client, keys) == [] and store.get(job_id).state == "succeeded"


def test_a_touch_between_a_takeovers_xclaim_and_claim_leaves_the_entry_with_the_new_owner(store, spec, redis_client,
                                                                                          keys):
    """CI failure of 2026-11-26: the owner's heartbeat TOUCH (XCLAIM to itself, attempt still current) landed
    between a takeover's XCLAIM and its CLAIM; the entry went back to the old owner's pending list, which then
    read it as its own leftover and ran the job a third time. CLAIM now takes the entry with the attempt."""
    job_id, _ = store.submit(spec)
    stream, group = keys.jobs_stream(), keys.jobs_group()
    (entry_id, _fields), = redis_client.xreadgroup(group, "old", {stream: ">"}, count=1)[0][1]
    assert store.claim(job_id, entry_id, worker="old", max_deliveries=5).attempt == 1
    redis_client.xclaim(stream, group, "new", 0, [entry_id])
    assert store.touch(job_id, 1, entry_id, "old") == (True, False)  # attempt 1 is still current here
    assert [p["consumer"] for p in pending(redis_client, keys)] == ["old"]
    assert store.claim(job_id, entry_id, worker="new", max_deliveries=5).attempt == 2
    assert [p["consumer"] for p in pending(redis_client, keys)] == ["new"]
    assert store.touch(job_id, 1, entry_id, "old") == (False, False)
    assert redis_client.xreadgroup(group, "old", {stream: "0"}, count=1)[0][1] == []  # nothing left for "old"


def test_agent_fenced_out_stops_without_writing(make_agent, store, spec, redis_client, keys):
    job_id, _ = store.submit(spec)
    running, saw_cancel = threading.Event(), threading.Event()

    def block(n: int, t: FakeTransfer) -> FakeResult:
        running.set()
        if t.cancel.wait(DEADLINE):
            saw_cancel.set()
        return FakeResult()  # even a "success" after losing the job must not be recorded

    agent = make_agent("a1", block)
    th = in_thread(agent)
    assert running.wait(DEADLINE)
    entry_id = pending(redis_client, keys)[0]["message_id"]
    redis_client.xclaim(keys.jobs_stream(), keys.jobs_group(), "intruder", 0, [entry_id])
    assert store.claim(job_id, entry_id, worker="intruder", max_deliveries=5).attempt == 2
    assert saw_cancel.wait(DEADLINE)
    poll(lambda: agent.counters["fenced_out"] >= 1, "agent to notice it was fenced out")
    agent.stop()
    th.join(DEADLINE)
    job = store.get(job_id)
    assert job.state == "running" and job.worker == "intruder" and job.attempt == 2
    assert [p["consumer"] for p in pending(redis_client, keys)] == ["intruder"]
    assert "done" not in kinds(store, job_id)


def _dead_worker_holds(store: JobStore, client: Any, keys: Keys, consumer: str) -> str:
    """A worker reads and claims the job, then 'dies' (no heartbeat key ever exists for it)."""
    stream, group = keys.jobs_stream(), keys.jobs_group()
    got = client.xreadgroup(group, consumer, {stream: ">"}, count=1)
    if got:
        entry_id, fields = got[0][1][0]
    else:  # take it over from the previous dead worker
        entry_id = pending(client, keys)[0]["message_id"]
        fields = client.xrange(stream, entry_id, entry_id)[0][1]
        client.xclaim(stream, group, consumer, 0, [entry_id])
    store.claim(fields["job_id"], entry_id, worker=consumer, max_deliveries=100)
    return entry_id


def _idle_at_least(client: Any, keys: Keys, ms: int) -> bool:
    return all(p["time_since_delivered"] >= ms for p in pending(client, keys))


def test_reclaim_after_dead_worker(make_agent, store, spec, redis_client, keys):
    job_id, _ = store.submit(spec)
    _dead_worker_holds(store, redis_client, keys, "dead-1")
    poll(lambda: _idle_at_least(redis_client, keys, 60), "entry idle > claim_idle_ms")
    calls: list = []
    agent = make_agent("b", calls=calls, claim_idle_ms=50)
    agent.run(once=True)
    job = store.get(job_id)
    assert job.state == "succeeded" and job.attempt == 2 and job.deliveries == 2 and job.worker == "b"
    assert agent.counters["reclaimed"] == 1 and calls[0].attempt == 2
    assert pending(redis_client, keys) == []


def test_live_worker_keeps_its_job_until_orphaned(make_agent, store, spec, redis_client, keys):
    job_id, _ = store.submit(spec)
    _dead_worker_holds(store, redis_client, keys, "alive")
    redis_client.set(keys.agent("alive"), "x", px=60_000)  # its heartbeat is present
    poll(lambda: _idle_at_least(redis_client, keys, 60), "entry idle > claim_idle_ms")
    calls: list = []
    make_agent("b", calls=calls, claim_idle_ms=50, orphan_idle_ms=3_600_000).run(once=True)
    assert calls == [] and [p["consumer"] for p in pending(redis_client, keys)] == ["alive"]
    # idle beyond orphan_idle_ms: XAUTOCLAIM takes it whatever the heartbeat says
    poll(lambda: _idle_at_least(redis_client, keys, 120), "entry idle > orphan_idle_ms")
    agent = make_agent("c", calls=calls, claim_idle_ms=50, orphan_idle_ms=100)
    agent.run(once=True)
    assert len(calls) == 1 and store.get(job_id).state == "succeeded"


def test_dead_letter_after_max_deliveries(make_agent, store, spec, redis_client, keys):
    job_id, _ = store.submit(spec)
    _dead_worker_holds(store, redis_client, keys, "dead-1")
    _dead_worker_holds(store, redis_client, keys, "dead-2")
    poll(lambda: _idle_at_least(redis_client, keys, 60), "entry idle > claim_idle_ms")
    calls: list = []
    make_agent("b", calls=calls, claim_idle_ms=50, max_deliveries=2).run(once=True)
    assert calls == []
    job = store.get(job_id)
    assert job.state == "failed" and job.deliveries == 3
    assert "dead-lettered" in job.error and "max_deliveries 2" in job.error and "dead-2" in job.error
    dead = store.dead_letters()
    assert len(dead) == 1 and dead[0][1]["job_id"] == job_id
    assert pending(redis_client, keys) == []
    assert kinds(store, job_id)[-2:] == ["error", "done"]


def test_retryable_errors_are_retried_with_backoff(make_agent, store, spec):
    job_id, _ = store.submit(spec)

    def flaky(n: int, t: FakeTransfer) -> FakeResult:
        if n <= 2:
            raise NetworkError(f"connection to 127.0.0.1:1 reset (try {n})")
        return FakeResult()

    calls: list = []
    make_agent("a", flaky, calls, max_retries=3).run(once=True)
    job = store.get(job_id)
    assert job.state == "succeeded" and len(calls) == 3 and job.attempt == 1
    assert kinds(store, job_id) == ["queued", "claimed", "error", "retry", "error", "retry", "done"]
    retries = [e for _, e in store.events(job_id) if e["kind"] == "retry"]
    assert [r["try"] for r in retries] == [1, 2] and all(0 < r["delay"] <= 0.01 for r in retries)


def test_retries_give_up_and_terminal_errors_do_not_retry(make_agent, store, spec):
    job_a, _ = store.submit(spec)
    calls: list = []

    def always_reset(n: int, t: FakeTransfer) -> FakeResult:
        raise NetworkError("connection to 127.0.0.1:1 refused")

    make_agent("a", always_reset, calls, max_retries=2).run(once=True)
    job = store.get(job_a)
    assert job.state == "failed" and len(calls) == 3
    assert "refused" in job.error and "gave up after 3 tries" in job.error

    job_b, _ = store.submit(spec)
    calls2: list = []

    def auth_fails(n: int, t: FakeTransfer) -> FakeResult:
        raise AuthError("receiver 127.0.0.1:1 rejected the HMAC challenge (wrong secret)")

    make_agent("b", auth_fails, calls2).run(once=True)
    job = store.get(job_b)
    assert job.state == "failed" and len(calls2) == 1 and "wrong secret" in job.error and "terminal" in job.error


def test_file_failures_name_the_file(make_agent, store, spec):
    job_id, _ = store.submit(spec)

    def one_bad(n: int, t: FakeTransfer) -> FakeResult:
        return FakeResult(ok=False, failures=[{"path": "run7/img.h5", "reason": "source modified", "retryable": False}])

    make_agent("a", one_bad).run(once=True)
    job = store.get(job_id)
    assert job.state == "failed" and "run7/img.h5: source modified" in job.error
    assert job.result["failed_files"] == 1


def test_stop_releases_running_job_for_another_agent(make_agent, store, spec, redis_client, keys):
    job_id, _ = store.submit(spec)
    running = threading.Event()

    def block(n: int, t: FakeTransfer) -> FakeResult:
        running.set()
        t.cancel.wait(DEADLINE)
        return FakeResult(ok=False, failures=[{"path": "a", "reason": "cancelled", "retryable": True}])

    a = make_agent("a", block)
    th = in_thread(a)
    assert running.wait(DEADLINE)
    a.stop()
    th.join(DEADLINE)
    assert not th.is_alive()
    job = store.get(job_id)
    assert job.state == "queued" and "released" in kinds(store, job_id)
    assert redis_client.exists(keys.agent("a")) == 0  # heartbeat removed on a clean stop
    assert [p["consumer"] for p in pending(redis_client, keys)] == ["a"]  # not acknowledged
    poll(lambda: _idle_at_least(redis_client, keys, 60), "entry idle > claim_idle_ms")
    b = make_agent("b", claim_idle_ms=50)
    b.run(once=True)
    job = store.get(job_id)
    assert job.state == "succeeded" and job.attempt == 2 and pending(redis_client, keys) == []


def test_restarted_agent_with_same_name_finishes_its_leftovers(make_agent, store, spec, redis_client, keys):
    job_id, _ = store.submit(spec)
    _dead_worker_holds(store, redis_client, keys, "same")
    make_agent("same").run(once=True)
    assert store.get(job_id).state == "succeeded" and store.get(job_id).attempt == 2


def test_heartbeat_key_has_ttl_while_running(make_agent, store, spec, redis_client, keys):
    store.submit(spec)
    running, release = threading.Event(), threading.Event()

    def block(n: int, t: FakeTransfer) -> FakeResult:
        running.set()
        release.wait(DEADLINE)
        return FakeResult()

    a = make_agent("hb", block, heartbeat_ttl=5)
    th = in_thread(a)
    assert running.wait(DEADLINE)
    assert 0 < redis_client.pttl(keys.agent("hb")) <= 5000
    assert "hb" in redis_client.smembers(keys.agents())
    poll(lambda: redis_client.hget(keys.agent("hb"), "job_id"), "heartbeat to name the job")
    release.set()
    a.stop()
    th.join(DEADLINE)


def test_exceptions_are_counted_and_the_loop_continues(make_agent, store, spec, redis_client, keys):
    redis_client.xgroup_create(keys.jobs_stream(), keys.jobs_group(), id="0", mkstream=True)
    redis_client.xadd(keys.jobs_stream(), {"garbage": "1"})  # no job id: acknowledged and skipped
    job_id, _ = store.submit(spec)
    a = make_agent("a")
    a.run(once=True)
    a2 = make_agent("a2")
    a2.run(once=True)
    assert store.get(job_id).state == "succeeded"
    assert pending(redis_client, keys) == []


def test_sigterm_handler_sets_stop(make_agent):
    import os
    import signal

    a = make_agent("sig")
    done = threading.Event()
    before = signal.getsignal(signal.SIGTERM)

    def after_start() -> None:
        # run() installs its handler after it has connected and made its store; a SIGTERM before that is the
        # default one and ends the process (CI: it ended a pytest worker): wait for the handler itself
        poll(lambda: signal.getsignal(signal.SIGTERM) is not before, "agent to install its SIGTERM handler")
        os.kill(os.getpid(), signal.SIGTERM)
        done.set()

    threading.Thread(target=after_start, daemon=True).start()
    a.run()  # main thread: the SIGTERM handler is installed and makes run() return
    assert done.is_set() and a.stopped
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is restored


def test_backoff_is_exponential_with_jitter_and_cap():
    rng = random.Random(7)
    delays = [RetryPolicy(base_s=1.0, cap_s=10.0).delay(i, rng) for i in range(8)]
    for i, d in enumerate(delays):
        full = min(10.0, 2 ** i)
        assert full * 0.5 <= d <= full
    assert max(delays) <= 10.0


# ---------------------------------------------------------------------------------------------------
# Integration with the real data plane (transfer_agent.sending.sender.Transfer + transfer_agent.receiving.receiver.Receiver)

_HANGING_AGENT = r'''
import sys, threading
sys.path.insert(0, sys.argv[5])
import authkit
from fstream_provider.bus.keys import Keys
from transfer_agent.sending.sender import Transfer
from transfer_agent.daemon.worker import Agent

url, name, secret, namespace = sys.argv[1:5]
forever = threading.Event()

def factory(spec, **kw):
    inner = kw["on_event"]
    def on_event(kind, data):
        inner(kind, data)
        if kind == "file" and data.get("status") == "committed":
            forever.wait()  # this worker hangs mid-job, after committing one file, until SIGKILL
    kw["on_event"] = on_event
    return Transfer(spec, **kw)

Agent(url, policy=authkit.policy(), name=name, secret_file=secret, heartbeat_ttl=1, poll_interval=0.2, block_ms=100,
      keys=Keys(namespace), transfer_factory=factory).run()
'''


def _dataset(root: Any) -> Any:
    import os

    src = root / "src"
    (src / "sub").mkdir(parents=True)
    rng = random.Random(5)
    for i in range(40):
        (src / ("sub" if i % 2 else "") / f"f{i:03d}.dat").write_bytes(rng.randbytes(32 * 1024 + i))
    (src / "big.bin").write_bytes(os.urandom(6 * 2**20))
    return src


def _same_tree(a: Any, b: Any) -> None:
    """Every source file is at the destination with identical bytes, and nothing else is there
    (no temp part or sidecar is left behind, hidden or not)."""
    import filecmp
    import os

    def walk(root: Any) -> list[str]:
        return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)

    names_a = walk(a)
    names_b = walk(b)
    assert names_a == names_b, (f"destination differs: missing {sorted(set(names_a) - set(names_b))}, "
                                f"extra {sorted(set(names_b) - set(names_a))}")
    for n in names_a:
        assert filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False), f"{n} differs"


@pytest.fixture
def receiver_env(tmp_path: Any) -> Iterator[tuple[Any, Any, str]]:
    import os

    from transfer_agent.wire.auth import load_secret
    from transfer_agent.receiving.receiver import Receiver

    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    dst = tmp_path / "dst"
    dst.mkdir()
    rcv = Receiver(listen=("127.0.0.1", 0), root=str(dst), secret=load_secret(str(secret))).start()
    try:
        yield rcv, dst, str(secret)
    finally:
        rcv.stop()


def test_job_reclaimed_after_killing_its_worker(tmp_path, redis_url, redis_client, receiver_env, keys, store):
    import signal
    import subprocess
    import sys

    rcv, dst, secret = receiver_env
    src = _dataset(tmp_path)
    spec = TransferSpec(sources=[str(src)], destination=f"fstream://127.0.0.1:{rcv.port}/out", tuner="fixed",
                        cc=1, p=2, pp=1)
    job_id, _ = store.submit(spec)
    script = tmp_path / "hanging_agent.py"
    script.write_text(_HANGING_AGENT)
    proc = subprocess.Popen([sys.executable, str(script), redis_url, "doomed", secret, keys.namespace,
                             str(Path(__file__).parent)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        poll(lambda: any(e["kind"] == "file" and e.get("status") == "committed"
                         for _, e in store.events(job_id, count=1000)) or proc.poll() is not None,
             "the first worker to commit a file")
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert store.get(job_id).state == "running" and store.get(job_id).worker == "doomed"
        proc.send_signal(signal.SIGKILL)  # dies mid-job: no ack, no release, heartbeat left to expire
        proc.wait(DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert [p["consumer"] for p in pending(redis_client, keys)] == ["doomed"]

    rescuer = Agent(redis_url, policy=authkit.policy(), name="rescuer", secret_file=secret, keys=keys, claim_idle_ms=300, block_ms=100,
                    poll_interval=0.2)
    th = in_thread(rescuer)
    try:
        job = store.wait(job_id, 120)
    finally:
        rescuer.stop()
        th.join(DEADLINE)
    assert job.state == "succeeded", job.error
    assert job.attempt == 2 and job.worker == "rescuer" and rescuer.counters["reclaimed"] == 1
    claims = [(e["worker"], e["attempt"]) for _, e in store.events(job_id, count=10000) if e["kind"] == "claimed"]
    assert claims == [("doomed", 1), ("rescuer", 2)]
    assert job.result["verified_files"] + job.result["skipped_files"] == 41 and job.result["failed_files"] == 0
    assert job.result["skipped_files"] >= 1  # what the dead worker committed was not sent again
    assert pending(redis_client, keys) == []
    _same_tree(src, dst / "out")


def test_agent_cli_exits_cleanly_on_sigterm(tmp_path, redis_url, redis_client, keys):
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "transfer_agent.cli", "agent", "--redis", redis_url,
                             "--name", "cli-agent", "--namespace", keys.namespace, "--root", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        poll(lambda: redis_client.exists(keys.agent("cli-agent")) or proc.poll() is not None,
             "the agent's heartbeat")
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(DEADLINE) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert redis_client.exists(keys.agent("cli-agent")) == 0
    assert "cli-agent" not in redis_client.smembers(keys.agents())


def test_agent_keeps_working_across_a_redis_restart(tmp_path, spec, keys):
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.embedded import RedisServer

    server = RedisServer(str(tmp_path / "redis"), appendonly=True).start()
    calls: list = []
    agent = Agent(server.url, policy=authkit.policy(authkit.key_file()), name="steady", keys=keys, block_ms=50, flush_interval=0.02, poll_interval=0.05,
                  transfer_factory=factory(succeed, calls), rng=random.Random(3))
    th = in_thread(agent)
    client = connect(server.url)
    try:
        poll(lambda: client.exists(keys.agent("steady")), "the agent's heartbeat")
        server.restart()  # same port, same AOF: the consumer group survives
        store = JobStore(client, keys=keys, signer=authkit.signer())
        job_id, _ = store.submit(spec)
        job = store.wait(job_id, 60)
        assert job.state == "succeeded" and len(calls) == 1
    finally:
        agent.stop()
        th.join(DEADLINE)
        client.close()
        server.stop()
    assert not th.is_alive()


def test_retry_predicate():
    assert is_retryable(NetworkError("reset")) and not is_retryable(AuthError("bad secret"))
    assert is_retryable(AuthError("flaky", retryable=True))
    assert is_retryable(ConnectionResetError()) and not is_retryable(ValueError("bad spec"))
