"""Run a scenario: every tool on every workload, on loopback or the emulated WAN, in one run.

For each workload the files are built once in a staging directory and released into a fresh
source directory batch by batch (hard links, at the workload's arrival times), identically for
every tool. Streaming tools (the agent with ``--watch``) watch the source directory; batch tools
(GridFTP, rsync, SFTP) are re-run on whatever arrived and is not yet sent, the way a cron job
or an inotify script drives them (thesis §4.1: an unfinished interval merges with new files).
A sampler measures bytes landed at the destination every ``sample_s`` for every tool alike;
a tool's time is from the first batch's release to the first sample where every file is
present under its final name with all its bytes.
"""

from __future__ import annotations

import csv
import json
import queue
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fstream_provider.tuning.registry import TUNER_NAMES
from fstream_provider.tuning.workloads import Workload
from fstream_provider.model.units import parse_duration
from fstream_bench.peers import fstream as fs_peer, gridftp, iperf, rsync, sftp
from fstream_bench.peers.base import DestSampler, PeerError, PeerResult, Sites, free_port
from fstream_bench.peers.sshd import PrivateSshd
from fstream_bench.core.report import machine_info
from fstream_bench.core.workload_gen import Staged, build, materialize, release

FSTREAM_TUNERS = TUNER_NAMES  # ``fstream-<tuner>`` tools: every built tuner
DEFAULT_TOOLS = ("iperf3", "gridftp-globus", "gridftp-static", "rsync", "sftp", "fstream-static",
                 "fstream-dynamic", "fstream-fstream", "fstream-globus", "fstream-adaptivecc")


@dataclass
class Scenario:
    """What to run.

    :param name: scenario name (results directory prefix).
    :param path: "loopback" or "wan".
    :param workloads: workload names.
    :param tools: tool names (see ``DEFAULT_TOOLS``; ``fstream-<tuner>`` for any tuner).
    :param bandwidth_bps: path rate (WAN: configured; loopback: what tuners are told).
    :param rtt_s: path RTT (same).
    :param tcp_buffer: per-stream TCP buffer cap in bytes.
    :param count_factor: thins workload file counts.
    :param interval_s: seconds between batches.
    :param seed: workload seed.
    :param sample_s: destination sampling period.
    :param fstream_watch: ``--interval`` and ``--idle-exit`` for the agent's watch mode.
    :param oracle: also run the oracle grid search.
    :param timeout_s: per tool and workload.
    :param oracle_grid: ``{"cc": [...], "p": [...], "pp": [...]}`` for the oracle (default ``oracle.DEFAULT_GRID``).
    :param force_path: run even if the WAN selfcheck fails (the report says so at the top).
    """

    name: str
    path: str = "loopback"
    workloads: list[str] = field(default_factory=lambda: ["w1", "w2", "w3", "w4", "sra", "lcls"])
    tools: list[str] = field(default_factory=lambda: list(DEFAULT_TOOLS))
    bandwidth_bps: float = 1e9
    rtt_s: float = 0.040
    tcp_buffer: int = 2**20
    count_factor: float = 0.1
    interval_s: float = 5.0
    seed: int = 0
    sample_s: float = 0.25
    fstream_watch: dict = field(default_factory=lambda: {"interval": "1s", "idle_exit": "4s"})
    oracle: bool = False
    timeout_s: float = 600.0
    force_path: bool = False
    oracle_grid: dict | None = None


BUILTIN: dict[str, Scenario] = {
    "loopback-smoke": Scenario("loopback-smoke", "loopback", ["w4"], ["gridftp-globus", "rsync", "fstream-static"],
                               bandwidth_bps=10e9, rtt_s=0.0001, count_factor=0.02, interval_s=0.5),
    "loopback": Scenario("loopback", "loopback", bandwidth_bps=10e9, rtt_s=0.0001, count_factor=0.1),
    "wan": Scenario("wan", "wan", oracle=True, oracle_grid={"cc": [2, 8], "p": [1, 4], "pp": [8]}),
}


