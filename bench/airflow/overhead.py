"""The Airflow benchmark's overhead: the operator path vs ``fstream send`` (in-process and CLI), same data."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from fstream_bench.airflow.results import machine_line, say, size_label, start, write_results
from fstream_bench.airflow.rig import Rig
from fstream_bench.peers.fstream import fstream_argv


def _dataset(root: Path, count: int, size: int, seed: int) -> Path:
    from fstream_bench.core.workload_gen import content_block, write_file

    block = content_block(seed)
    for i in range(count):
        p = root / f"f{i:05d}.dat"
        if not (p.is_file() and p.stat().st_size == size):
            write_file(p, size, block, key=f"{seed}:{root.name}:{i}")
    return root


def _check_landed(dest: Path, count: int, size: int) -> None:
    files = [p for p in dest.rglob("*") if p.is_file()]
    if len(files) != count or any(p.stat().st_size != size for p in files):
        raise RuntimeError(f"{dest}: expected {count} files of {size} bytes, found {len(files)}")


def cmd_overhead(args: argparse.Namespace) -> int:
    from fstream_provider.model.units import parse_size

    datasets = []
    for item in args.datasets.split(","):
        n, _, sz = item.partition("x")
        datasets.append((item, int(n), int(parse_size(sz))))
    workdir = Path(tempfile.mkdtemp(prefix="fstream-bench-airflow-", dir=args.workdir))
    load_before = os.getloadavg()
    prov = start(args)
    results: dict[str, Any] = {}
    try:
        kw = f'tuner="{args.tuner}", cc={args.cc}, plot_dir="{workdir}/plots"'
        with Rig(workdir, transfer_kw=kw) as rig:
            from fstream_provider.model.spec import TransferSpec
            from transfer_agent.sending.sender import Transfer

            log_path = workdir / "airflow-dag-test.log"
            for name, count, size in datasets:
                src = _dataset(workdir / "src" / name, count, size, args.seed)
                say(f"dataset {name}: {count} x {size} bytes ready")

                def operator(dest_rel: str) -> dict[str, float]:
                    bench_id = uuid.uuid4().hex
                    state, marks, wall = rig.dag_test("fstream_bench_overhead", {
                        "bench_id": bench_id, "source": str(src), "destination": rig.url(dest_rel)}, log_path)
                    if state != "success":
                        raise RuntimeError(f"overhead DAG run ended {state}; see {log_path}")
                    ev = rig.job_event_ts(marks["job_id"])
                    m = {k: float(v) for k, v in marks.items() if k != "job_id"}
                    return {"seconds": m["transfer_done"] - m["transfer_execute"], "dag_test_wall": wall,
                            "agent_transfer_s": m["report_seconds"],
                            "execute_to_claimed": ev["claimed"] - m["transfer_execute"],
                            "claimed_to_done": ev["done"] - ev["claimed"],
                            "done_to_resume": m["transfer_resume"] - ev["done"],
                            "execute_complete": m["transfer_done"] - m["transfer_resume"]}

                def in_process(dest_rel: str) -> dict[str, float]:
                    spec = TransferSpec.from_options([str(src)], rig.url(dest_rel), tuner=args.tuner, cc=args.cc,
                                                     secret_file=str(rig.secret_file), verify=True)
                    t0 = time.monotonic()
                    r = Transfer(spec).run()
                    dt = time.monotonic() - t0
                    if getattr(r, "failed_files", None):
                        raise RuntimeError(f"in-process transfer failed: {r}")
                    return {"seconds": dt}

                def cli(dest_rel: str) -> dict[str, float]:
                    cmd = [*fstream_argv(), "send", str(src), "--to", rig.url(dest_rel), "--secret-file",
                           str(rig.secret_file), "--tuner", args.tuner, "--cc", str(args.cc)]
                    t0 = time.monotonic()
                    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                                       env={k: v for k, v in os.environ.items() if k != "FSTREAM_REDIS_URL"})
                    dt = time.monotonic() - t0
                    if p.returncode:
                        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr[-2000:]}")
                    return {"seconds": dt}

                methods: dict[str, Callable[[str], dict[str, float]]] = {
                    "operator": operator, "send_inprocess": in_process, "send_cli": cli}
                order = list(methods)
                runs: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
                warmup: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
                for rep in range(-args.warmup, args.reps):
                    for mname in order[rep % 3:] + order[:rep % 3]:  # rotate: ABC, BCA, CAB, ...
                        dest_rel = f"ovh/{name}/{mname}-{rep}"
                        subprocess.run(["sync"], check=False)
                        r = methods[mname](dest_rel)
                        _check_landed(rig.dst / dest_rel, count, size)
                        shutil.rmtree(rig.dst / dest_rel, ignore_errors=True)
                        (runs if rep >= 0 else warmup)[mname].append(r)
                        say(f"{name} {'rep ' + str(rep + 1) if rep >= 0 else 'warm-up'}/{args.reps} {mname}: "
                             f"{r['seconds']:.2f}s")
                results[name] = _overhead_summary(runs, count, size)
                results[name]["warmup"] = warmup
            timings = dict(rig.timings)
            timings["save_plot_warm_s"] = _time_save_plot(workdir / "plot-probe.png")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    res = {"bench": "airflow-overhead", "machine": machine_line(), "load_before": load_before,
           "load_after": os.getloadavg(), "tuner": args.tuner, "cc": args.cc, "reps": args.reps, "warmup": args.warmup,
           "timings": timings, "datasets": results, "argv": args.raw_argv}
    return write_results("overhead", res, overhead_markdown(res), args, prov)


def _time_save_plot(path: Path, runs: int = 5) -> float:
    """Median wall time of the task log's PNG plot alone (warm, 10 intervals): part of ``execute_complete``."""
    from fstream_provider.model.tasklog import save_plot

    intervals = [{"t": float(i), "throughput_bps": 5e9, "cc": 4, "p": 1} for i in range(10)]
    save_plot(intervals, str(path), 1e9)  # imports matplotlib
    times = []
    for _ in range(runs):
        t0 = time.monotonic()
        save_plot(intervals, str(path), 1e9)
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def _overhead_summary(runs: dict[str, list[dict[str, float]]], count: int, size: int) -> dict[str, Any]:
    sec = {m: [r["seconds"] for r in rs] for m, rs in runs.items()}
    # per-rep ratios pair the operator run with the reference run of the same rotation
    ratios = {ref: [a / b for a, b in zip(sec["operator"], sec[ref])] for ref in ("send_inprocess", "send_cli")}
    return {
        "count": count, "size": size, "runs": runs,
        "median_s": {m: statistics.median(v) for m, v in sec.items()},
        "min_s": {m: min(v) for m, v in sec.items()}, "max_s": {m: max(v) for m, v in sec.items()},
        "ratio_median_of_medians": {ref: statistics.median(sec["operator"]) / statistics.median(sec[ref])
                                    for ref in ratios},
        "ratio_per_rep": ratios,
        "extra_s_per_rep": {ref: [a - b for a, b in zip(sec["operator"], sec[ref])] for ref in ratios},
        "operator_parts_median": {k: statistics.median(r[k] for r in runs["operator"])
                                  for k in ("execute_to_claimed", "claimed_to_done", "agent_transfer_s",
                                            "done_to_resume", "execute_complete", "dag_test_wall")},
    }


