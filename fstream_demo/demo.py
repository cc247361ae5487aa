"""``fstream demo``: the whole story on one machine — embedded Redis, receiver, agent, a streamed dataset.

An LCLS-like run writes files into a source directory over time; a job submitted on the
Redis bus asks an agent to stream them (``--watch``) to a receiver on loopback with the
FStream tuner; the demo follows the job's event stream with a live progress bar, then prints
the summary table and checks every byte. With Airflow installed, it then runs the example
DAG ``fstream_transfer_example`` through ``dag.test()`` on the same bus.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

from rich.console import Console

from fstream_provider.model.spec import TransferSpec
from fstream_provider.model.statedir import state_dir


def _produce(src: Path, stop: threading.Event, files: int, seed: int = 7) -> None:
    """Write an LCLS-like run: batches of files every second, written then renamed into place."""
    from fstream_provider.tuning.workloads import make_workload

    wl = make_workload("lcls", scale=1 / 64, seed=seed, interval_s=1.0)
    n = 0
    t0 = time.monotonic()
    rnd = os.urandom(1 << 20)
    for batch in wl.batches:
        if stop.wait(max(0.0, t0 + batch.t - time.monotonic())):
            return
        for f in batch.files:
            if files and n >= files:
                return
            name = "run0042/" + f.path.split("/", 1)[-1]  # i<batch>/<kind>-<n>.xtc
            dest = src / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name("." + dest.name + ".writing")
            with open(tmp, "wb") as out:
                left = f.size
                while left > 0:
                    chunk = rnd[: min(left, len(rnd))]
                    out.write(chunk)
                    left -= len(chunk)
            tmp.rename(dest)
            n += 1


def run_demo(files: int = 0, airflow: bool = True) -> int:
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.embedded import EmbeddedRedis, find_redis_server
    from fstream_provider.bus.follow import follow_job
    from fstream_provider.bus.jobs import JobStore
    from transfer_agent.wire.auth import create_secret_file, load_secret
    from transfer_agent.cli.progress import Progress, print_summary
    from transfer_agent.receiving.receiver import Receiver
    from transfer_agent.daemon.worker import Agent

    con = Console(stderr=True)
    base = state_dir()
    work = base / "demo"
    shutil.rmtree(work, ignore_errors=True)
    src, dst = work / "src", work / "dst"
    src.mkdir(parents=True)
    dst.mkdir(parents=True)
    con.rule("[bold]FStream demo")
    if os.environ.get("FSTREAM_REDIS_URL"):
        url, emb = os.environ["FSTREAM_REDIS_URL"], None
        con.print(f"Redis bus: {url} (from FSTREAM_REDIS_URL)")
    else:
        emb = EmbeddedRedis(str(base))
        was_running = emb.running()
        emb.start()
        url = emb.url
        con.print(f"Redis bus: embedded {os.path.basename(find_redis_server())} ({find_redis_server()}) on "
                  f"127.0.0.1:{emb.port}, "
                  f"AOF under {emb.dir}{' (reused)' if was_running else ''}")
    secret_file = create_secret_file(base / "secret")
    receiver = Receiver(listen=("127.0.0.1", 0), root=str(dst), secret=load_secret(secret_file)).start()
    con.print(f"receiver: 127.0.0.1:{receiver.port} → {dst}")
    from fstream_provider.authz.signing import resolve_signer
    from transfer_agent.daemon.authorize import AgentPolicy

    policy = AgentPolicy.local([src], secret_file)  # serves the run directory, for the local submitter
    agent = Agent(url, name="demo-agent", policy=policy, block_ms=200, poll_interval=0.2)
    agent_thread = threading.Thread(target=agent.run, name="demo-agent", daemon=True)
    agent_thread.start()
    con.print("agent: demo-agent consuming jobs from the bus")
    stop = threading.Event()
    producer = threading.Thread(target=_produce, args=(src, stop, files), daemon=True)
    producer.start()
    con.print(f"instrument: writing an LCLS-like run into {src} (a batch every second)")
    spec = TransferSpec.from_options([str(src)], f"fstream://127.0.0.1:{receiver.port}/lcls", tuner="fstream",
                                     watch=True, interval="0.5s", idle_exit="3s", profile_interval="2s",
                                     bandwidth="1Gbit", label="demo LCLS stream")
    client = connect(url)
    store = JobStore(client, signer=resolve_signer())  # signed as the local submitter
    job_id, _created = store.submit(spec, idempotency_key=f"demo-{time.time_ns()}")
    con.print(f"job {job_id} submitted; following its event stream\n")
    progress = Progress(True)
    rc = 1
    try:
        try:
            job = follow_job(store, job_id, on_event=lambda _eid, ev: progress(ev["kind"], ev), timeout=600,
                             block_ms=500)
        except LookupError as exc:  # its state vanished from the bus (JobLostError)
            con.print(f"[red]{exc}[/]")
            job = None
        progress.stop()
        result = (job.result if job else None) or {}
        if result:
            print_summary(result)
        produced = sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file())
        landed = sorted(p.relative_to(dst / "lcls") for p in (dst / "lcls").rglob("*") if p.is_file()) \
            if (dst / "lcls").exists() else []
        same = produced == landed and all((src / p).read_bytes() == (dst / "lcls" / p).read_bytes() for p in produced)
        con.print(f"\njob state: [bold]{job.state if job else '?'}[/]; {len(landed)} of {len(produced)} files landed; "
                  f"byte-for-byte identical: {'[green]yes[/]' if same else '[red]NO[/]'}")
        for d in (result.get("tuning") or [])[:6]:
            con.print(f"  tuner @{d['t']:.1f}s: {d['reason']}")
        rc = 0 if job and job.state == "succeeded" and same else 1
    finally:
        stop.set()
        agent.stop()
        agent_thread.join(10)
        receiver.stop()
        client.close()
    if rc == 0 and airflow:
        rc = _airflow_part(con, url)
    con.print(f"\nstate directory: {base} (embedded Redis keeps running for the next command; "
              f"history and profiles persist there)")
    return rc


def _airflow_part(con: Console, url: str) -> int:
    try:
        import airflow  # noqa: F401
    except ImportError:
        con.print("[yellow]Airflow is not installed: skipping the Airflow part (pip install '.[airflow]')[/]")
        return 0
    from fstream_demo.airflow_demo import run_demo as airflow_demo

    con.rule("[bold]The same stream, as an Airflow task (fstream_lcls_stream under dag.test())")
    report = airflow_demo(redis_url=url, workdir=str(state_dir() / "demo" / "airflow"))
    ok = bool(report) and not report.get("failed_files") and report.get("verified_files", 0) > 0
    con.print(f"Airflow task report: {report.get('verified_files', 0)} files verified, "
              f"{report.get('failed_files', 0)} failed" if report else "[red]the Airflow task returned no report[/]")
    return 0 if ok else 1
