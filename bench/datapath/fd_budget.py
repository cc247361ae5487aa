"""Issue 43: a ``--watch`` stream of many small files into a receiver at a low descriptor limit on a slow disk.

The defect it measures: on a 100,000-file stream of 1 KiB files the receiver's descriptors climbed past 13,000
(files whose COMMIT had left, waiting for a commit the disk could not keep up with), and at its limit every
further file was refused as terminal; under ``ulimit -n 1024`` 49,000 of 50,000 files failed. Now the receiver
parks OPENs beyond a budget of open parts from its limit (``transfer_agent.receiving.admission``).

The run: ``files`` files of ``size`` bytes in directories of 1,000, all present when the stream starts (a
backlog, as after an outage), sent by ``fstream send --watch`` (the tuner's choice of layout unless ``--cc``
and ``--pp`` are given) into ``fstream receive`` started with a hard and soft ``RLIMIT_NOFILE`` of ``fd_limit``,
writing with fsync onto an ext4 loop disk whose writes are capped by the block I/O cgroup
(``fstream_bench.wan.storage``; as root) at ``disk_bps``. Sampled every 50 ms: the receiver's descriptors (from
``/proc``); every second: its open parts, budget and parked OPENs (its metrics) and the sender's RSS.
Reported: whether every file landed, the peak descriptors against the limit, the OPENs that waited, files/s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

from fstream_bench.core import provenance
from fstream_bench.core.report import machine_info
from fstream_bench.core.saved import save_with_markdown
from fstream_bench.core import RESULTS_DIR
from fstream_provider.model.units import parse_rate, parse_size

COMMAND = "fd-budget"  # ``fstream bench fd-budget`` (found by ``fstream_bench.cli._by_name``)
MODULES = (*provenance.AGENT, "fstream_bench.datapath.fd_budget", "fstream_bench.wan.storage")
FSTREAM = [sys.executable, "-m", "transfer_agent.cli"]


def make_sources(top: Path, files: int, size: int) -> None:
    for i in range(files):
        d = top / f"d{i // 1000:04d}"
        if i % 1000 == 0:
            d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:07d}.dat").write_bytes(i.to_bytes(8, "big") * (size // 8))


def _metrics(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(fstream_receiver_\w+) (\S+)$", text, re.M)}


def _fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


class Sampler(threading.Thread):
    def __init__(self, receiver: int, sender: int, metrics_url: str) -> None:
        super().__init__(name="fd-sampler", daemon=True)
        self.receiver, self.sender, self.url = receiver, sender, metrics_url
        self.peak_fds = self.peak_open = self.peak_waiting = self.sender_rss = 0
        self.budget: float | None = None
        self.series: list[dict] = []
        self._halt = threading.Event()

    def run(self) -> None:
        t0, last = time.monotonic(), 0.0
        while not self._halt.wait(0.05):
            n = _fds(self.receiver)
            if n is None:
                return
            self.peak_fds = max(self.peak_fds, n)
            now = time.monotonic()
            if now - last >= 1.0:
                last = now
                self.sender_rss = max(self.sender_rss, _rss(self.sender))
                try:
                    m = _metrics(self.url)
                except OSError:
                    continue
                self.budget = m.get("fstream_receiver_open_parts_budget")
                self.peak_open = max(self.peak_open, int(m.get("fstream_receiver_open_parts", 0)))
                self.peak_waiting = max(self.peak_waiting, int(m.get("fstream_receiver_opens_waiting", 0)))
                self.series.append({"t": round(now - t0, 1), "fds": n, "open": m.get("fstream_receiver_open_parts"),
                                    "waiting": m.get("fstream_receiver_opens_waiting"),
                                    "committed": m.get('fstream_receiver_files_total{outcome="ok"}')})

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def run(work: Path, *, files: int, size: int, fd_limit: int, disk_bps: float | None, cc: int | None,
        pp: int | None, timeout_s: float) -> dict:
    from fstream_bench.wan import storage

    src, dst, secret = work / "src", work / "dst", work / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    t = time.monotonic()
    make_sources(src, files, size)
    doc: dict = {"bench": "fd-budget", "files": files, "size": size, "fd_limit": fd_limit, "machine": machine_info(),
                 "make_sources_s": time.monotonic() - t, "disk_bps": disk_bps}
    disk, cgroup = None, None
    if disk_bps:
        disk = storage.make_disk(work / "disk.img", dst, size_bytes=max(4 << 30, files * 16 << 10),
                                 write_bps=disk_bps)
        doc["disk"] = {k: disk.get(k) for k in ("throttle", "write_bps")}
        cgroup = disk.get("cgroup")  # cgroup v2: the receiver runs in it (v1 caps the device for everyone)
    else:
        dst.mkdir(parents=True)

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    rx_log = open(work / "receiver.log", "w")
    argv = [*FSTREAM, "receive", "--listen", "127.0.0.1:0", "--root", str(dst), "--secret-file", str(secret),
            "--metrics-listen", "127.0.0.1:0"]
    rx = subprocess.Popen(storage.in_cgroup_argv(cgroup, argv) if cgroup else argv, stdout=subprocess.PIPE,
                          stderr=rx_log, text=True, preexec_fn=low_limit)
    sampler = None
    try:
        port = int(rx.stdout.readline().rsplit(":", 1)[1])
        url = re.search(r"metrics on (http://\S+/metrics)", (work / "receiver.log").read_text()).group(1)
        layout = [*(["--tuner", "fixed", "--cc", str(cc), "--pp", str(pp or 0)] if cc else ["--tuner", "fstream"])]
        samplers: list[Sampler] = []

        def sample(pid: int) -> Sampler:
            samplers.append(Sampler(rx.pid, pid, url))
            samplers[0].start()
            return samplers[0]

        sent = send_watch(FSTREAM, src, port, secret, work / "send", layout, timeout_s, sample)
        sampler, result, elapsed = samplers[0], sent["result"], sent["elapsed_s"]
        landed = landed_files(dst)
        parts = sum(1 for p in dst.rglob("*.part"))
        final = _metrics(url)
        doc.update({
            "sender_exit": sent["sender_exit"], "elapsed_s": elapsed, "landed": landed, "parts_left": parts,
            "verified": result.get("verified_files"), "failed": result.get("failed_files"),
            "sender_result": {k: v for k, v in result.items() if not isinstance(v, (list, dict))},
            "files_per_s": landed / elapsed if elapsed else None,
            "peak_fds": sampler.peak_fds, "budget": sampler.budget, "peak_open_parts": sampler.peak_open,
            "peak_waiting": sampler.peak_waiting, "opens_parked": final.get("fstream_receiver_opens_parked_total"),
            "sender_peak_rss": sampler.sender_rss, "series": sampler.series,
            "sender_log_tail": sent["sender_log_tail"],
            "refusals": [line for line in (work / "receiver.log").read_text().splitlines() if "terminal" in line][:5]})
    finally:
        if sampler is not None:
            sampler.stop()
        rx.terminate()
        try:
            rx.wait(30)
        except subprocess.TimeoutExpired:
            rx.kill()
        rx_log.close()
        if disk is not None:
            storage.remove_disk(disk)
    return doc


def send_watch(fstream: list[str], src: Path, port: int, secret: Path, out: Path, extra: list[str], timeout_s: float,
               sample: Callable[[int], Any], env: dict[str, str] | None = None, grace_s: float = 60.0) -> dict:
    """``fstream send --watch`` of ``src`` into the receiver on ``port`` (destination ``out/``), until it exits by
    itself (``--idle-exit 10s``) or ``timeout_s`` passes (then SIGTERM, ``grace_s`` to exit); ``sample(pid)`` starts
    what watches the sender and returns it (``stop()`` once the sender ended). Its stdout goes to ``OUT.json``, its
    stderr to ``OUT.log``."""
    with open(out.with_suffix(".json"), "w") as stdout, open(out.with_suffix(".log"), "w") as stderr:
        t0 = time.monotonic()
        sender = subprocess.Popen([*fstream, "send", str(src), "--to", f"fstream://127.0.0.1:{port}/out",
                                   "--secret-file", str(secret), "--watch", "--interval", "2s", "--idle-exit", "10s",
                                   "--json", *extra], stdout=stdout, stderr=stderr, env=env)
        try:
            sampler = sample(sender.pid)
            try:
                sender.wait(timeout_s)
            except subprocess.TimeoutExpired:
                sender.terminate()
                sender.wait(grace_s)
            elapsed = time.monotonic() - t0
            sampler.stop()
        finally:
            if sender.poll() is None:
                sender.kill()
                sender.wait(10)
    return {"sender_exit": sender.returncode, "elapsed_s": elapsed, "result": _last_json(out.with_suffix(".json")),
            "sender_log_tail": out.with_suffix(".log").read_text().splitlines()[-5:]}


def landed_files(dst: Path) -> int:
    """Files landed under ``dst/out`` (the benchmarks' sources are named ``f*.dat``)."""
    return sum(1 for _ in (dst / "out").rglob("f*.dat")) if (dst / "out").exists() else 0


def _last_json(path: Path) -> dict:
    for line in reversed(path.read_text().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    return {}


def _n(v: float | None) -> str:
    return "—" if v is None else f"{v:,.0f}"  # — : a receiver without the budget (before issue 43)


def markdown(doc: dict, command: str) -> str:
    ok = doc["landed"] == doc["files"] and doc["sender_exit"] == 0
    disk = (f"an ext4 loop disk capped at {doc['disk_bps'] / 1e6:.0f} Mbit/s ({doc['disk']['throttle']} block I/O "
            "cgroup)" if doc.get("disk") else "the work directory's disk (not capped)")
    return "\n".join([
        f"Command: `{command}`  ",
        f"Machine: {doc['machine']['nproc']} CPUs; {doc['machine']['date']}. {doc['files']:,} files of "
        f"{doc['size']} B, all present at the start, `fstream send --watch` into a receiver at "
        f"`ulimit -n {doc['fd_limit']}` (hard and soft) writing with fsync onto {disk}.", "",
        "| landed | sender exit | peak descriptors | limit | open parts (peak / budget) | OPENs parked | "
        "files/s | sender peak RSS (MiB) |", "|---|---|---|---|---|---|---|---|",
        f"| {doc['landed']:,} of {doc['files']:,} | {doc['sender_exit']} | {doc['peak_fds']} | {doc['fd_limit']} | "
        f"{doc['peak_open_parts']} / {_n(doc['budget'])} | {_n(doc['opens_parked'])} | "
        f"{_n(doc['files_per_s'])} | {doc['sender_peak_rss'] / 2**20:.0f} |", "",
        f"Every file landed: {'yes' if ok else 'no'}; parts left: {doc['parts_left']}; the sender's last session: "
        f"{doc['verified']} verified, {doc['failed']} failed."
        + (f" Terminal refusals in the receiver's log: {doc['refusals']}" if doc["refusals"] else "")]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fstream bench fd-budget", description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--size", default="1KiB")
    ap.add_argument("--fd-limit", type=int, default=1024)
    ap.add_argument("--disk", default="40Mbit", help="the destination disk's write cap (as root); 'none': the "
                    "work directory's disk, uncapped")
    ap.add_argument("--cc", type=int, default=None, help="a fixed layout (default: the fstream tuner's choice)")
    ap.add_argument("--pp", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--dir", default=None, help="where the sources go (default: a temporary directory on /var/tmp)")
    ap.add_argument("--results", default=str(RESULTS_DIR))
    a = ap.parse_args(argv)
    disk_bps = None if a.disk == "none" else parse_rate(a.disk)
    if disk_bps and os.geteuid() != 0:
        ap.error("--disk: a capped disk needs root (losetup, mount, the block I/O cgroup); or --disk none")
    prov = provenance.start("fd-budget", list(argv or sys.argv[1:]), MODULES)
    work = Path(tempfile.mkdtemp(prefix="fstream-fd-budget-", dir=a.dir or "/var/tmp"))
    try:
        doc = run(work, files=a.files, size=parse_size(a.size), fd_limit=a.fd_limit, disk_bps=disk_bps, cc=a.cc,
                  pp=a.pp, timeout_s=a.timeout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save_with_markdown("fd-budget", doc, prov, a.results, markdown)
    return 0 if doc["landed"] == doc["files"] and doc["sender_exit"] == 0 and doc["peak_fds"] < a.fd_limit else 1
