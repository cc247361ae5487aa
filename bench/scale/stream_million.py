"""Issue 28: one ``fstream send --watch`` stream of a million files; RSS, files/s, rescans, and a restart.

Pinned loopback on tmpfs: the sender on CPU 0, the receiver on CPU 1 (``taskset``), sources and
destination under ``/dev/shm``. A million 64 KiB files do not fit in this machine's memory twice, so the
destination is consumed as it fills: a reaper thread (a downstream consumer) deletes landed files and
counts them; parts (dot-files) are left alone. Sources are hard links of one seeded file per directory
of 1,000 (scanning and bookkeeping see a million distinct names and inodes; the receiver writes and
verifies every byte).

The producer keeps at most ``window`` files waiting (added, not yet landed), so the rate measured is the
stream's, not the producer's. Measured: files/s landed (overall and over the steady part), sender and
receiver RSS at each checkpoint and their peaks, the sender's own scans (``scan_seconds`` and
``scan_listed`` of its interval records: what an idle rescan costs once the tree is large), and a restart:
the sender is stopped (SIGTERM, a drain), ``restart_new`` files are added, a new sender starts with the
same state dir; the seconds until the first new file lands, until all have, and how many files landed
after the restart (equal to ``restart_new``: no landed file was sent again).
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
from fstream_bench.scale.growth import _add, _rss
from fstream_bench.core.workload_gen import content_block

MODULES = (*provenance.AGENT, "fstream_bench.scale.stream_million", "fstream_bench.scale.growth", "fstream_bench.peers",
           "fstream_bench.core.report", "fstream_bench.core.workload_gen")


class Reaper(threading.Thread):
    """Deletes landed files under ``root`` (directory by directory, in order) and counts them."""

    def __init__(self, root: Path) -> None:
        super().__init__(name="reaper", daemon=True)
        self.root = root
        self.count = 0
        self.names: set[str] | None = None  # when set, the names reaped are kept (the restart's new files)
        self.first_at: dict[str, float] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            found = self.sweep()
            if not found:
                self._halt.wait(0.05)

    def sweep(self) -> int:
        n = 0
        try:
            dirs = [d for d in os.scandir(self.root) if d.is_dir()]
        except FileNotFoundError:
            return 0
        for d in dirs:
            with os.scandir(d.path) as it:
                for e in it:
                    if e.name.startswith("."):
                        continue
                    os.unlink(e.path)
                    n += 1
                    if self.names is not None:
                        self.names.add(e.name)
                        self.first_at.setdefault("first", time.monotonic())
        self.count += n
        return n

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)
        self.sweep()


class AgentStream:
    """The same stream as a job: a Redis bus, ``fstream agent`` (the process measured) and ``fstream submit --watch``.

    What it adds: the bus's memory per file (``used_memory`` at each checkpoint, minus the empty bus) and a
    restart by the agent's own SIGTERM drain: the job is handed back and a new agent takes it.
    """

    def __init__(self, sites: Sites, rx, src: Path, workdir: Path, interval: str) -> None:  # noqa: ANN001
        from fstream_provider.bus.embedded import RedisServer

        self.sites, self.rx, self.src, self.workdir, self.interval = sites, rx, src, workdir, interval
        self.redis = RedisServer(str(workdir / "redis")).start()
        from fstream_provider.bus.client import connect

        self.client = connect(self.redis.url)
        self.base_memory = int(self.client.info("memory")["used_memory"])
        self.env = {**os.environ, "FSTREAM_STATE_DIR": str(workdir / "state-send")}
        self.job_id: str | None = None

    def used_memory(self) -> int:
        return int(self.client.info("memory")["used_memory"]) - self.base_memory

    def start(self, tag: str):  # noqa: ANN201
        argv = [*fs_peer.fstream_argv(), "-v", "agent", "--redis", self.redis.url, "--secret-file", str(self.rx.secret),
                "--root", str(self.src), "--allow-hardlinks", "--name", f"stream-{tag}"]  # its files are links
        proc = spawn(self.sites, "src", argv, log_path=self.workdir / f"agent-{tag}.log", env=self.env)
        if self.job_id is None:
            import subprocess

            out = subprocess.run([*fs_peer.fstream_argv(), "submit", str(self.src) + "/", "--to", self.rx.url("in"),
                                  "--tuner", "fixed", "--cc", "4", "--p", "1",
                                  "--pp", "16", "--watch", "--interval", self.interval, "--redis", self.redis.url,
                                  "--detach", "--json"], capture_output=True, text=True, env=self.env, timeout=120)
            if out.returncode != 0:
                raise PeerError(f"fstream submit failed ({out.returncode}): {out.stderr[-600:]}")
            self.job_id = json.loads(out.stdout)["job_id"]
        return proc

    def close(self) -> None:
        self.client.close()
        self.redis.stop()


def _sender(sites: Sites, rx, src: Path, workdir: Path, tag: str, interval: str):  # noqa: ANN001, ANN202
    argv = [*fs_peer.fstream_argv(), "-v", "send", str(src) + "/", "--to", rx.url("in"), "--secret-file",
            str(rx.secret),
            "--tuner", "fixed", "--cc", "4", "--p", "1", "--pp", "16", "--watch", "--interval", interval,
            "--json"]
    out = open(workdir / f"send-{tag}.json", "wb")
    try:
        return spawn(sites, "src", argv, log_path=workdir / f"send-{tag}.log", stdout=out,
                     env={**os.environ, "FSTREAM_STATE_DIR": str(workdir / "state-send")})
    finally:
        out.close()


def _scans(path: Path) -> list[dict]:
    try:
        doc = json.loads(path.read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        return []
    return [{k: iv.get(k) for k in ("t", "scan_seconds", "scan_listed", "files_done")}
            for iv in doc.get("intervals", []) if "scan_seconds" in iv]


def run(workdir: Path, *, files: int = 1_000_000, size: int = 64 * 2**10, batch: int = 2000, window: int = 20_000,
        checkpoints=(100_000, 500_000, 1_000_000), restart_new: int = 10_000, interval: str = "1s",
        pin: bool = True, via_agent: bool = False, log=print) -> dict:
    workdir = Path(workdir)
    src, dst, protos = workdir / "src", workdir / "dst", workdir / "protos"
    for d in (src, dst, protos):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    pinned = pin and shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
    sites = Sites(src_prefix=("taskset", "-c", "0"), dst_prefix=("taskset", "-c", "1")) if pinned else Sites()
    block = content_block(0)
    points: list[dict] = []
    peak = {"sender": 0, "receiver": 0}
    reaper = Reaper(dst / "in")
    sender = None
    doc: dict = {"machine": machine_info(), "files": files, "size": size, "batch": batch, "window": window,
                 "interval": interval, "pinned": pinned, "via": "agent" if via_agent else "send"}
    bus: AgentStream | None = None
    try:
        with fs_peer.FStreamReceiver(sites=sites, workdir=workdir / "fstream", root=dst) as rx:
            if via_agent:
                bus = AgentStream(sites, rx, src, workdir, interval)
            sender = bus.start("a") if bus else _sender(sites, rx, src, workdir, "a", interval)
            reaper.start()
            have, t0, next_cp = 0, time.monotonic(), list(checkpoints)
            marks: list[tuple[float, int]] = []
            last_sample = 0.0
            while reaper.count < files:
                if sender.poll() is not None:
                    raise PeerError(f"sender exited early ({sender.returncode}): "
                                    f"{(workdir / 'send-a.log').read_text()[-600:]}")
                if have < files and have - reaper.count < window:
                    n = min(batch, files - have)
                    _add(src, protos, have, n, size, block)
                    have += n
                else:
                    time.sleep(0.05)
                now = time.monotonic()
                if now - last_sample >= 1.0:
                    last_sample = now
                    marks.append((now - t0, reaper.count))
                    for k, pid in (("sender", sender.pid), ("receiver", rx.proc.pid)):
                        peak[k] = max(peak[k], _rss(pid))
                if next_cp and reaper.count >= next_cp[0]:
                    cp = next_cp.pop(0)
                    points.append({"files": cp, "elapsed_s": now - t0, "sender_rss": _rss(sender.pid),
                                   "receiver_rss": _rss(rx.proc.pid), "sender_peak_rss": peak["sender"],
                                   "receiver_peak_rss": peak["receiver"],
                                   "redis_bytes": bus.used_memory() if bus else None})
                    log(f"stream: {cp:,} landed in {now - t0:.0f} s; sender RSS "
                        f"{points[-1]['sender_rss'] / 2**20:.0f} MiB, receiver "
                        f"{points[-1]['receiver_rss'] / 2**20:.0f} MiB")
                if now - t0 > max(600.0, files / 200):
                    raise PeerError(f"stream too slow: {reaper.count} of {files} landed in {now - t0:.0f} s")
            elapsed = time.monotonic() - t0
            time.sleep(3 * float(interval.rstrip("s")))  # a few idle rescans over the full tree
            stop(sender, grace=60)
            doc["sender_a_exit"] = sender.returncode
            # the restart: new files arrive while the stream is down; a new sender, same state dir
            _add(src, protos, have, restart_new, size, block)
            reaper.names = set()
            before = reaper.count
            t_restart = time.monotonic()
            sender = bus.start("b") if bus else _sender(sites, rx, src, workdir, "b", interval)
            while reaper.count - before < restart_new and time.monotonic() - t_restart < 600:
                if sender.poll() is not None:
                    raise PeerError(f"restarted sender exited ({sender.returncode})")
                time.sleep(0.05)
            t_all = time.monotonic() - t_restart
            time.sleep(3 * float(interval.rstrip("s")))
            reaper.stop()
            stop(sender, grace=60)
            if bus:
                doc["redis_bytes_end"] = bus.used_memory()
            new_names = {f"f{i:06d}.dat" for i in range(have, have + restart_new)}
            doc["restart"] = {
                "new_files": restart_new, "landed_after_restart": reaper.count - before,
                "landed_new": len(reaper.names & new_names), "landed_old_again": len(reaper.names - new_names),
                "first_new_s": (reaper.first_at["first"] - t_restart) if "first" in reaper.first_at else None,
                "all_new_s": t_all}
    finally:
        if reaper.is_alive():
            reaper.stop()
        stop(sender)
        if bus:
            bus.close()
    steady = [m for m in marks if files * 0.1 <= m[1] <= files * 0.95]
    doc.update({"landed": reaper.count, "elapsed_s": elapsed, "files_per_s": files / elapsed,
                "steady_files_per_s": ((steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0])
                                       if len(steady) >= 2 and steady[-1][0] > steady[0][0] else None),
                "checkpoints": points, "peak_rss": peak, "marks": marks})
    scans = _scans(workdir / "send-a.json")
    doc["sender_scans"] = scans
    tail = [s for s in scans if (s.get("files_done") or 0) >= files]  # after the last file: idle rescans
    doc["idle_scans"] = {"n": len(tail),
                         "median_s": statistics.median([s["scan_seconds"] for s in tail]) if tail else None,
                         "listed_max": max((s["scan_listed"] or 0 for s in tail), default=None)}
    doc["restart_scans"] = _scans(workdir / "send-b.json")[:5]
    return doc


def markdown(doc: dict, command: str) -> str:
    m, r = doc["machine"], doc.get("restart", {})
    lines = [f"Command: `{command}`  ",
             f"Machine: {m['nproc']} CPUs ({m['cpu']}); load at start {m.get('loadavg', '?')}; {m['date']}. "
             f"{doc['files']:,} files of {doc['size'] // 1024} KiB, pinned: {doc['pinned']}.", "",
             "Sender: " + ("`fstream agent` running a `submit --watch` job" if doc.get("via") == "agent"
                           else "`fstream send --watch`") + ".",
             "", "| landed | elapsed (s) | sender RSS (MiB) | receiver RSS (MiB) | sender peak | receiver peak "
             "| Redis used (MiB) | Redis bytes per file |", "|---|---|---|---|---|---|---|---|"]
    for c in doc["checkpoints"]:
        rb = c.get("redis_bytes")
        lines.append(f"| {c['files']:,} | {c['elapsed_s']:.0f} | {c['sender_rss'] / 2**20:.0f} | "
                     f"{c['receiver_rss'] / 2**20:.0f} | {c['sender_peak_rss'] / 2**20:.0f} | "
                     f"{c['receiver_peak_rss'] / 2**20:.0f} | "
                     + (f"{rb / 2**20:.1f} | {rb / c['files']:.0f} |" if rb is not None else "— | — |"))
    idle = doc["idle_scans"]
    lines += ["", f"Files/s: {doc['files_per_s']:.0f} overall, {doc['steady_files_per_s'] or 0:.0f} steady. "
              f"Idle rescans after the last file: {idle['n']}, median "
              f"{(idle['median_s'] or 0) * 1000:.1f} ms, at most {idle['listed_max']} entries listed. "
              f"Restart: first new file after {r.get('first_new_s') or 0:.1f} s, all {r.get('new_files')} after "
              f"{r.get('all_new_s', 0):.1f} s; landed after the restart {r.get('landed_after_restart')} "
              f"(new {r.get('landed_new')}, old again {r.get('landed_old_again')})."]
    if "provenance" in doc:
        p = doc["provenance"]
        lines += ["", f"Provenance: commit {p['commit'][:12]}{' (dirty)' if p['dirty'] else ''}, load "
                  f"{p['load_start'][0]:.2f} at start, {p['load_end'][0]:.2f} at end."]
    return "\n".join(lines) + "\n"


def main(args) -> int:
    """Entry for ``fstream bench stream``."""
    workdir = Path(args.workdir or f"/dev/shm/fstream-bench-stream-{os.getpid()}")
    cps = tuple(int(x) for x in args.checkpoints.split(",") if x.strip())
    prov = provenance.start("stream", list(args.raw_argv), MODULES)
    try:
        doc = run(workdir, files=args.files, size=args.size, batch=args.batch, window=args.window, checkpoints=cps,
                  restart_new=args.restart_new, interval=args.interval, pin=not args.no_pin,
                  via_agent=args.via_agent)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    save_with_markdown("stream", doc, prov, args.results, markdown)
    r = doc["restart"]
    return 0 if doc["landed"] >= doc["files"] and r["landed_new"] == r["new_files"] and not r["landed_old_again"] else 1
