"""Issue 30, "Key rotation without downtime": continuous transfers through a real agent and receiver while a whole
rotation of their shared secret happens in the middle.

``fstream bench rotation [--seconds 60 --files 20 --size 64KiB --window 10m]``

A receiver (``fstream -v receive``, its own process, its log kept) and an agent (this process, its own thread, its
policy's ``default`` key = the secret file) share one secret file, as a DTN pair configured from one file. Signed
jobs of ``--files`` files of ``--size`` are submitted one after the other, each waited for, for ``--seconds``;
halfway, ``fstream keys rotate SECRET --window W --check-receiver URL`` runs in its own process (next, check,
promote). Reported: jobs and files sent, failed files (goal: 0) and failed jobs, sessions per generation (the
receiver's log names each session's key generation), the generations used by jobs submitted after the rotation
finished (goal: only the new one), and the rotation's steps and seconds.

Writes ``bench/results/rotation-<stamp>.json`` (with provenance) and prints the summary.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from fstream_bench.core.children import end
from fstream_bench.core.saved import RESULTS_DIR, save

MODULES = ("transfer_agent", "fstream_provider.bus", "fstream_provider.authz",
           "fstream_provider.model", "fstream_provider.watch",
           "fstream_provider.tuning", "fstream_bench.ops.rotation")
SESSION_LINE = re.compile(r"session \S+ from \S+ \(key (\S+) generation (\S+), protocol (\d+)\): job (\S+) attempt")
FSTREAM = [sys.executable, "-m", "transfer_agent.cli"]


def _receiver(work: Path, secret: Path, stack: contextlib.ExitStack) -> tuple[int, Path]:
    """``fstream -v receive`` in its own process (stopped by ``stack``); its port and log file."""
    log_path = work / "receiver.log"
    log = open(log_path, "wb")
    stack.callback(log.close)
    proc = subprocess.Popen([*FSTREAM, "-v", "receive", "--listen", "127.0.0.1:0", "--root", str(work / "dst"),
                             "--secret-file", str(secret), "--no-fsync"], stdout=subprocess.PIPE, stderr=log, text=True)

    def stop() -> None:
        end(proc, 30, None)
        assert proc.stdout is not None
        proc.stdout.close()

    stack.callback(stop)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        raise RuntimeError(f"receiver did not start: {line!r} (log: {log_path})")
    return int(line.rsplit(":", 1)[1]), log_path


def _batch(root: Path, n: int, files: int, size: int) -> Path:
    d = root / f"b{n:05d}"
    d.mkdir(parents=True)
    for i in range(files):
        (d / f"f{i:04d}.dat").write_bytes(os.urandom(size))
    return d


def _rotate(secret: Path, port: int, window: str, out: dict) -> None:
    """``fstream keys rotate`` in its own process, as an operator runs it; what it printed and how long it took."""
    t0 = time.time()
    proc = subprocess.run([*FSTREAM, "keys", "rotate", str(secret), "--window", window, "--check-receiver",
                           f"fstream://127.0.0.1:{port}"], capture_output=True, text=True, timeout=300)
    out.update(started_unix=t0, finished_unix=time.time(), seconds=time.time() - t0, exit_code=proc.returncode,
               steps=proc.stdout.splitlines(), stderr=proc.stderr.strip())


def run(a: argparse.Namespace) -> dict:
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.embedded import RedisServer
    from fstream_provider.bus.jobs import JobStore
    from fstream_provider.authz.signing import Signer
    from fstream_provider.model.spec import TransferSpec
    from fstream_provider.model.units import parse_size
    from transfer_agent.daemon.authorize import AgentPolicy
    from transfer_agent.daemon.worker import Agent
    from transfer_agent.wire.auth import create_secret_file

    size = parse_size(a.size)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    work = Path(tempfile.mkdtemp(prefix="fstream-rotation-", dir=shm))
    jobs: list[dict] = []
    rotation: dict = {}
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        redis = RedisServer(str(work / "redis")).start()
        stack.callback(redis.stop)
        client = connect(redis.url)
        stack.callback(client.close)
        secret = create_secret_file(work / "secret")  # one line: generation "0"
        signer = Signer.generate("bench")  # Ed25519 (issue 40): the agent holds its public key
        (work / "src").mkdir()
        port, log_path = _receiver(work, secret, stack)
        policy = AgentPolicy.local([str(work / "src")], secret, submitter="bench", public_key=signer.public)
        agent = Agent(redis.url, name="rotation-bench", policy=policy, block_ms=100, poll_interval=0.2)
        th = threading.Thread(target=agent.run, name="rotation-bench-agent", daemon=True)
        th.start()
        stack.callback(lambda: (agent.stop(), th.join(60)))
        store = JobStore(client, signer=signer)
        rotator: threading.Thread | None = None
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < a.seconds:
            if rotator is None and time.monotonic() - t0 >= a.seconds / 2:
                rotator = threading.Thread(target=_rotate, args=(secret, port, a.window, rotation), name="rotate")
                rotator.start()
            src = _batch(work / "src", n, a.files, size)
            spec = TransferSpec.from_options([str(src)], f"fstream://127.0.0.1:{port}/out/b{n:05d}", tuner="fixed",
                                             cc=2, p=1, pp=8)
            submitted = time.time()
            job_id, _ = store.submit(spec)
            state = store.wait(job_id, 300)
            r = state.result or {}
            jobs.append({"n": n, "job_id": job_id, "submitted_unix": submitted, "state": state.state,
                         "seconds": time.time() - submitted, "verified_files": r.get("verified_files", 0),
                         "failed_files": r.get("failed_files", a.files if state.state != "succeeded" else 0),
                         "error": state.error})
            shutil.rmtree(src, ignore_errors=True)
            n += 1
        if rotator is not None:
            rotator.join(300)
        log_text = log_path.read_text(errors="replace")
    return summarise(a, jobs, rotation, log_text, size)


def summarise(a: argparse.Namespace, jobs: list[dict], rotation: dict, log_text: str, size: int) -> dict:
    """The result: totals, sessions per generation (all, and of jobs submitted after the rotation finished)."""
    gen_of_job: dict[str, list[str]] = collections.defaultdict(list)
    per_gen: collections.Counter[str] = collections.Counter()
    protocols: collections.Counter[str] = collections.Counter()
    for m in SESSION_LINE.finditer(log_text):
        key, gen, proto, job = m.groups()
        per_gen[f"{key}/{gen}"] += 1
        protocols[proto] += 1
        gen_of_job[job].append(gen)
    done = rotation.get("finished_unix")
    after = collections.Counter(g for j in jobs if done and j["submitted_unix"] > done for g in gen_of_job[j["job_id"]])
    before = collections.Counter(g for j in jobs if rotation.get("started_unix") and
                                 j["submitted_unix"] < rotation["started_unix"] for g in gen_of_job[j["job_id"]])
    return {
        "bench": "rotation",
        "params": {"seconds": a.seconds, "files_per_job": a.files, "size": size, "window": a.window},
        "jobs": len(jobs), "jobs_failed": sum(j["state"] != "succeeded" for j in jobs),
        "files_sent": sum(j["verified_files"] for j in jobs), "files_failed": sum(j["failed_files"] for j in jobs),
        "sessions_per_generation": dict(per_gen), "sessions_per_protocol": dict(protocols),
        "sessions_of_jobs_submitted_before_the_rotation": dict(before),
        "sessions_of_jobs_submitted_after_the_rotation": dict(after),
        "rotation": rotation, "job_records": jobs,
        "goals": {"failed files": "0", "jobs submitted after the rotation": "only the new generation"},
    }


def report(res: dict) -> str:
    rot = res["rotation"]
    lines = [f"rotation bench: {res['jobs']} jobs, {res['files_sent']} files sent, {res['files_failed']} failed "
             f"(goal 0), {res['jobs_failed']} failed jobs",
             f"  sessions per generation: {res['sessions_per_generation']}",
             f"  jobs submitted before the rotation: {res['sessions_of_jobs_submitted_before_the_rotation']}",
             f"  jobs submitted after the rotation:  {res['sessions_of_jobs_submitted_after_the_rotation']} "
             "(goal: only the new generation)",
             f"  rotation: exit {rot.get('exit_code')}, {rot.get('seconds', 0):.1f} s"]
    lines += [f"    {s}" for s in rot.get("steps", [])]
    if rot.get("stderr"):
        lines.append(f"    stderr: {rot['stderr']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="fstream bench rotation", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long jobs are submitted (default 60)")
    ap.add_argument("--files", type=int, default=20, help="files per job (default 20)")
    ap.add_argument("--size", default="64KiB", help="size of each file (default 64KiB)")
    ap.add_argument("--window", default="10m", help="the rotation's --window (default 10m)")
    ap.add_argument("--results", default=str(RESULTS_DIR))
    a = ap.parse_args(argv)
    from fstream_bench.core import provenance

    prov = provenance.start("rotation", argv, MODULES)
    res = run(a)
    save("rotation", res, prov, a.results)
    print(report(res))
    return 0 if res["files_failed"] == 0 and res["rotation"].get("exit_code") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
