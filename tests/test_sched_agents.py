"""Two real agents under the shared STEAL scheduler (issue #11): an interactive job preempts a running batch
job; the batch job stops at its checkpoint only once the interactive one moves bytes, shows ``preempted``
with the reason, and later resumes from its committed ranges without sending them again."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from agentkit import PacedReceiver, make_files, start_receiver, trees_identical, wait_until
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.model.spec import TransferSpec
from fstream_provider.tuning.scheduler import SealConfig
from transfer_agent.daemon.worker import Agent
from transfer_agent.sending.history_io import HistoryOptions
import authkit

MiB = 1 << 20


def _two_jobs(tmp_path: Path, secret: Path, redis_url: str, redis_client, keys: Keys, scheduler: str,
              first: tuple[Path, str, str], second: tuple[Path, str, str], second_timeout: float) -> tuple:
    """Two real agents under ``scheduler`` sending to a receiver paced at 16 MiB/s (both ends' model: one stream
    fills it); ``first`` (source, destination name, class) is submitted, ``second`` once the first moves. Returns
    the store, both job ids and their final records."""
    rate = 16 * MiB
    rx = start_receiver(tmp_path / "dst", secret, cls=PacedReceiver, rate=rate)
    dst = f"127.0.0.1:{rx.port}"
    link = rate * 8  # both ends' known maximum: what the paced receiver takes
    redis_client.hset(keys.sched_config(), mapping={f"cap:{dst}": link, f"unit:{dst}": link,
                                                    f"cap:{socket.gethostname()}": 10 * link,
                                                    f"unit:{socket.gethostname()}": link})
    cfg = SealConfig(small_bytes=MiB, single_bytes=MiB // 2)  # the test's sizes are not "small"
    agents = [Agent(redis_url, policy=authkit.policy(), name=f"sched-{i}", secret_file=str(secret), keys=keys,
                    scheduler=scheduler, sched_config=cfg, sched_interval=0.2, poll_interval=0.2, heartbeat_ttl=3,
                    block_ms=100, flush_interval=0.1, history=HistoryOptions(record=False, keys=keys,
                                                                             source=f"sched-{i}"))
              for i in range(2)]
    threads = [threading.Thread(target=a.run, name=a.name) for a in agents]
    store = JobStore(redis_client, keys=keys, signer=authkit.signer())

    def spec(src: Path, name: str, klass: str) -> TransferSpec:
        return TransferSpec.from_options([str(src)], f"fstream://{dst}/{name}",
                                         tuner="fixed", cc=1, p=1, pp=1, priority_class=klass,
                                         sample_interval="0.2s", block_size="1MiB")

    try:
        for t in threads:
            t.start()
        job_a, _ = store.submit(spec(*first))
        wait_until(lambda: ((store.get(job_a).progress or {}).get("t") or 0) > 1.0, 20, "the first job moving")
        job_b, _ = store.submit(spec(*second))
        a_done = store.wait(job_a, timeout=90)
        b_done = store.wait(job_b, timeout=second_timeout)
    finally:
        for a in agents:
            a.stop()
        for t in threads:
            t.join(30)
        rx.stop()
    return store, job_a, job_b, a_done, b_done


def test_interactive_job_preempts_batch_which_resumes_without_resending(tmp_path: Path, secret: Path,
                                                                        redis_url: str, redis_client) -> None:
    keys = Keys("t-sched-agents")
    size_a = 96 * MiB
    src_a = make_files(tmp_path / "batch", {"big.dat": size_a}, seed=1)
    src_b = make_files(tmp_path / "inter", {"x.dat": 24 * MiB}, seed=2)
    store, job_a, job_b, a_done, b_done = _two_jobs(tmp_path, secret, redis_url, redis_client, keys, "steal",
                                                    (src_a, "batch", "batch"), (src_b, "inter", "interactive"), 5)
    assert (a_done.state, b_done.state) == ("succeeded", "succeeded"), (a_done.error, b_done.error)
    assert trees_identical(src_a, tmp_path / "dst" / "batch") and trees_identical(src_b, tmp_path / "dst" / "inter")
    ev_a = [e for _, e in store.events(job_a, count=10_000)]
    ev_b = [e for _, e in store.events(job_b, count=10_000)]
    pre = [e for e in ev_a if e["kind"] == "preempted"]
    assert len(pre) == 1 and pre[0]["by"] == job_b and "preempt" in pre[0]["reason"], pre
    # §4.5: the batch job stopped only after the interactive one moved bytes
    b_first_bytes = min(e["ts"] for e in ev_b if e["kind"] == "interval" and e["bytes"] > 0)
    assert pre[0]["ts"] >= b_first_bytes
    # the interactive job finished first; the batch job ran again afterwards, as attempt 2
    assert b_done.updated_at <= a_done.updated_at
    assert a_done.attempt == 2 and a_done.preemptions == 1 and a_done.deliveries == 1
    assert any(e["kind"] == "scheduled" and "preempt" in e["reason"] for e in ev_a)
    # resumed from its committed ranges: the second attempt sent only what was missing
    res = a_done.result
    assert res["resumed_bytes"] > 0, res
    assert res["bytes_sent"] + res["resumed_bytes"] == size_a, res
    assert not redis_client.hlen(keys.sched_tasks())  # both off the board


def test_seal_share_agents_start_a_second_job_beside_the_first_below_the_knee(tmp_path: Path, secret: Path,
                                                                                redis_url: str, redis_client) -> None:
    """Issue 44: two real agents with ``scheduler="seal-share"``. A second large interactive job arrives while the
    first fills the paced path with its one stream (the knee: 2). It starts beside the first (scheduled "below
    the knee ... share"), moves bytes while the first still runs, and neither is preempted."""
    keys = Keys("t-sched-share")
    src_a = make_files(tmp_path / "a", {"big.dat": 96 * MiB}, seed=3)
    src_b = make_files(tmp_path / "b", {"big.dat": 48 * MiB}, seed=4)
    store, job_a, job_b, a_done, b_done = _two_jobs(tmp_path, secret, redis_url, redis_client, keys, "seal-share",
                                                    (src_a, "a", "interactive"), (src_b, "b", "interactive"), 60)
    assert (a_done.state, b_done.state) == ("succeeded", "succeeded"), (a_done.error, b_done.error)
    assert trees_identical(src_a, tmp_path / "dst" / "a") and trees_identical(src_b, tmp_path / "dst" / "b")
    ev_a = [e for _, e in store.events(job_a, count=10_000)]
    ev_b = [e for _, e in store.events(job_b, count=10_000)]
    sched_b = [e for e in ev_b if e["kind"] == "scheduled"]
    assert sched_b and "below the knee" in sched_b[0]["reason"] and "share" in sched_b[0]["reason"], sched_b
    assert not [e for e in ev_a + ev_b if e["kind"] == "preempted"]
    b_first_bytes = min(e["ts"] for e in ev_b if e["kind"] == "interval" and e["bytes"] > 0)
    a_last_bytes = max(e["ts"] for e in ev_a if e["kind"] == "interval" and e["bytes"] > 0)
    assert b_first_bytes < a_last_bytes  # side by side, not one after the other
    assert a_done.attempt == 1 and b_done.attempt == 1