def overhead_markdown(res: dict[str, Any]) -> str:
    lines = [f"### Overhead: `FStreamTransferOperator` vs `fstream send` ({res['machine']})", "",
             "Same receiver (an `fstream receive` process), same source files (page-cached), "
             f"tuner `{res['tuner']}` cc={res['cc']}, checksums on, "
             f"{res['reps']} runs per method in rotated order (ABC, BCA, CAB…) after {res['warmup']} unmeasured "
             "warm-up round(s), `sync` before each. "
             "Operator = `execute()` start → `execute_complete` end under `dag.test()` (job submitted to a real "
             "agent thread, in-line trigger); in-process = `Transfer(spec).run()` wall; CLI = `fstream send` "
             "subprocess wall.", "",
             "| Dataset | operator p50 (s) | in-process p50 (s) | CLI p50 (s) | operator / in-process (per-rep range) "
             "| operator / CLI (per-rep range) | operator − in-process, p50 (s) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, d in res["datasets"].items():
        med, rr = d["median_s"], d["ratio_per_rep"]
        mm = d["ratio_median_of_medians"]
        lines.append(
            f"| {d['count']} × {size_label(d['size'])} | {med['operator']:.2f} | {med['send_inprocess']:.2f} | "
            f"{med['send_cli']:.2f} | {mm['send_inprocess']:.3f} ({min(rr['send_inprocess']):.2f}–"
            f"{max(rr['send_inprocess']):.2f}) | {mm['send_cli']:.3f} ({min(rr['send_cli']):.2f}–"
            f"{max(rr['send_cli']):.2f}) | {statistics.median(d['extra_s_per_rep']['send_inprocess']):.3f} |")
    lines += ["", "Where the operator's time goes (medians, s; the first four add up to the operator's time):", "",
              "| Dataset | `execute()` → claimed | claimed → job done (agent; its own report) "
              "| job done → `execute_complete` starts (trigger + Airflow resume) | `execute_complete` (events, "
              "table, PNG) | whole `dag.test()` |", "|---|---:|---:|---:|---:|---:|"]
    for name, d in res["datasets"].items():
        p = d["operator_parts_median"]
        for w in d.get("warmup", {}).get("operator", [])[:1]:  # the first (cold) operator run
            lines.append(f"| {d['count']} × {size_label(d['size'])}, cold warm-up run | "
                         f"{w['execute_to_claimed']:.3f} | "
                         f"{w['claimed_to_done']:.3f} ({w['agent_transfer_s']:.3f}) | {w['done_to_resume']:.3f} | "
                         f"{w['execute_complete']:.3f} | {w['dag_test_wall']:.2f} |")
        lines.append(f"| {d['count']} × {size_label(d['size'])} | {p['execute_to_claimed']:.3f} | "
                     f"{p['claimed_to_done']:.3f} ({p['agent_transfer_s']:.3f}) | {p['done_to_resume']:.3f} | "
                     f"{p['execute_complete']:.3f} | {p['dag_test_wall']:.2f} |")
    lines += ["", f"The PNG plot alone (warm, isolated) takes {res['timings']['save_plot_warm_s']:.3f} s of "
              "`execute_complete`."]
    return "\n".join(lines) + "\n"


