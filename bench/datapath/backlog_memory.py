"""Issue 43: what a ``--watch`` stream started on a backlog costs the sender in memory, and where it goes.

The run: ``files`` files of ``size`` bytes in directories of 1,000, all present when the stream starts (a backlog,
as after an outage), on a real disk (ext4 under ``--dir``, default ``/var/tmp``), sent by ``fstream send --watch``
(the ``fstream`` tuner) into ``fstream receive --no-fsync`` writing onto the same disk. Two sends per size, each
with a fresh state directory and destination:

- **plain**: the sender as users run it; its RSS sampled from ``/proc`` every 0.25 s (peak and series);
- **traced**: the same sender under ``tracemalloc`` (a wrapper around the CLI, frames as ``--frames``): a
  snapshot whenever the traced total grew by 10 % since the last, and at exit the largest snapshot's top
  allocation sites, by line and by file. tracemalloc slows the sender and counts only Python's allocations,
  so this run says where the memory goes, and the plain run how much there is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from fstream_bench.core import RESULTS_DIR, provenance
from fstream_bench.core.report import machine_info
from fstream_bench.core.saved import save_with_markdown
from fstream_bench.datapath.fd_budget import _rss, landed_files, make_sources, send_watch
from fstream_provider.model.units import parse_size

COMMAND = "backlog-memory"  # ``fstream bench backlog-memory`` (found by ``fstream_bench.cli._by_name``)
MODULES = (*provenance.AGENT, "fstream_bench.datapath.backlog_memory", "fstream_bench.datapath.fd_budget")
REPO = Path(__file__).resolve().parents[2]

#: run before the CLI in the traced sender: snapshots at each 10 % growth, the largest one's top sites at exit
TRACER = """
import atexit, json, os, threading, time, tracemalloc
tracemalloc.start(int(os.environ["FSTREAM_TRACE_FRAMES"]))
_best = {"size": 0, "snap": None, "t": 0.0}
_t0 = time.monotonic()
def _watch():
    while True:
        time.sleep(1.0)
        cur = tracemalloc.get_traced_memory()[0]
        if cur > _best["size"] * 1.1:
            _best.update(size=cur, snap=tracemalloc.take_snapshot(), t=time.monotonic() - _t0)
threading.Thread(target=_watch, name="trace-watch", daemon=True).start()
def _dump():
    snap = _best["snap"] or tracemalloc.take_snapshot()
    snap = snap.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    def top(key, n):
        return [{"where": f"{s.traceback[0].filename}:{s.traceback[0].lineno}" if key == "lineno"
                 else s.traceback[0].filename, "bytes": s.size, "count": s.count}
                for s in snap.statistics(key)[:n]]
    stacks = [{"stack": [f"{fr.filename}:{fr.lineno}" for fr in s.traceback], "bytes": s.size, "count": s.count}
              for s in snap.statistics("traceback")[:15]] if snap.traceback_limit > 1 else []
    json.dump({"snapshot_bytes": _best["size"], "snapshot_at_s": _best["t"],
               "peak_bytes": tracemalloc.get_traced_memory()[1],
               "by_line": top("lineno", 40), "by_file": top("filename", 25), "by_stack": stacks},
              open(os.environ["FSTREAM_TRACE_OUT"], "w"))
atexit.register(_dump)
"""


def _fstream(traced: bool) -> list[str]:
    pre = TRACER if traced else ""
    code = pre + "\nimport sys\nimport transfer_agent.cli.main as m\nsys.argv[0] = 'fstream'\nsys.exit(m.main())\n"
    return [sys.executable, "-c", code]


class RssSampler(threading.Thread):
    def __init__(self, pid: int, period: float = 0.25) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.pid, self.period, self.peak, self.series = pid, period, 0, []
        self._halt = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self._halt.wait(self.period):
            rss = _rss(self.pid)
            if rss == 0:
                return
            self.peak = max(self.peak, rss)
            t = time.monotonic() - t0
            if not self.series or t - self.series[-1][0] >= 2.0:
                self.series.append((round(t, 1), rss))

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def one_send(work: Path, src: Path, *, traced: bool, frames: int, timeout_s: float) -> dict:
    """Send ``src`` as a ``--watch`` stream into a fresh receiver; the sender's memory and what landed."""
    tag = "traced" if traced else "plain"
    dst, secret, state = work / f"dst-{tag}", work / "secret", work / f"state-{tag}"
    if not secret.exists():
        secret.write_bytes(os.urandom(32))
        secret.chmod(0o600)
    dst.mkdir()
    env = {**os.environ, "FSTREAM_STATE_DIR": str(state), "FSTREAM_TRACE_FRAMES": str(frames),
           "FSTREAM_TRACE_OUT": str(work / f"trace-{tag}.json")}
    rx_log = open(work / f"receiver-{tag}.log", "w")
    rx = subprocess.Popen([*_fstream(False), "receive", "--listen", "127.0.0.1:0", "--root", str(dst),
                           "--secret-file", str(secret), "--no-fsync"], stdout=subprocess.PIPE, stderr=rx_log,
                          text=True, env={**os.environ, "FSTREAM_STATE_DIR": str(work / f"rx-state-{tag}")})
    try:
        port = int(rx.stdout.readline().rsplit(":", 1)[1])
        samplers: list[RssSampler] = []

        def sample(pid: int) -> RssSampler:
            samplers.append(RssSampler(pid))
            samplers[0].start()
            return samplers[0]

        sent = send_watch(_fstream(traced), src, port, secret, work / f"send-{tag}", ["--tuner", "fstream"], timeout_s,
                          sample, env=env, grace_s=120)
        sampler, result, elapsed = samplers[0], sent["result"], sent["elapsed_s"]
        landed = landed_files(dst)
        trace_file = work / f"trace-{tag}.json"
        doc = {"traced": traced, "sender_exit": sent["sender_exit"], "elapsed_s": elapsed, "landed": landed,
               "files_per_s": landed / elapsed if elapsed else None, "sender_peak_rss": sampler.peak,
               "rss_series": sampler.series, "verified": result.get("verified_files"),
               "failed": result.get("failed_files"), "sender_log_tail": sent["sender_log_tail"]}
        if traced and trace_file.exists():
            doc["trace"] = _relative(json.loads(trace_file.read_text()))
        return doc
    finally:
        rx.terminate()
        try:
            rx.wait(30)
        except subprocess.TimeoutExpired:
            rx.kill()
        rx_log.close()
        shutil.rmtree(dst, ignore_errors=True)


