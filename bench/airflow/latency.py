"""The Airflow benchmark's latency: file closed -> new-files event (trigger alone) -> agent claim (dag.test)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from fstream_bench.airflow.results import KIB, machine_line, say, start, summary, write_results
from fstream_bench.airflow.rig import Rig
from fstream_bench.airflow.timed import MARKS


def simulate_poller(arrivals: list[float], period: float, looks: int, phase: float = 0.0) -> list[float]:
    """Latency of a poller scanning at ``phase + k*period``: reported at the ``looks``-th scan after arrival.

    ``looks=1``: first sighting (Airflow's SFTP trigger, the thesis' 20 s loop: no completeness check);
    ``looks=2``: size/mtime unchanged between two scans (FStream's rule), no scan or Redis cost.
    """
    out = []
    for t in arrivals:
        k = int((t - phase) // period) + 1  # first scan strictly after t
        out.append(phase + (k + looks - 1) * period - t)
    return out



def _write_closed(path: Path, size: int) -> float:
    """Write and close a file; the wall time right after ``close()``."""
    with open(path, "wb") as f:
        f.write(os.urandom(size))
    return time.time()



async def _trigger_sample(watch: Path, poll: float, offset: float, size: int) -> dict[str, float]:
    from fstream_provider.triggers.new_files import FStreamNewFilesTrigger

    trig = FStreamNewFilesTrigger(path=str(watch), pattern="*.dat", poll_interval=poll)
    gen = trig.run()
    started = time.time()
    first = asyncio.ensure_future(gen.__anext__())
    try:
        await asyncio.sleep(offset)
        closed = await asyncio.to_thread(_write_closed, watch / f"f{uuid.uuid4().hex[:8]}.dat", size)
        event = await asyncio.wait_for(first, timeout=30 + 4 * poll)
        got = time.time()
    finally:
        if not first.done():  # a failure before the event: stop the pending step, then close the generator
            first.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await first
        await gen.aclose()
    if len(event.payload["files"]) != 1:
        raise RuntimeError(f"trigger on {watch}: expected one new file, got {event.payload['files']}")
    return {"offset": closed - started, "latency": got - closed}


def run_trigger_latency(rig: Rig, polls: list[float], samples: int, rng: random.Random,
                        size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for poll in polls:
        watch = rig.workdir / f"watch-{poll}"
        watch.mkdir(exist_ok=True)
        rows = []
        for i in range(samples):
            offset = 0.3 + rng.uniform(0, 2 * poll)  # past the trigger's start-up, random phase vs its scans
            rows.append(asyncio.run(_trigger_sample(watch, poll, offset, size)))
        lat = [r["latency"] for r in rows]
        out[str(poll)] = {"poll_s": poll, "samples": rows, **summary(lat)}
        say(f"trigger poll {poll}s: p50 {out[str(poll)]['p50']:.3f}s p90 {out[str(poll)]['p90']:.3f}s "
             f"max {out[str(poll)]['max']:.3f}s")
    return out


def run_dag_latency(rig: Rig, poll: float, samples: int, rng: random.Random, size: int,
                    log_path: Path) -> dict[str, Any]:
    dag_id = f"fstream_bench_latency_{poll}".replace(".", "_")
    rows = []
    for i in range(samples):
        bench_id = uuid.uuid4().hex
        watch = rig.workdir / "dagwatch" / bench_id[:8]
        watch.mkdir(parents=True)
        conf = {"bench_id": bench_id, "watch_dir": str(watch), "destination": rig.url(f"lat/{bench_id[:8]}")}
        closed: list[float] = []
        stop = threading.Event()

        def writer() -> None:
            deadline = time.monotonic() + 300
            while not stop.is_set() and time.monotonic() < deadline:
                if rig.client.hexists(MARKS + bench_id, "sensor_execute"):
                    # past the deferral into the in-line trigger, then a random phase vs its scans
                    if not stop.wait(0.5 + rng.uniform(0, 2 * poll)):
                        closed.append(_write_closed(watch / "shot.dat", size))
                    return
                stop.wait(0.02)  # polling another thread's progress in Redis, with a deadline

        w = threading.Thread(target=writer, daemon=True)
        w.start()
        try:
            state, marks, wall = rig.dag_test(dag_id, conf, log_path)
        finally:
            stop.set()
            w.join(timeout=10)
        if state != "success" or not closed or "job_id" not in marks:
            raise RuntimeError(f"latency DAG run {i} ended {state} (closed {closed}, marks {sorted(marks)}); "
                               f"see {log_path}")
        ev = rig.job_event_ts(marks["job_id"])
        m = {k: float(v) for k, v in marks.items() if k != "job_id"}
        c = closed[0]
        row = {
            "dag_test_to_sensor_execute": m["sensor_execute"] - m["dag_test_call"],
            "closed_to_trigger_event": m["trigger_event"] - c,
            "trigger_event_to_sensor_resume": m["sensor_resume"] - m["trigger_event"],
            "sensor_done_to_transfer_execute": m["transfer_execute"] - m["sensor_done"],
            "transfer_execute_to_queued": ev["queued"] - m["transfer_execute"],
            "queued_to_claimed": ev["claimed"] - ev["queued"],
            "closed_to_claimed": ev["claimed"] - c,
            "dag_test_wall": wall,
        }
        rows.append(row)
        say(f"dag poll {poll}s sample {i + 1}/{samples}: closed->claimed {row['closed_to_claimed']:.2f}s "
             f"(trigger {row['closed_to_trigger_event']:.2f}s)")
    keys = list(rows[0])
    return {"poll_s": poll, "samples": rows, "first_run": rows[0],
            "summary": {k: summary([r[k] for r in rows[1:] or rows]) for k in keys}}


def latency_markdown(res: dict[str, Any]) -> str:
    trig, sims, dag = res["trigger"], res["simulated"], res["dag"]
    lines = [f"### Latency: file closed → new-files event → transfer claimed ({res['machine']})", "",
             f"Trigger measured with a real `redis-server`, `FStreamNewFilesTrigger.run()` in an asyncio loop, "
             f"one {res['file_size'] // KIB} KiB file written+closed per sample at a random phase.", "",
             "| Poller | How | N | p50 (s) | p90 (s) | max (s) |", "|---|---|---:|---:|---:|---:|"]
    for k, s in trig.items():
        dflt = " (default)" if float(k) == 0.5 else ""
        lines.append(f"| FStreamNewFilesTrigger, poll {s['poll_s']} s{dflt} | measured | {s['n']} | "
                     f"{s['p50']:.2f} | {s['p90']:.2f} | {s['max']:.2f} |")
    for s in sims:
        lines.append(f"| {s['label']} | simulated | {s['n']} | {s['p50']:.2f} | {s['p90']:.2f} | {s['max']:.2f} |")
    for d in dag:
        lines += ["", f"Under `dag.test()` (sensor `poke_interval={d['poll_s']}` s, deferrable, in-line trigger) "
                  f"→ `FStreamTransferOperator` → real agent thread; N = {len(d['samples']) - 1} warm runs (the first, "
                  "cold run is shown separately). Rows marked (Airflow) are Airflow's own hops.", "",
                  "| Step | p50 (s) | p90 (s) | max (s) | first run of this DAG (s) |", "|---|---:|---:|---:|---:|"]
        names = {
            "closed_to_trigger_event": "file closed → trigger event",
            "trigger_event_to_sensor_resume": "trigger event → sensor `execute_complete` (Airflow)",
            "sensor_done_to_transfer_execute": "sensor done → transfer `execute()` (Airflow)",
            "transfer_execute_to_queued": "`execute()` → job queued (spec + submit)",
            "queued_to_claimed": "job queued → agent \"claimed\"",
            "closed_to_claimed": "**file closed → transfer claimed**",
            "dag_test_to_sensor_execute": "`dag.test()` call → sensor `execute()` (Airflow, before the file)",
            "dag_test_wall": "whole `dag.test()` (incl. the transfer)",
        }
        for k, label in names.items():
            s = d["summary"][k]
            lines.append(f"| {label} | {s['p50']:.3f} | {s['p90']:.3f} | {s['max']:.3f} | {d['first_run'][k]:.3f} |")
    t = res["timings"]
    lines += ["", f"One-off start-up in this run: `airflow db migrate` {t['airflow_db_migrate_s']:.1f} s, "
              f"`import airflow` {t['airflow_import_s']:.1f} s."]
    return "\n".join(lines) + "\n"


def cmd_latency(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    polls = [float(x) for x in args.polls.split(",") if x]
    workdir = Path(tempfile.mkdtemp(prefix="fstream-bench-airflow-", dir=args.workdir))
    load_before = os.getloadavg()
    prov = start(args)
    try:
        kw = f'tuner="fixed", cc=2, plot_dir="{workdir}/plots"'
        dag_polls = tuple(float(x) for x in args.dag_polls.split(",") if x)
        with Rig(workdir, transfer_kw=kw, polls=dag_polls) as rig:
            trig = run_trigger_latency(rig, polls, args.samples, rng, args.file_size)
            dag = [run_dag_latency(rig, p, args.dag_samples, rng, args.file_size, workdir / "airflow-dag-test.log")
                   for p in (dag_polls if args.dag_samples else ())]
            timings = dict(rig.timings)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    arrivals = [rng.uniform(0, 600) for _ in range(args.sim_arrivals)]
    sims = []
    for period, looks, label in ((0.5, 2, "model of FStream's rule, 0.5 s, 2 looks (no scan/Redis cost)"),
                                 (0.2, 2, "model of FStream's rule, 0.2 s, 2 looks (no scan/Redis cost)"),
                                 (5.0, 1, "SFTP-trigger-like poll 5 s, first sighting"),
                                 (5.0, 2, "poll 5 s, 2 looks (completeness check)"),
                                 (20.0, 1, "thesis-like poll 20 s, first sighting"),
                                 (20.0, 2, "poll 20 s, 2 looks (completeness check)")):
        lat = simulate_poller(arrivals, period, looks)
        sims.append({"label": label, "period_s": period, "looks": looks, **summary(lat)})
    res = {"bench": "airflow-latency", "machine": machine_line(), "load_before": load_before,
           "load_after": os.getloadavg(), "file_size": args.file_size, "seed": args.seed, "timings": timings,
           "trigger": trig, "simulated": sims, "dag": dag, "argv": args.raw_argv}
    return write_results("latency", res, latency_markdown(res), args, prov)

