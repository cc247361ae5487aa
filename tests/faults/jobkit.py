"""Helpers for the job-level fault rows: datasets, receivers gated per attempt, CLI agents, the invariant check.

The invariants (issue 8, "The suite"): every visible destination file matches the source; no
temp files are left; every job is done (verified), failed with a reason, or resumable — none
silently vanished.
"""

from __future__ import annotations

import collections
import filecmp
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.model.spec import TransferSpec
from transfer_agent.receiving.receiver import Receiver
from transfer_agent.receiving.state import RecvFile
import authkit

DEADLINE = 30.0


def poll(predicate: Callable[[], Any], what: str, deadline: float = DEADLINE, diag: Callable[[], str] = str) -> Any:
    """Wait for ``predicate()`` to be truthy (polling a condition in another thread/process, with a deadline)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out after {deadline} s waiting for {what}\n{diag()}")


def dataset(root: Path, *, small: int = 12, small_size: int = 48 * 1024, big: int = 3 << 20, seed: int = 8) -> Path:
    """A tree of small files in two directories and one larger file (random, reproducible)."""
    rng = random.Random(seed)
    (root / "sub").mkdir(parents=True, exist_ok=True)
    for i in range(small):
        (root / ("sub" if i % 2 else "") / f"f{i:03d}.dat").write_bytes(rng.randbytes(small_size + i))
    if big:
        (root / "big.bin").write_bytes(rng.randbytes(big))
    return root


def files_of(root: Path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def temps(root: Path) -> list[str]:
    """Temp/sidecar files left under ``root`` (``*.part``, ``*.part.meta``)."""
    return [n for n in files_of(root) if n.endswith(".part") or n.endswith(".meta")] if root.exists() else []


def check_destination(src: Path, dst: Path, *, complete: bool, parts_ok: bool = False) -> None:
    """Every visible file at ``dst`` is byte-identical to its source; all there if ``complete``; no temps
    unless ``parts_ok`` (a job still resumable keeps its parts)."""
    visible = [n for n in files_of(dst) if not os.path.basename(n).startswith(".")] if dst.exists() else []
    for n in visible:
        assert (src / n).is_file(), f"{n}: at the destination but not in the source"
        assert filecmp.cmp(src / n, dst / n, shallow=False), f"{n}: destination bytes differ from the source"
    assert parts_ok or not temps(dst), f"temp files left at the destination: {temps(dst)}"
    if complete:
        assert visible == files_of(src), (f"missing at the destination: {sorted(set(files_of(src)) - set(visible))}")


def check_jobs(store: JobStore, job_ids: list[str]) -> dict[str, str]:
    """Every job is succeeded with verified files, failed/cancelled with a reason, or resumable (queued/running
    with a stream entry). Returns ``{job_id: state}``."""
    out = {}
    entries = {f.get("job_id") for _, f in store.client.xrange(store.keys.jobs_stream())}
    for job_id in job_ids:
        job = store.get(job_id)
        assert job is not None, f"job {job_id} silently vanished (no state)"
        if job.state == "succeeded":
            r = job.result or {}
            assert r.get("failed_files", 0) == 0 and r.get("verified_files", 0) + r.get("skipped_files", 0) == r.get(
                "files"), f"job {job_id} succeeded but its result is not all verified: {r}"
        elif job.terminal:
            assert job.error, f"job {job_id} {job.state} without a reason"
        else:
            assert job_id in entries, f"job {job_id} is {job.state} but has no stream entry: nobody would run it"
        out[job_id] = job.state
    return out


class CountingReceiver(Receiver):
    """A real receiver that records every commit (relpath) and can hold one attempt's data at a gate.

    :param hold_attempt: the attempt number whose data blocks are held once ``hold_after`` bytes of it arrived.
    :param hold_after: bytes of ``hold_attempt`` let through before the gate closes.
    """

    def __init__(self, *args: Any, hold_attempt: int | None = None, hold_after: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hold_attempt, self.hold_after = hold_attempt, hold_after
        self.gate, self.reached = threading.Event(), threading.Event()
        self.commits: collections.Counter[str] = collections.Counter()
        self._seen = 0
        self._count_lock = threading.Lock()

    def _claim(self, f: RecvFile, off: int, length: int) -> None:
        if self.hold_attempt is not None and f.session.attempt == self.hold_attempt:
            with self._count_lock:
                self._seen += length
                hold = self._seen > self.hold_after
            if hold:
                self.reached.set()
                self.gate.wait(60)
        super()._claim(f, off, length)

    def _commit_batch(self, batch: list[RecvFile]) -> None:
        super()._commit_batch(batch)
        with self._count_lock:
            for f in batch:
                if f.done:
                    self.commits[f.relpath] += 1


def start_counting_receiver(root: Path, secret_file: Path, **kw: Any) -> CountingReceiver:
    from transfer_agent.wire.auth import load_secret

    root.mkdir(parents=True, exist_ok=True)
    return CountingReceiver(listen=("127.0.0.1", 0), root=str(root), secret=load_secret(secret_file),
                            flush_interval=0.1, **kw).start()


def spec_for(src: Path, port: int, dest: str = "out", **opts: Any) -> TransferSpec:
    opts.setdefault("tuner", "fixed")
    opts.setdefault("cc", 1)
    opts.setdefault("p", 2)
    opts.setdefault("pp", 2)
    return TransferSpec(sources=[str(src)], destination=f"fstream://127.0.0.1:{port}/{dest}", **opts)


def cli_agent(redis_url: str, name: str, keys: Keys, secret: Path, log: Path, *extra: str,
              port: int) -> subprocess.Popen:
    """``python -m transfer_agent.cli agent`` in its own session (stopped by pid), sending to the receiver on
    ``port``; stderr to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "transfer_agent.cli", "agent", "--redis", redis_url,
                                 "--name", name, "--namespace", keys.namespace,
                                 "--policy", authkit.policy_file(log.parent, secret, destinations=authkit.receiver(port)),
                                 *extra], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop_process(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    import signal

    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGCONT)  # a stopped process cannot handle SIGTERM
            proc.terminate()
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def kinds(store: JobStore, job_id: str) -> list[str]:
    return [e["kind"] for _, e in store.events(job_id, count=100_000)]


def agent_thread(agent: Any) -> threading.Thread:
    th = threading.Thread(target=agent.run, name=f"agent-{agent.name}", daemon=True)
    th.start()
    return th