def _relative(trace: dict) -> dict:
    """File names relative to the checkout or to the interpreter's library (shorter, and the same on any host)."""
    prefixes = sorted({str(REPO) + "/", *(p + "/" for p in sys.path if p)}, key=len, reverse=True)

    def short(name: str) -> str:
        return next((name[len(p):] for p in prefixes if name.startswith(p)), name)
    for key in ("by_line", "by_file"):
        for row in trace.get(key, []):
            row["where"] = short(row["where"])
    for row in trace.get("by_stack", []):
        row["stack"] = [short(f) for f in row["stack"]]
    return trace


def run(work: Path, *, files: int, size: int, frames: int, timeout_s: float, traced: bool,
        log=print) -> dict:  # noqa: ANN001 - a print-like callable
    src = work / "src"
    t = time.monotonic()
    make_sources(src, files, size)
    log(f"backlog-memory: {files:,} files written in {time.monotonic() - t:.0f} s under {src}")
    fs = subprocess.run(["df", "--output=fstype", str(work)], capture_output=True, text=True).stdout.split()[-1]
    doc: dict = {"files": files, "size": size, "frames": frames, "filesystem": fs, "machine": machine_info(),
                 "runs": []}
    for mode in ((False, True) if traced else (False,)):
        r = one_send(work, src, traced=mode, frames=frames, timeout_s=timeout_s)
        log(f"backlog-memory: {'traced' if mode else 'plain'}: {r['landed']:,} landed in {r['elapsed_s']:.0f} s, "
            f"sender peak RSS {r['sender_peak_rss'] / 2**20:.0f} MiB")
        doc["runs"].append(r)
    return doc


def markdown(doc: dict, command: str) -> str:
    lines = [f"Command: `{command}`  ",
             f"Machine: {doc['machine']['nproc']} CPUs; {doc['machine']['date']}; load {doc['machine']['loadavg']}. "
             f"{doc['files']:,} files of {doc['size']} B on {doc['filesystem']}, all present at the start; "
             "`fstream send --watch` into `fstream receive --no-fsync` on the same disk.", "",
             "| run | landed | sender exit | files/s | sender peak RSS (MiB) | per pending file (B) |",
             "|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        lines.append(f"| {'traced' if r['traced'] else 'plain'} | {r['landed']:,} | {r['sender_exit']} | "
                     f"{r['files_per_s']:,.0f} | {r['sender_peak_rss'] / 2**20:.0f} | "
                     f"{r['sender_peak_rss'] / doc['files']:,.0f} |")
    trace = next((r.get("trace") for r in doc["runs"] if r.get("trace")), None)
    if trace:
        total = max(1, trace["snapshot_bytes"])
        lines += ["", "Where the traced sender's memory was at its largest snapshot "
                  f"({trace['snapshot_bytes'] / 2**20:.0f} MiB traced, {trace['snapshot_at_s']:.0f} s in; "
                  f"tracemalloc's peak {trace['peak_bytes'] / 2**20:.0f} MiB), the top sites:", "",
                  "| allocated at | MiB | share | objects | B per file |", "|---|---|---|---|---|"]
        for row in trace["by_line"][:15]:
            lines.append(f"| `{row['where']}` | {row['bytes'] / 2**20:.1f} | {row['bytes'] / total:.0%} | "
                         f"{row['count']:,} | {row['bytes'] / doc['files']:.0f} |")
        if trace.get("by_stack"):
            lines += ["", "The largest allocation stacks (oldest call first):", ""]
            lines += [f"- {row['bytes'] / 2**20:.1f} MiB, {row['count']:,} objects: "
                      + " → ".join(f"`{f}`" for f in row["stack"]) for row in trace["by_stack"][:8]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fstream bench backlog-memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=200_000)
    ap.add_argument("--size", default="1KiB")
    ap.add_argument("--frames", type=int, default=1, help="tracemalloc frames per allocation")
    ap.add_argument("--no-trace", action="store_true", help="only the plain send")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--dir", default="/var/tmp", help="a directory on the disk to measure (default /var/tmp)")
    ap.add_argument("--results", default=str(RESULTS_DIR))
    a = ap.parse_args(argv)
    prov = provenance.start("backlog-memory", list(argv or sys.argv[1:]), MODULES)
    work = Path(tempfile.mkdtemp(prefix="fstream-backlog-", dir=a.dir))
    try:
        doc = run(work, files=a.files, size=parse_size(a.size), frames=a.frames, timeout_s=a.timeout,
                  traced=not a.no_trace)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save_with_markdown("backlog-memory", doc, prov, a.results, markdown)
    return 0 if all(r["landed"] == doc["files"] and r["sender_exit"] == 0 for r in doc["runs"]) else 1