def load_scenario(arg: str) -> Scenario:
    """A built-in scenario name or a JSON file with ``Scenario`` fields."""
    if arg in BUILTIN:
        s = BUILTIN[arg]
        return Scenario(**{k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
                           for k, v in s.__dict__.items()})
    p = Path(arg)
    if p.is_file():
        return Scenario(**json.loads(p.read_text()))
    raise ValueError(f"scenario {arg!r}: not one of {', '.join(BUILTIN)} and not a JSON file")


def tool_available(tool: str) -> str | None:
    """None when ``tool`` can run here, else why not."""
    if tool.startswith("fstream-"):
        try:
            fs_peer.tool_tuner(tool)
        except ValueError as e:
            return str(e)
        return fs_peer.available()
    mod = {"iperf3": iperf, "rsync": rsync, "sftp": sftp}.get(tool) or (gridftp if tool.startswith("gridftp") else None)
    return mod.available() if mod else f"unknown tool {tool!r}"


@dataclass
class ToolRun:
    """One tool on one workload: the summary and its per-interval samples."""

    result: PeerResult
    samples: list[dict]
    active: list[tuple[float, float, int]] = field(default_factory=list)


class _Releaser:
    """Releases batches into ``src`` on a thread and tells batch tools what arrived."""

    def __init__(self, staged: Staged, src: Path) -> None:
        self.staged = staged
        self.src = src
        self.arrivals: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self, t0: float) -> None:
        def on_batch(k, batch, t) -> None:
            self.arrivals.put([self.src / f.path for f in batch.files])

        def run() -> None:
            try:
                release(self.staged, self.src, stop=self.stop, t0=t0, on_batch=on_batch)
            except BaseException as e:  # reported by the caller
                self.error = e
            finally:
                self.arrivals.put(None)

        self.thread = threading.Thread(target=run, name="workload-release", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread:
            self.thread.join(timeout=30)


def _batch_loop(rel: _Releaser, send: Callable[[list[Path], int], PeerResult], t0: float,
                cc: int, deadline: float) -> tuple[bool, str, list[tuple[float, float, int]]]:
    """Run ``send`` on whatever arrived until the releaser is done; return (ok, error, active periods)."""
    pending: list[Path] = []
    done = False
    active = []
    k = 0
    while not done or pending:
        if not pending:
            item = rel.arrivals.get(timeout=max(1.0, deadline - time.monotonic()))
            if item is None:
                done = True
                continue
            pending.extend(item)
        while True:  # merge everything that has already arrived
            try:
                item = rel.arrivals.get_nowait()
            except queue.Empty:
                break
            if item is None:
                done = True
            else:
                pending.extend(item)
        if time.monotonic() > deadline:
            return False, "timed out", active
        batch, pending = pending, []
        start = time.monotonic() - t0
        r = send(batch, k)
        active.append((start, time.monotonic() - t0, cc))
        k += 1
        if not r.ok:
            return False, r.error, active
    return True, "", active


def run_tool(tool: str, sc: Scenario, sites: Sites, staged: Staged, workdir: Path) -> ToolRun:
    """Run one tool on one workload (fresh source and destination directories)."""
    w = staged.workload
    src = workdir / "src"
    dst = workdir / "dst" / "in"
    for d in (src, dst):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    files = w.files
    total = w.total_bytes
    sampler = DestSampler(root=dst, expect_bytes=total, expect_files=len(files), period=sc.sample_s)
    rel = _Releaser(staged, src)
    avg = total / max(1, len(files))
    deadline = time.monotonic() + sc.timeout_s
    settings: dict = {}
    ok, error, active, extra, own_intervals = False, "", [], {}, []
    t0 = time.monotonic()

    def go() -> None:
        nonlocal t0
        t0 = time.monotonic()
        sampler.start(t0)
        rel.start(t0)

    try:
        if tool.startswith("gridftp"):
            st = (gridftp.globus_preset(avg) if tool == "gridftp-globus" else
                  gridftp.static_heuristic(avg_file_size=avg, file_count=len(files), bandwidth_bps=sc.bandwidth_bps,
                                           rtt_s=sc.rtt_s, tcp_buffer=sc.tcp_buffer))
            settings = st.as_dict()
            with gridftp.GridFTPServer(sites=sites, workdir=workdir / "gridftp") as srv:
                go()
                ok, error, active = _batch_loop(
                    rel, lambda b, k: gridftp.copy(srv, b, src, dst, st, label=f"{tool}-{k}"), t0, st.cc, deadline)
        elif tool in ("rsync", "sftp"):
            mod = rsync if tool == "rsync" else sftp
            settings = {"cc": 1, "p": 1, "pp": 0}
            with PrivateSshd(sites=sites, workdir=workdir / "sshd") as sshd:
                go()
                ok, error, active = _batch_loop(
                    rel, lambda b, k: mod.copy(sshd, b, src, dst, label=f"{tool}-{k}"), t0, 1, deadline)
        elif tool.startswith("fstream-"):
            tuner, extra_opts = fs_peer.tool_tuner(tool)
            opts = {"bandwidth": f"{sc.bandwidth_bps:.0f}bps", "rtt": f"{sc.rtt_s * 1000:g}ms", **extra_opts}
            settings = {"tuner": tuner, **opts}
            # the receiver's root is dst's parent and the destination path is "in" (``dst``).
            with fs_peer.FStreamReceiver(sites=sites, workdir=workdir / "fstream", root=dst.parent) as rx:
                go()
                # --idle-exit must outlast the gap between batches, or the agent leaves before the next one
                watch = dict(sc.fstream_watch)
                gap = max((b.t - a.t for a, b in zip(w.batches, w.batches[1:])), default=0.0)
                watch["idle_exit"] = f"{max(parse_duration(watch.get('idle_exit', '0s')), gap + 3.0):g}s"
                r = fs_peer.send(rx, [src], dst.name, tuner=tuner, options=opts, watch=watch, label=tool,
                                 timeout=sc.timeout_s)
            ok, error = r.ok, r.error
            extra = r.extra
            off = r.extra.get("started", t0) - t0
            own_intervals = [{**iv, "t": iv["t"] + off} for iv in r.intervals]
        else:
            raise PeerError(f"unknown tool {tool!r}")
    except (PeerError, OSError, queue.Empty) as e:
        ok, error = False, f"{type(e).__name__}: {e}"
    finally:
        rel.close()
        sampler.stop()
    if rel.error is not None:
        ok, error = False, f"workload release failed: {rel.error}"
    landed = sampler.samples[-1][1] if sampler.samples else 0
    seconds = sampler.complete_at if sampler.complete_at is not None else (
        sampler.samples[-1][0] if sampler.samples else 0.0)
    if ok and sampler.complete_at is None:
        ok, error = False, f"tool reported success but only {landed} of {total} bytes landed"
    result = PeerResult(tool=tool, settings=settings, files=len(files), bytes=total if ok else landed,
                        seconds=seconds, ok=ok, verified=tool.startswith(("fstream", "rsync")), error=error,
                        extra={**{k: v for k, v in extra.items() if k != "started"},
                               "avg_file_size": avg})
    cc_at = _cc_timeline(own_intervals, active)
    if own_intervals:
        # The agent preallocates its temp files, so bytes on disk jump ahead of the data; its own
        # interval records (bytes acknowledged per interval) are the honest curve for it.
        samples = [{"t": round(iv["t"], 3), "throughput_bps": iv["throughput_bps"], "bytes": "",
                    "cc": iv.get("cc") or 0, "p": iv.get("p") or 0, "pp": iv.get("pp") or 0,
                    "source": "agent"} for iv in own_intervals]
    else:
        samples = sampler.intervals()
        for s in samples:
            s["cc"], s["p"], s["pp"] = cc_at(s["t"])
            s["source"] = "dest"
    return ToolRun(result, samples, active)


def _cc_timeline(own: list[dict], active: list[tuple[float, float, int]]) -> Callable[[float], tuple]:
    """Channel count at time t: the agent's own interval records, else the batch tool's cc while it ran."""
    if own:
        own = sorted(own, key=lambda iv: iv["t"])

        def at(t: float) -> tuple:
            cur = (0, 0, 0)
            for iv in own:
                if iv["t"] - 1e-9 > t + 1.0:
                    break
                cur = (iv.get("cc") or 0, iv.get("p") or 0, iv.get("pp") or 0)
            return cur
        return at

    def at_batch(t: float) -> tuple:
        for a, b, cc in active:
            if a <= t <= b + 0.25:
                return (cc, 0, 0)
        return (0, 0, 0)
    return at_batch


class PathHandle:
    """The path a scenario runs on: its sites, its selfcheck, and how to revive or close it.

    Another process may tear the emulated WAN down mid-run (``fstream bench wan down --all``);
    ``alive()`` notices and ``revive()`` rebuilds the same path (same names and addresses) and
    checks it again, so a run loses one measurement, not the rest of the scenario.

    :param sites: where each end runs.
    :param check: the selfcheck of the path as first built.
    :param path: the ``WanPath`` (None on loopback).
    :param force: keep going when a selfcheck fails (recorded).
    """

    def __init__(self, *, sites: Sites, check: dict, path=None, force: bool = False) -> None:
        self.sites = sites
        self.check = check
        self.path = path
        self.force = force
        self.revived: list[dict] = []

    def alive(self) -> bool:
        return self.path is None or self.path.is_up()

    def revive(self, log: Callable[[str], None]) -> None:
        assert self.path is not None
        log("bench run: the WAN path was torn down by someone else; rebuilding it")
        try:
            self.path.down()
        except Exception as e:  # leftovers: report and build anyway
            log(f"bench run: clean-up before rebuilding: {e}")
        self.path.up()
        check = _selfcheck(self.path, force=self.force)
        self.revived.append({"at": time.strftime("%H:%M:%S"), "selfcheck": check})

    def close(self) -> None:
        if self.path is not None:
            self.path.down()


def open_path(sc: Scenario) -> PathHandle:
    """Build (or, on loopback, describe) the scenario's path."""
    if sc.path == "loopback":
        return PathHandle(sites=Sites(), check={"path": "loopback"})
    if sc.path != "wan":
        raise ValueError(f"scenario {sc.name}: path {sc.path!r} is not 'loopback' or 'wan'")
    import os
    if os.geteuid() != 0:
        raise PeerError("the emulated WAN needs root (network namespaces); run as root or use a loopback scenario")
    from fstream_bench.wan import netns
    from fstream_bench.wan.path import WanConfig, WanPath

    path = WanPath(WanConfig(rate_bps=sc.bandwidth_bps, rtt_s=sc.rtt_s, buffer_bytes=sc.tcp_buffer, run_id="bench"))
    path.up()
    try:
        check = _selfcheck(path, force=sc.force_path)
        sites = Sites(src_host=path.src_ip, dst_host=path.dst_ip, src_prefix=tuple(netns.ns_exec_argv(path.src_ns, [])),
                      dst_prefix=tuple(netns.ns_exec_argv(path.dst_ns, [])), name="wan")
    except BaseException:
        path.down()
        raise
    return PathHandle(sites=sites, check=check, path=path, force=sc.force_path)


def _selfcheck(path, force: bool = False, attempts: int = 3) -> dict:
    """The testbed's own selfcheck of what it built (printed in every report).

    Retries a failed check (a busy machine starves iperf3); after ``attempts`` failures it
    raises, unless ``force``: then the failure is recorded and shown at the top of the report.
    """
    from fstream_bench.wan.selfcheck import SelfcheckError, selfcheck

    err: SelfcheckError | None = None
    for _ in range(attempts):
        try:
            return selfcheck(path, duration=3.0)
        except SelfcheckError as e:
            err = e
            threading.Event().wait(5.0)
    assert err is not None
    if not force:
        raise err
    return {**err.result, "forced": True, "error": str(err)}


def run_scenario(sc: Scenario, results: Path, workdir: Path, log: Callable[[str], None] = print,
                 keep: bool = False) -> Path:
    """Run every tool on every workload; write summary.json and samples.csv under a new run directory.

    With ``keep`` the staged workloads and each tool's source/destination directories stay under
    ``workdir`` (``staging/NAME``, ``run/NAME/TOOL``), so a test can compare bytes.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(results) / f"{sc.name}-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    handle = open_path(sc)
    sites, check = handle.sites, handle.check
    summary: dict = {"scenario": sc.__dict__, "machine": machine_info(), "selfcheck": check, "runs": [],
                     "skipped": {}, "iperf3": None, "oracle": {}}
    log(f"bench run {sc.name}: path {sc.path}, selfcheck {json.dumps(check)}")
    rows: list[dict] = []
    try:
        tools = []
        for t in sc.tools:
            why = tool_available(t)
            if why:
                summary["skipped"][t] = why
                log(f"bench run: skipping {t}: {why}")
            else:
                tools.append(t)
        if "iperf3" in tools:
            r = iperf.Iperf3(sites=sites, workdir=workdir / "iperf3", port=free_port()).measure(
                streams=8, seconds=5, label="iperf3")
            summary["iperf3"] = r.to_dict()
            log(f"bench run: iperf3 -P 8: {r.throughput_bps / 1e9:.3f} Gbit/s {r.error}")
            tools.remove("iperf3")
        for name in sc.workloads:
            w: Workload = build(name, bandwidth_bps=sc.bandwidth_bps, rtt_s=sc.rtt_s, seed=sc.seed,
                                interval_s=sc.interval_s, count_factor=sc.count_factor)
            staged = materialize(w, workdir / "staging" / name, seed=sc.seed)
            log(f"bench run: {name}: {len(w.files)} files, {w.total_bytes / 1e9:.2f} GB in {len(w.batches)} batches")
            for tool in tools:
                for attempt in range(3):
                    if not handle.alive():
                        handle.revive(log)
                    tr = run_tool(tool, sc, sites, staged, workdir / "run" / name / tool)
                    if tr.result.ok or handle.alive():
                        break
                    log(f"bench run:   {tool}: lost the path mid-run ({tr.result.error[:120]}); again")
                if not keep:
                    shutil.rmtree(workdir / "run" / name / tool, ignore_errors=True)
                r = tr.result
                summary["runs"].append({"workload": name, **r.to_dict()})
                log(f"bench run:   {tool}: {'ok' if r.ok else 'FAILED'} {r.seconds:.1f} s, "
                    f"{r.throughput_bps / 1e6:.0f} Mbit/s {r.error[:200]}")
                rows += [{"workload": name, "tool": tool, **s} for s in tr.samples]
            if sc.oracle:
                from fstream_bench.wan.oracle import search
                for attempt in range(3):
                    if not handle.alive():
                        handle.revive(log)
                    summary["oracle"][name] = search(w, staged, sites, workdir / "oracle", sc,
                                                   grid=sc.oracle_grid, log=log)
                    if "error" not in summary["oracle"][name] or handle.alive():
                        break
            if not keep:
                shutil.rmtree(workdir / "staging" / name, ignore_errors=True)
    finally:
        handle.close()
        summary["path_rebuilt"] = handle.revived
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        with open(out / "samples.csv", "w", newline="") as f:
            cols = ["workload", "tool", "t", "throughput_bps", "bytes", "cc", "p", "pp", "source"]
            wr = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
            wr.writeheader()
            wr.writerows(rows)
    return out


def main(args) -> int:
    """Entry for ``fstream bench run``."""
    from fstream_provider.model.units import parse_duration

    import signal
    import sys

    # SIGTERM runs the same clean-up as Ctrl-C: tool processes stopped, the WAN path taken down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sc = load_scenario(args.scenario)
    if args.tools:
        sc.tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    if args.workloads:
        sc.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if args.count_factor:
        sc.count_factor = args.count_factor
    if args.interval:
        sc.interval_s = parse_duration(args.interval)
    sc.seed = args.seed
    sc.oracle = sc.oracle or args.oracle
    sc.force_path = sc.force_path or args.force_path
    workdir = Path(args.workdir or f"/tmp/fstream-bench-{sc.name}-{int(time.time())}")
    try:
        out = run_scenario(sc, Path(args.results), workdir, log=(lambda m: None) if args.json else print)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    from fstream_bench.core.report import render

    md = render(out)
    summary = json.loads((out / "summary.json").read_text())
    if args.json:
        print(json.dumps({"run_dir": str(out), **summary}, default=str))
    else:
        print(md)
        print(f"results: {out}")
    return 0 if all(r["ok"] for r in summary["runs"]) else 1
