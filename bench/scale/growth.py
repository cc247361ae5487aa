"""Issue 2 (c): a ``--watch`` stream growing to 100,000 files of 64 KiB; sender/receiver RSS and scan time.

The source grows in steps of ``batch`` files, 1,000 per directory (new files land in new
directories, as instruments write them). Source files are hard links of one 64 KiB file per
directory (sizes and names are what scanning and bookkeeping see; the receiver still writes
and verifies every file). At each checkpoint (10k, 50k, 100k) the benchmark waits until the
destination holds every file, then records the sender's and the receiver's RSS (psutil) and
the cost of a scan: the agent's own ``SourceWatcher`` polled in this process on the same tree,
once with nothing new and once after ``batch`` new files, in both inotify and polling mode.
The watcher timed is the class ``fstream send --watch`` itself uses (taken from
``transfer_agent.sending.sender``, today ``fstream_provider.watch.source_watcher.SourceWatcher``).
The sender's own interval records carry ``scan_seconds`` (and ``scan_listed``); those are kept
per record and summarised per checkpoint too.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import threading
import time
from pathlib import Path

from fstream_bench.core import provenance
from fstream_bench.core.saved import save_with_markdown
from fstream_bench.peers import fstream as fs_peer
from fstream_bench.peers.base import PeerError, Sites, spawn, stop
from fstream_bench.core.report import machine_info
from fstream_bench.core.workload_gen import content_block

PER_DIR = 1000

#: what a scale result exercised (``provenance``): the agent, this benchmark and its harness pieces
MODULES = (*provenance.AGENT, "fstream_bench.scale.growth", "fstream_bench.peers", "fstream_bench.core.cpu_meter",
           "fstream_bench.core.report", "fstream_bench.core.workload_gen", "fstream_bench.core.runstats",
           "fstream_bench.core.saved")


def watcher_class():
    """The class ``fstream send --watch`` scans its sources with (so the benchmark times that one)."""
    from transfer_agent.sending import sender

    return sender.SourceWatcher


def watcher_name() -> str:
    w = watcher_class()
    return f"{w.__module__}.{w.__qualname__}"


def _rss(pid: int) -> int:
    import psutil

    try:
        p = psutil.Process(pid)
        return p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))
    except psutil.NoSuchProcess:
        return 0


def _count_committed(root: Path) -> int:
    n = 0
    for d in os.scandir(root):
        if d.is_dir():
            n += sum(1 for e in os.scandir(d.path) if not e.name.startswith("."))
    return n


def _add(src: Path, protos: Path, start: int, count: int, size: int, block: bytes) -> None:
    """Add files ``start .. start+count-1`` (hard links of one seeded file per directory, kept in ``protos``)."""
    protos.mkdir(parents=True, exist_ok=True)
    for i in range(start, start + count):
        k = i // PER_DIR
        first = protos / f"d{k:04d}"
        if not first.exists():
            off = (k * 7919) % len(block)
            data = (block[off:] + block[:off]) * (size // len(block) + 1)
            tmp = protos / f".d{k:04d}.tmp"
            tmp.write_bytes(data[:size])
            os.replace(tmp, first)
        d = src / f"d{k:04d}"
        d.mkdir(exist_ok=True)
        os.link(first, d / f"f{i:06d}.dat")


#: Idle scans timed per checkpoint (a single 7 ms scan is one sample of a noisy clock).
IDLE_SCANS = 5


def _scan_cost(src: Path, add_dir: Path | None, step: int, inotify: bool) -> dict:
    """Time a SourceWatcher's polls over ``src``: first (all files), idle, and after new files."""
    w = watcher_class()([str(src) + "/"], "scan", use_inotify=inotify)
    try:
        t = time.perf_counter()
        w.poll()
        first = time.perf_counter() - t
        w.poll()  # stable-size confirmation round when polling
        t = time.perf_counter()
        w.poll()
        idle = time.perf_counter() - t
        return {"first_scan_s": first, "idle_scan_s": idle, "listed": getattr(w, "last_scan_listed", None)}
    finally:
        w.close()


