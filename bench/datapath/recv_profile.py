"""Issue 43: where the receiver's CPU goes, against iperf3's receiver, on the pinned 1 GiB case.

The run: BENCHMARKS §12's case (a), one 1 GiB file on tmpfs at cc=1, p=4, sent by ``fstream send`` (the keyed
checksum on, its default) into ``fstream receive`` writing onto tmpfs, and 1 GiB over 4 streams by iperf3,
alternately, ``repeat`` times; the sender and iperf3's client on CPU 0, both receivers on CPU 1. While each
runs, ``perf record -g -C 1`` samples CPU 1 (kernel and user stacks). The receiver's CPU-seconds come from
``/proc`` around the send (``cpu_meter.ServerCpu``), iperf3's server's from ``wait4`` (it serves one test).

Each sample of a receiving process is put in one stage by its stack (``STAGES``: scanning from the leaf, the
first frame that names a stage decides, so a softirq taken inside a syscall counts as TCP/IP, not as the
syscall). A stage's cost per GB is its share of that process's samples times the process's CPU-seconds per GB.
Python 3.11 has no perf trampolines, so Python code shows as the interpreter's own frames (one stage), and
user stacks are unwound by frame pointers (native frames without them end early; their leaf is still right).

Written beside the result (``<results>/recv-profile-<stamp>/``): the folded stacks of every sample of both
receivers (``comm;root;...;leaf count``, the input of every flame-graph tool) and, when ``inferno-flamegraph``
is installed (``cargo install inferno``), ``flame.svg``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from fstream_bench.core import RESULTS_DIR, provenance
from fstream_bench.core.cpu_meter import ServerCpu
from fstream_bench.core.report import machine_info
from fstream_bench.core.saved import save_with_markdown
from fstream_bench.datapath.loopback import _tmpfs_root, _warm, make_datasets
from fstream_bench.peers import fstream as fs_peer, iperf
from fstream_bench.peers.base import Sites, free_port

COMMAND = "recv-profile"  # ``fstream bench recv-profile`` (found by ``fstream_bench.cli._by_name``)
MODULES = (*provenance.AGENT, "fstream_bench.datapath.recv_profile", "fstream_bench.datapath.loopback",
           "fstream_bench.peers", "fstream_bench.core.cpu_meter")
GIB = 1 << 30

#: (stage, frame-name markers): a sample's stage is that of the first frame, from the leaf, containing a marker
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("BLAKE3 (keyed hash)", ("blake3",)),
    ("page allocation (fallocate at OPEN)", ("shmem_fallocate", "vfs_fallocate", "__x64_sys_fallocate")),
    ("TCP/IP receive processing", ("net_rx_action", "__napi_poll", "process_backlog", "tcp_v4_rcv", "tcp_v4_do_rcv",
                                   "tcp_rcv_established", "__release_sock", "tcp_data_queue")),
    ("socket → pipe (splice)", ("tcp_splice_read", "skb_splice_bits", "sock_splice_read")),
    ("pipe → file (splice into the page cache)", ("iter_file_splice_write", "splice_to_file", "do_splice_from")),
    ("socket → memory (recv/read copy)", ("tcp_recvmsg", "sock_recvmsg", "sock_read_iter")),
    ("memory → file (pwrite)", ("__x64_sys_pwrite64", "ksys_pwrite64")),
    ("file → memory (pread, hash read-back)", ("__x64_sys_pread64", "ksys_pread64")),
    ("pipe → memory (read)", ("pipe_read",)),
    ("waiting (scheduler, futex, poll)", ("__schedule", "schedule_hrtimeout", "futex_wait", "do_sys_poll",
                                          "do_select", "do_epoll_wait", "finish_task_switch")),
    ("Python interpreter", ("_PyEval", "PyObject_", "_PyObject", "PyFrame", "_Py_", "PyDict", "PyUnicode",
                            "libpython", "python3")),
)


def stage_of(frames: list[tuple[str, str]]) -> str:
    """The stage of one sample, ``frames`` from the leaf: (symbol, dso) each."""
    for sym, dso in frames:
        for stage, markers in STAGES:
            if any(m in sym or (m.startswith(("lib", "python")) and m in dso) for m in markers):
                return stage
    if frames and frames[0][1] == "[kernel.kallsyms]":
        return "other kernel"
    return "other user"


_HEAD = re.compile(r"^(\S.*?)\s+(\d+)/(\d+)\s")
_FRAME = re.compile(r"^\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)$")


def parse_script(text: str) -> list[tuple[str, int, list[tuple[str, str]]]]:
    """``perf script -F comm,pid,tid,ip,sym,dso`` output → (comm, pid, frames leaf first) per sample."""
    samples: list[tuple[str, int, list[tuple[str, str]]]] = []
    for block in text.split("\n\n"):
        lines = [ln for ln in block.split("\n") if ln.strip()]
        if not lines:
            continue
        head = _HEAD.match(lines[0] + " ")
        if head is None:
            continue
        frames = []
        for ln in lines[1:]:
            m = _FRAME.match(ln)
            if m:
                frames.append((m.group(1).split("+0x")[0], os.path.basename(m.group(2))))
        samples.append((head.group(1), int(head.group(2)), frames))
    return samples


class Recorder:
    """``perf record -g -C CPU`` around one transfer; ``samples()`` parses what it wrote."""

    def __init__(self, out: Path, cpu: int, freq: int) -> None:
        self.out, self.cpu, self.freq = out, cpu, freq
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Recorder":
        self.proc = subprocess.Popen(["perf", "record", "-g", "-F", str(self.freq), "-C", str(self.cpu), "-o",
                                      str(self.out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)  # perf opens its events before the transfer starts
        if self.proc.poll() is not None:
            raise RuntimeError(f"perf record: exited {self.proc.returncode}: {self.proc.stderr.read().decode()[-300:]}")
        return self

    def __exit__(self, *exc) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def samples(self) -> list[tuple[str, int, list[tuple[str, str]]]]:
        text = subprocess.run(["perf", "script", "-i", str(self.out), "-F", "comm,pid,tid,ip,sym,dso"],
                              capture_output=True, text=True, check=True).stdout
        return parse_script(text)


def _stages(samples: list[tuple[str, int, list[tuple[str, str]]]], keep) -> tuple[Counter, Counter]:  # noqa: ANN001
    """Samples per stage and folded stacks of the samples ``keep(comm, pid)`` accepts."""
    stages: Counter = Counter()
    folded: Counter = Counter()
    for comm, pid, frames in samples:
        if keep(comm, pid):
            stages[stage_of(frames)] += 1
            folded[fold(comm, [s for s, _ in reversed(frames)])] += 1
    return stages, folded


def fold(comm: str, names: list[str]) -> str:
    """One folded stack, root first; a run of unresolved frames (frame-pointer unwinding through code built
    without them, such as the interpreter) is one ``[unknown]``, not a tower of them."""
    out = [comm]
    for name in names:
        if not (name == "[unknown]" and out[-1] == "[unknown]"):
            out.append(name)
    return ";".join(out)


def run(work: Path, *, repeat: int, nbytes: int, freq: int, log=print) -> tuple[dict, Counter]:  # noqa: ANN001
    """Run both receivers ``repeat`` times under perf; return the document and the folded stacks."""
    machine = machine_info()
    sites = Sites(src_prefix=("taskset", "-c", "0"), dst_prefix=("taskset", "-c", "1"))
    tmpfs = _tmpfs_root()
    fast = Path(tempfile.mkdtemp(prefix="fstream-recv-profile-", dir=tmpfs)) if tmpfs else work / "fast"
    runs: list[dict] = []
    folded: Counter = Counter()
    try:
        data = make_datasets(fast / "src", big_bytes=nbytes, small_count=0)
        _warm(data["big"])
        for rep in range(repeat):
            for tool in (("fstream", "iperf3") if rep % 2 == 0 else ("iperf3", "fstream")):
                rec = Recorder(work / f"perf-{tool}-{rep}.data", 1, freq)
                if tool == "fstream":
                    dest = fast / "dst"
                    shutil.rmtree(dest, ignore_errors=True)
                    with fs_peer.FStreamReceiver(sites=sites, workdir=work / "fstream", root=dest) as rx:
                        pid = rx.proc.pid
                        with rec:
                            meter = ServerCpu(pid).start()
                            r = fs_peer.send(rx, data["big"], "in", tuner="fixed",
                                             options={"cc": 1, "p": 4, "pp": 1}, label="fstream")
                            cpu = meter.stop()
                    shutil.rmtree(dest, ignore_errors=True)
                    keep = (lambda p: lambda comm, spid: spid == p)(pid)
                else:
                    with rec:
                        r = iperf.Iperf3(sites=sites, workdir=work / "iperf3", port=free_port()).measure(
                            streams=4, nbytes=nbytes, label="iperf3")
                    cpu = r.cpu_dst_s or 0.0
                    keep = lambda comm, spid: comm == "iperf3"  # noqa: E731 - only the server runs on CPU 1
                if not r.ok:
                    raise RuntimeError(f"recv-profile: {tool} failed: {r.error[:500]}")
                stages, stacks = _stages(rec.samples(), keep)
                rec.out.unlink(missing_ok=True)
                folded.update(stacks)
                gb = r.bytes / 1e9
                runs.append({"tool": tool, "repeat": rep, "bytes": r.bytes, "seconds": r.seconds,
                             "gbit_s": r.bytes * 8 / r.seconds / 1e9, "cpu_s": cpu, "cpu_s_per_gb": cpu / gb,
                             "samples": sum(stages.values()), "stages": dict(stages)})
                log(f"recv-profile: [{rep + 1}/{repeat}] {tool}: {r.bytes * 8 / r.seconds / 1e9:.2f} Gbit/s, "
                    f"receiver {cpu / gb:.3f} CPU-s/GB, {sum(stages.values())} samples")
    finally:
        if tmpfs:
            shutil.rmtree(fast, ignore_errors=True)
    return {"machine": machine, "bytes": nbytes, "repeat": repeat, "freq": freq, "runs": runs,
            "summary": summarize(runs)}, folded


def summarize(runs: list[dict]) -> dict:
    """Per tool: median (min, max) CPU-s/GB, and per stage the median over runs of its CPU-s/GB."""
    out: dict[str, dict] = {}
    for tool in sorted({r["tool"] for r in runs}):
        mine = [r for r in runs if r["tool"] == tool]
        per_gb = [r["cpu_s_per_gb"] for r in mine]
        names = sorted({s for r in mine for s in r["stages"]})
        stages = {s: statistics.median(r["cpu_s_per_gb"] * r["stages"].get(s, 0) / max(1, r["samples"])
                                       for r in mine) for s in names}
        out[tool] = {"cpu_s_per_gb": {"median": statistics.median(per_gb), "min": min(per_gb), "max": max(per_gb)},
                     "gbit_s": statistics.median(r["gbit_s"] for r in mine), "stages": stages}
    return out


def markdown(doc: dict, command: str) -> str:
    s = doc["summary"]
    fs, ip = s.get("fstream", {}), s.get("iperf3", {})
    names = sorted({*fs.get("stages", {}), *ip.get("stages", {})},
                   key=lambda n: -fs.get("stages", {}).get(n, 0.0))
    rows = [f"| {n} | {fs.get('stages', {}).get(n, 0.0):.3f} | {ip.get('stages', {}).get(n, 0.0):.3f} |"
            for n in names]

    def total(t: dict) -> str:
        c = t.get("cpu_s_per_gb", {})
        return f"{c.get('median', 0):.3f} ({c.get('min', 0):.3f}–{c.get('max', 0):.3f})"
    ratio = fs["cpu_s_per_gb"]["median"] / ip["cpu_s_per_gb"]["median"] if fs and ip else float("nan")
    m = doc["machine"]
    return "\n".join([
        f"Command: `{command}`  ",
        f"Machine: {m.get('nproc')} CPUs; {m.get('date')}; load at start {m.get('loadavg')}. {doc['bytes'] / GIB:.0f} "
        f"GiB at p=4 into tmpfs, {doc['repeat']} runs each, alternating; receivers on CPU 1 under `perf record -g "
        f"-F {doc['freq']}` (the profiler's own cost is in both).", "",
        "| stage (receiver, CPU 1) | fstream CPU-s/GB | iperf3 CPU-s/GB |", "|---|---|---|", *rows,
        f"| **total** (median, range) | **{total(fs)}** | **{total(ip)}** |", "",
        f"fstream's receiver over iperf3's: {ratio:.2f}× CPU per GB (medians); throughput "
        f"{fs.get('gbit_s', 0):.2f} vs {ip.get('gbit_s', 0):.2f} Gbit/s. A stage's figure is the median over runs of "
        "its share of the receiver's samples times the receiver's CPU-s/GB."]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fstream bench recv-profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gib", type=float, default=1.0, help="GiB per transfer")
    ap.add_argument("--freq", type=int, default=2999, help="perf's sampling frequency (Hz)")
    ap.add_argument("--results", default=str(RESULTS_DIR))
    a = ap.parse_args(argv)
    for tool, why in (("perf", "apt-get install linux-perf"), ("taskset", "util-linux"), ("iperf3", "iperf3")):
        if shutil.which(tool) is None:
            ap.error(f"{tool} is not installed ({why})")
    if (os.cpu_count() or 1) < 2:
        ap.error("needs two CPUs: the sender on CPU 0, the receiver on CPU 1")
    prov = provenance.start("recv-profile", list(argv or sys.argv[1:]), MODULES)
    work = Path(tempfile.mkdtemp(prefix="fstream-recv-profile-"))
    try:
        doc, folded = run(work, repeat=a.repeat, nbytes=int(a.gib * GIB), freq=a.freq)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    jp, _ = save_with_markdown("recv-profile", doc, prov, a.results, markdown)
    side = jp.with_suffix("")
    side.mkdir(exist_ok=True)
    (side / "folded.txt").write_text("".join(f"{k} {v}\n" for k, v in sorted(folded.items())))
    flame = shutil.which("inferno-flamegraph") or str(Path.home() / ".cargo/bin/inferno-flamegraph")
    if os.access(flame, os.X_OK):
        with open(side / "flame.svg", "wb") as out:
            subprocess.run([flame, "--title", "receivers on CPU 1: fstream (keyed checksum) and iperf3, 1 GiB at p=4",
                            str(side / "folded.txt")], stdout=out, check=True)
        print(f"flame graph: {side / 'flame.svg'}")
    else:
        print(f"folded stacks: {side / 'folded.txt'} (no inferno-flamegraph: `cargo install inferno` draws it)")
    return 0
