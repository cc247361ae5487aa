"""Issue 43, "one port, several receiver processes": ``fstream receive --workers 2`` against ``--workers 1``.

``fstream bench workers [--repeat 5] [--cases large,small]``

Two jobs at once into one receiver port, from tmpfs to tmpfs, keyed BLAKE3 end to end (a shared secret), no
fsync; each job is one sender process (``Transfer(spec, job_id=...).run()``, what an agent runs), with job names
the router sends to different workers. The receiver is ``fstream receive --workers N`` as a user starts it: one
process (N = 1, no router), or a router and two worker processes (N = 2). Nothing is pinned: the point is whether
a second receiver process uses the machine's second core. Cases:

- **large**: each job one 512 MiB file at p = 4 (1 GiB per run);
- **small**: each job 1,000 files of 256 KiB at cc = 4 with pipelining (2,000 files per run).

Per run: the wall time from the start of both senders to the end of the later one (aggregate Gbit/s), each
sender's CPU (``wait4``) and the receiver tree's CPU (router and workers; ``cpu_meter.ServerCpu``). Modes run in
ABBA order, ``--repeat`` pairs per case. Reported: medians and ranges of each mode, and the 2-process / 1-process
ratios of the medians (same run). Writes ``bench/results/workers-<stamp>.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND = "workers"
MODULES = ("transfer_agent", "fstream_provider.authz", "fstream_provider.model", "fstream_provider.tuning",
           "fstream_bench.datapath.workers", "fstream_bench.core.cpu_meter", "fstream_bench.core.runstats")
CASES = {"large": {"files": 1, "size": 512 << 20, "opts": {"tuner": "fixed", "cc": 1, "p": 4, "pp": 1}},
         "small": {"files": 1000, "size": 256 << 10, "opts": {"tuner": "fixed", "cc": 4, "p": 1, "pp": 8}}}


def drive(argv: list[str]) -> int:
    """``python -m fstream_bench.datapath.workers --drive SRC URL SECRET JOB OPTS``: one transfer, one JSON line."""
    src, url, secret, job, opts = argv
    from fstream_provider.model.spec import TransferSpec
    from transfer_agent.sending.sender import Transfer

    spec = TransferSpec.from_options([src], url, secret_file=secret, **json.loads(opts))
    t0 = time.monotonic()
    r = Transfer(spec, job_id=job).run()
    print(json.dumps({"ok": r.ok, "files": r.verified_files, "bytes": r.bytes_sent, "seconds": time.monotonic() - t0,
                      "error": r.error}))
    return 0


def jobs_on_workers() -> list[str]:
    """Two job names the router of two workers sends to different workers."""
    from transfer_agent.receiving.router import route

    names: dict[int, str] = {}
    i = 0
    while len(names) < 2:
        names.setdefault(route({"role": "control", "key": "default", "job": f"bench-{i}"}, 2, {}, 0), f"bench-{i}")
        i += 1
    return [names[0], names[1]]


def _receiver(root: Path, secret: Path, workers: int, state: Path) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-m", "transfer_agent.cli", "receive", "--listen", "127.0.0.1:0",
                             "--root", str(root), "--secret-file", str(secret), "--no-fsync", "--workers",
                             str(workers)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "FSTREAM_STATE_DIR": str(state)})
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"receiver (--workers {workers}) did not start: {line!r}")
    return proc, int(line.rsplit(":", 1)[1])


def one_run(work: Path, secret: Path, case: str, workers: int, jobs: list[str]) -> dict:
    from fstream_bench.core import children, cpu_meter

    c = CASES[case]
    dst = work / "dst"
    shutil.rmtree(dst, ignore_errors=True)
    rx, port = _receiver(dst, secret, workers, work / "state")
    try:
        meter = cpu_meter.ServerCpu(rx.pid).start()
        t0 = time.monotonic()
        senders = [subprocess.Popen([sys.executable, "-m", "fstream_bench.datapath.workers", "--drive",
                                     str(work / f"src-{case}-{j}"), f"fstream://127.0.0.1:{port}/j{j}", str(secret),
                                     jobs[j], json.dumps(c["opts"])], stdout=subprocess.PIPE)
                   for j in range(2)]
        outs = [cpu_meter.wait_with_usage(s, 1800) for s in senders]
        wall = time.monotonic() - t0
        rx_cpu = meter.stop()
    finally:
        children.end(rx)
    runs = [json.loads(o.strip().splitlines()[-1]) for o, _cpu in outs]
    for r in runs:
        assert r["ok"] and r["files"] == c["files"], (case, workers, r)
    landed = sum(1 for p in dst.rglob("*") if p.is_file() and not p.name.startswith("."))
    assert landed == 2 * c["files"], (case, workers, landed)
    nbytes = 2 * c["files"] * c["size"]
    return {"case": case, "workers": workers, "wall_s": wall, "gbit_s": nbytes * 8 / wall / 1e9,
            "receiver_cpu_s": rx_cpu, "sender_cpu_s": sum(cpu for _o, cpu in outs),
            "receiver_cpu_s_per_gb": rx_cpu / (nbytes / 1e9), "sender_cpu_s_per_gb":
            sum(cpu for _o, cpu in outs) / (nbytes / 1e9), "senders": runs}


def make_sources(work: Path, cases: list[str]) -> None:
    for case in cases:
        c = CASES[case]
        block = os.urandom(1 << 20)
        for j in range(2):
            src = work / f"src-{case}-{j}"
            src.mkdir(parents=True)
            for i in range(c["files"]):
                with open(src / f"f{i:05d}.dat", "wb") as f:
                    left = c["size"]
                    while left:
                        n = min(left, len(block))
                        f.write(block[:n])
                        left -= n


def summarize(runs: list[dict], cases: list[str]) -> dict:
    import statistics

    out: dict[str, dict] = {}
    for case in cases:
        med = {}
        for w in (1, 2):
            mine = [r for r in runs if r["case"] == case and r["workers"] == w]
            med[w] = {k: statistics.median(r[k] for r in mine) for k in
                      ("gbit_s", "receiver_cpu_s_per_gb", "sender_cpu_s_per_gb", "wall_s")}
        out[case] = {"median": {str(w): v for w, v in med.items()},
                     "ratio_gbit_s": med[2]["gbit_s"] / med[1]["gbit_s"],
                     "ratio_receiver_cpu_per_gb": med[2]["receiver_cpu_s_per_gb"] / med[1]["receiver_cpu_s_per_gb"]}
    return out


def report(res: dict) -> str:
    from fstream_bench.core import runstats

    lines = [f"Command: `{res['provenance']['command']}`  ", runstats.provenance_line(res["provenance"]), "",
             "| case | receiver processes | Gbit/s, both jobs (median, range) | receiver CPU-s per GB | "
             "senders' CPU-s per GB |", "|---|---|---|---|---|"]
    for case in res["cases"]:
        for w in (1, 2):
            mine = [r for r in res["runs"] if r["case"] == case and r["workers"] == w]
            lines.append(f"| {case} | {w} | {runstats.med_range([r['gbit_s'] for r in mine], '{:.2f}')} | "
                         f"{runstats.med_range([r['receiver_cpu_s_per_gb'] for r in mine], '{:.2f}')} | "
                         f"{runstats.med_range([r['sender_cpu_s_per_gb'] for r in mine], '{:.2f}')} |")
    lines.append("")
    for case, s in res["summary"].items():
        lines.append(f"{case}: 2 processes / 1, Gbit/s {s['ratio_gbit_s']:.3f}, receiver CPU per GB "
                     f"{s['ratio_receiver_cpu_per_gb']:.3f} (ratios of the medians)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--drive":
        return drive(argv[1:])
    from fstream_bench.core.saved import RESULTS_DIR, save

    ap = argparse.ArgumentParser(prog="fstream bench workers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="ABBA pairs per case (default 5)")
    ap.add_argument("--cases", default="large,small", help="comma-separated: large, small (default both)")
    ap.add_argument("--results", default=str(RESULTS_DIR))
    a = ap.parse_args(argv)
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad:
        ap.error(f"--cases: unknown case(s) {', '.join(bad)} (known: {', '.join(CASES)})")
    from fstream_bench.core import provenance
    from transfer_agent.wire.auth import create_secret_file

    prov = provenance.start(COMMAND, argv, MODULES)
    load = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="fstream-workers-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        secret = create_secret_file(work / "secret")
        make_sources(work, cases)
        jobs = jobs_on_workers()
        runs = []
        for case in cases:
            for rep in range(a.repeat):
                for w in ((1, 2) if rep % 2 == 0 else (2, 1)):
                    r = one_run(work, secret, case, w, jobs)
                    r["repeat"] = rep
                    runs.append(r)
                    print(f"{case} workers={w} rep {rep}: {r['gbit_s']:.2f} Gbit/s, receiver "
                          f"{r['receiver_cpu_s_per_gb']:.2f} CPU-s/GB", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = {"bench": COMMAND, "cases": cases, "repeat": a.repeat, "jobs": jobs, "runs": runs,
           "summary": summarize(runs, cases), "load_start": load, "load_end": os.getloadavg()[0],
           "pinned": False}
    save(COMMAND, res, prov, a.results)
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