def run(workdir: Path, *, files: int = 100_000, size: int = 64 * 2**10, checkpoints=(10_000, 50_000, 100_000),
        batch: int = 2000, interval: str = "1s", log=print) -> dict:
    SourceWatcher = watcher_class()  # noqa: N806  (the sender's own watcher class)

    workdir = Path(workdir)
    src, dst = workdir / "src", workdir / "dst"
    for d in (src, dst, workdir / "protos"):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    block = content_block(0)
    sites = Sites()
    rows = []
    # the watcher we time lives alongside the sender and sees the same tree grow
    probe = SourceWatcher([str(src) + "/"], "probe", use_inotify=False)
    probe_inotify = SourceWatcher([str(src) + "/"], "probe", use_inotify=True)
    sender = None
    t_start = time.monotonic()
    try:
        with fs_peer.FStreamReceiver(sites=sites, workdir=workdir / "fstream", root=dst) as rx:
            argv = [*fs_peer.fstream_argv(), "send", str(src) + "/", "--to", rx.url("in"), "--secret-file",
                    str(rx.secret), "--tuner", "fixed", "--cc", "4", "--p", "1", "--pp", "16", "--watch",
                    "--interval", interval, "--idle-exit", "60s", "--json"]
            out_path = workdir / "send.json"
            with open(out_path, "wb") as out:
                sender = spawn(sites, "src", argv, log_path=workdir / "send.log", stdout=out,
                               env={**os.environ, "FSTREAM_STATE_DIR": str(workdir / "state-send")})
            have = 0
            peak = {"sender": 0, "receiver": 0}
            for cp in checkpoints:
                while have < min(cp, files):
                    n = min(batch, cp - have)
                    _add(src, workdir / "protos", have, n, size, block)
                    have += n
                    t = time.perf_counter()
                    new = probe.poll()
                    poll_s = time.perf_counter() - t
                    t = time.perf_counter()
                    new_i = probe_inotify.poll()
                    poll_i = time.perf_counter() - t
                    rows.append({"files": have, "step_new": n, "poll_scan_s": poll_s, "poll_found": len(new),
                                 "inotify_scan_s": poll_i, "inotify_found": len(new_i)})
                    for k, pid in (("sender", sender.pid), ("receiver", rx.proc.pid)):
                        peak[k] = max(peak[k], _rss(pid))
                    if sender.poll() is not None:
                        raise PeerError(f"fstream send --watch exited early with {sender.returncode}: "
                                        f"{(workdir / 'send.log').read_text()[-400:]}")
                # wait until the destination holds every file so far (deadline: 20 files/s at worst)
                deadline = time.monotonic() + max(120.0, have / 20)
                done = _count_committed(dst / "in") if (dst / "in").exists() else 0
                while done < have and time.monotonic() < deadline:
                    threading.Event().wait(1.0)
                    done = _count_committed(dst / "in") if (dst / "in").exists() else 0
                    for k, pid in (("sender", sender.pid), ("receiver", rx.proc.pid)):
                        peak[k] = max(peak[k], _rss(pid))
                # idle scans over the whole tree: nothing new, so cost should not grow with files seen
                idle_polls, idle_inotifies = [], []
                for _ in range(IDLE_SCANS):  # each scan kept; the table gives their median
                    t = time.perf_counter()
                    probe.poll()
                    idle_polls.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    probe_inotify.poll()
                    idle_inotifies.append(time.perf_counter() - t)
                idle_poll, idle_inotify = statistics.median(idle_polls), statistics.median(idle_inotifies)
                step = [r for r in rows if r.get("files") == have][-1]
                point = {"files": have, "landed": done, "elapsed_s": time.monotonic() - t_start,
                         "sender_rss": _rss(sender.pid), "receiver_rss": _rss(rx.proc.pid),
                         "sender_peak_rss": peak["sender"], "receiver_peak_rss": peak["receiver"],
                         "scan_new_poll_s": step["poll_scan_s"], "scan_new_inotify_s": step["inotify_scan_s"],
                         "scan_idle_poll_s": idle_poll, "scan_idle_inotify_s": idle_inotify,
                         "scan_idle_poll_runs_s": idle_polls, "scan_idle_inotify_runs_s": idle_inotifies,
                         "new_per_scan": step["step_new"],
                         "fresh_watcher_full_scan": _scan_cost(src, None, batch, False)}
                log(f"scale: {have} files ({done} landed, {point['elapsed_s']:.0f} s): "
                    f"sender RSS {point['sender_rss'] / 2**20:.0f} MiB, receiver RSS "
                    f"{point['receiver_rss'] / 2**20:.0f} MiB, scan with {step['step_new']} new "
                    f"{step['poll_scan_s'] * 1000:.1f} ms (poll) / {step['inotify_scan_s'] * 1000:.1f} ms (inotify), "
                    f"idle scan {idle_poll * 1000:.1f} ms / {idle_inotify * 1000:.1f} ms")
                rows.append({"checkpoint": point})
                if have >= files:
                    break
            # let the sender finish by idling out, but do not wait the whole --idle-exit: stop it
            stop(sender, grace=10)
    finally:
        probe.close()
        probe_inotify.close()
        stop(sender)
    doc = {"machine": machine_info(), "files": files, "size": size, "batch": batch, "interval": interval,
           "watcher": watcher_name(),
           "checkpoints": [r["checkpoint"] for r in rows if "checkpoint" in r],
           "steps": [r for r in rows if "checkpoint" not in r]}
    try:
        send_doc = json.loads((workdir / "send.json").read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        send_doc = {}
    # the sender's own scans, one per interval record: what ``send --watch`` paid, in its process
    doc["sender_scans"] = [{k: iv.get(k) for k in ("t", "scan_seconds", "scan_listed", "files_done")}
                           for iv in send_doc.get("intervals", []) if "scan_seconds" in iv]
    doc["sender_scan_seconds"] = [s["scan_seconds"] for s in doc["sender_scans"]]
    prev = -1
    for c in doc["checkpoints"]:  # per checkpoint: the scans while the sender's shipped count was in (prev, files]
        c["sender_scans"] = _scan_summary([s["scan_seconds"] for s in doc["sender_scans"]
                                           if prev < (s.get("files_done") or 0) <= c["files"]])
        prev = c["files"]
    return doc


def _scan_summary(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "median_s": statistics.median(xs), "max_s": max(xs)}


def markdown(doc: dict, command: str) -> str:
    m = doc["machine"]
    lines = [f"Command: `{command}`  ",
             f"Machine: {m['nproc']} CPUs ({m['cpu']}), kernel {m['kernel']}; load average at start "
             f"{m.get('loadavg', '?')}; date {m['date']}. {doc['size'] // 1024} KiB files, "
             f"{doc['batch']} new files per step, sender `--watch --interval {doc['interval']}`. "
             f"Scan cost: the benchmark polls `{doc.get('watcher', '?')}` (the watcher `fstream send --watch` "
             "uses) over the same growing tree, once polling and once with inotify; \"sender's own scans\" are "
             "the `scan_seconds` of the sender's interval records while it had shipped up to that checkpoint "
             "(median / max, count).", "",
             "| files | landed | elapsed (s) | sender RSS (MiB) | receiver RSS (MiB) | sender peak | receiver peak "
             "| scan with new files, polling (ms) | same, inotify (ms) | idle scan, polling (ms) "
             "| idle scan, inotify (ms) | fresh full scan (ms) | sender's own scans (ms) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in doc["checkpoints"]:
        lines.append(f"| {c['files']:,} | {c['landed']:,} | {c['elapsed_s']:.0f} | {c['sender_rss'] / 2**20:.0f} | "
                     f"{c['receiver_rss'] / 2**20:.0f} | {c['sender_peak_rss'] / 2**20:.0f} | "
                     f"{c['receiver_peak_rss'] / 2**20:.0f} | {c['scan_new_poll_s'] * 1000:.1f} | "
                     f"{c['scan_new_inotify_s'] * 1000:.1f} | {c['scan_idle_poll_s'] * 1000:.1f} | "
                     f"{c['scan_idle_inotify_s'] * 1000:.1f} | "
                     f"{c['fresh_watcher_full_scan']['first_scan_s'] * 1000:.0f} | "
                     f"{_scan_cell(c.get('sender_scans'))} |")
    if "provenance" in doc:
        p = doc["provenance"]
        lines += ["", f"Provenance: commit {p['commit'][:12]}{' (dirty)' if p['dirty'] else ''}, code "
                  f"{p['code_hash'][:19]}, load {p['load_start'][0]:.2f} at start, {p['load_end'][0]:.2f} at end."]
    return "\n".join(lines) + "\n"


def _scan_cell(s: dict | None) -> str:
    if not s or not s.get("n"):
        return "—"
    return f"{s['median_s'] * 1000:.1f} / {s['max_s'] * 1000:.1f} ({s['n']})"


def main(args) -> int:
    """Entry for ``fstream bench scale``."""
    workdir = Path(args.workdir or f"/tmp/fstream-bench-scale-{os.getpid()}")
    cps = tuple(int(x) for x in args.checkpoints.split(",") if x.strip())
    prov = provenance.start("scale", list(args.raw_argv), MODULES)
    try:
        doc = run(workdir, files=args.files, size=args.size, checkpoints=cps, batch=args.batch,
                  interval=args.interval)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    save_with_markdown("scale", doc, prov, args.results, markdown)
    return 0 if doc["checkpoints"] and all(c["landed"] >= c["files"] for c in doc["checkpoints"]) else 1
