"""Issue 28: submit → first byte of a small job while 10,000 jobs wait, 32 agents share one Redis, history holds 1M
rows.

The bus is made as a facility's would be after a busy day, then real agents serve it:

* the transfer history gets ``history`` rows (``history_cache_bench.synthetic_rows``, as agents append them);
* the SEAL/STEAL board gets ``live`` tasks (``sched_cycle_bench.fill_live``): ``running`` of them started by
  busy agents that keep beating and reporting a rate near the endpoints' capacity (so the ends are
  saturated and the batch tasks wait), the rest batch tasks waiting — real jobs, submitted and admitted;
* ``agents`` real ``fstream agent --scheduler steal`` processes start on it (idle: every one runs the
  scheduling cycle over the whole board twice a second), and a real ``fstream receive``;
* then ``probes`` small interactive jobs (one 64 KiB file each, default tuner, signed like ``fstream submit``)
  are submitted one at a time, ``gap`` seconds apart, each measured from just before its submit to: the
  agent's ``claimed`` event, the file's OPEN (its ``file`` event's time less the file's own seconds: the
  first byte follows within a loopback round trip), and its commit.

Also measured over the probe window: the agents' CPU-seconds per second (all 32 processes), Redis
commands per second in all and per idle agent, and Redis's own CPU. Unpinned: 32 agents on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from fstream_bench.core import provenance
from fstream_bench.scale.history_cache import synthetic_rows
from fstream_bench.peers import fstream as fs_peer
from fstream_bench.peers.base import Sites, spawn, stop
from fstream_bench.scheduling.cycle import AGENT_CONFIG, CAP_BPS, fill_live
from fstream_provider.bus.client import connect
from fstream_provider.bus.embedded import RedisServer
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.sched_board import SchedBoard
from fstream_provider.bus.transfer_history import TransferHistory

MODULES = (*provenance.AGENT, "fstream_bench.scale.facility", "fstream_bench.scheduling.cycle",
           "fstream_bench.scale.history_cache", "fstream_bench.peers")


def _fill_history(client: Any, keys: Keys, rows: int, log) -> float:  # noqa: ANN001
    t0 = time.monotonic()
    hist = TransferHistory(client, keys=keys)
    for start in range(0, rows, 20_000):
        hist.append(synthetic_rows(min(20_000, rows - start), seed=start))
    log(f"facility: {rows:,} history rows in {time.monotonic() - t0:.0f} s")
    return time.monotonic() - t0


class Busy(threading.Thread):
    """The busy agents: heartbeats and progress of the running tasks, every second."""

    def __init__(self, url: str, keys: Keys, running: list[str]) -> None:
        super().__init__(name="busy", daemon=True)
        self.client = connect(url)
        self.board = SchedBoard(self.client, keys, AGENT_CONFIG)
        self.keys, self.running, self.halt = keys, running, threading.Event()

    def run(self) -> None:
        done = 1e9
        while not self.halt.wait(1.0):
            done += 0.97 * CAP_BPS / 8
            for i, job in enumerate(self.running):
                self.client.pexpire(self.keys.agent(f"busy-{i}"), 3_600_000)
                self.board.report(job, done, 0.97 * CAP_BPS / len(self.running), streams=4)


def _events(store: JobStore, job_id: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for _eid, ev in store.events(job_id):
        if ev["kind"] == "claimed" and "claimed" not in out:
            out["claimed"] = float(ev["ts"])
        elif ev["kind"] == "file" and ev.get("status") == "committed" and "committed" not in out:
            out["committed"] = float(ev["ts"])
            out["opened"] = float(ev["ts"]) - float(ev.get("seconds") or 0.0)
        elif ev["kind"] == "done":
            out["done"] = float(ev["ts"])
            out["state"] = ev.get("state")
    return out


def _q(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def run(workdir: Path, *, live: int = 10_000, running: int = 4, agents: int = 32, history: int = 1_000_000,
        probes: int = 40, gap: float = 1.5, warm: int = 0, log=print) -> dict:
    workdir = Path(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    (workdir / "src").mkdir(parents=True)
    for i in range(probes):
        (workdir / "src" / f"probe{i:03d}.dat").write_bytes(secrets.token_bytes(64 * 1024))
    for i in range(warm):
        (workdir / "src" / f"warm{i:03d}.dat").write_bytes(secrets.token_bytes(64 * 1024))
    state = workdir / "state"
    os.environ["FSTREAM_STATE_DIR"] = str(state)  # the local submitter's key: the agents read the same one
    keys = Keys()
    server = RedisServer(str(workdir / "redis")).start()
    client = connect(server.url)
    procs: list[Any] = []
    rows: list[tuple[str, float, dict]] = []
    busy: Busy | None = None
    doc: dict[str, Any] = {"live": live, "running": running, "agents": agents, "history": history, "probes": probes,
                           "gap_s": gap, "warm": warm}
    try:
        doc["history_fill_s"] = _fill_history(client, keys, history, log)
        t0 = time.monotonic()
        started = fill_live(client, keys, live, running)
        doc["board_fill_s"] = time.monotonic() - t0
        log(f"facility: {live:,} live tasks ({len(started)} running) on the board in {doc['board_fill_s']:.0f} s")
        busy = Busy(server.url, keys, started)
        busy.start()
        sites = Sites()
        with fs_peer.FStreamReceiver(sites=sites, workdir=workdir / "rx", root=workdir / "dst") as rx:
            env = {**os.environ, "FSTREAM_STATE_DIR": str(state)}
            for i in range(agents):
                argv = [*fs_peer.fstream_argv(), "agent", "--redis", server.url, "--secret-file", str(rx.secret),
                        "--root", str(workdir / "src"), "--scheduler", "steal", "--name", f"agent-{i:02d}"]
                procs.append(spawn(sites, "src", argv, log_path=workdir / f"agent-{i:02d}.log", env=env))
            deadline = time.monotonic() + 300
            while client.scard(keys.agents()) < agents and time.monotonic() < deadline:
                time.sleep(0.5)
            doc["agents_up"] = int(client.scard(keys.agents()))
            time.sleep(5.0)  # every agent past its first full read of the board
            from fstream_provider.authz.signing import resolve_signer
            from fstream_provider.model.spec import TransferSpec

            store = JobStore(client, keys=keys, signer=resolve_signer())
            if warm:  # agents that ran a job already: their history is loaded (once per process) before the window
                ids = []
                for i in range(warm):
                    ids.append(store.submit(TransferSpec.from_options(
                        [str(workdir / "src" / f"warm{i:03d}.dat")], rx.url(f"w{i}"), priority_class="interactive"))[0])
                    time.sleep(0.3)
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline and not all("done" in _events(store, j) for j in ids):
                    time.sleep(1.0)
                doc["warm_agents"] = len({w for j in ids for _e, ev in store.events(j)
                                          if ev["kind"] == "claimed" for w in [ev.get("worker")]})
                # the history loads those jobs started run in threads after them: wait until the agents are idle
                # again (under 0.5 CPU-s/s over 5 s, at most 240 s), else the first probes meet their CPU
                warm_ps = [psutil.Process(p.pid) for p in procs]
                t_idle = time.monotonic()
                while time.monotonic() - t_idle < 240:
                    c0 = _cpu(warm_ps)
                    time.sleep(5.0)
                    if (_cpu(warm_ps) - c0) / 5.0 < 0.5:
                        break
                doc["warm_settle_s"] = time.monotonic() - t_idle
            ps = [psutil.Process(p.pid) for p in procs]
            redis_ps = psutil.Process(server.proc.pid) if server.proc is not None else None
            cpu0, rcpu0 = _cpu(ps), _cpu([redis_ps]) if redis_ps else 0.0
            stats0 = client.info("stats")["total_commands_processed"]
            w0 = time.monotonic()
            submitted: list[tuple[str, float]] = []
            for i in range(probes):
                spec = TransferSpec.from_options([str(workdir / "src" / f"probe{i:03d}.dat")], rx.url(f"p{i}"),
                                                 priority_class="interactive")
                t = time.time()
                job_id, _ = store.submit(spec)
                submitted.append((job_id, t))
                time.sleep(gap)
            last = time.monotonic() + 60
            while time.monotonic() < last:
                rows = [(j, t, _events(store, j)) for j, t in submitted]
                if all("done" in e for _, _, e in rows):
                    break
                time.sleep(0.5)
            window = time.monotonic() - w0
            doc["agents_cpu_per_s"] = (_cpu(ps) - cpu0) / window
            doc["redis_cpu_per_s"] = ((_cpu([redis_ps]) - rcpu0) / window) if redis_ps else None
            doc["redis_cmds_per_s"] = (client.info("stats")["total_commands_processed"] - stats0) / window
            doc["window_s"] = window
    finally:
        if busy is not None:
            busy.halt.set()
        for p in procs:
            stop(p, grace=10)
        client.close()
        server.stop()
    doc["probes_rows"] = [{"job": j, "submitted": t, **e} for j, t, e in rows]
    for k in ("claimed", "opened", "committed"):
        xs = [e[k] - t for _, t, e in rows if k in e]
        doc[f"to_{k}"] = {"n": len(xs), "p50": _q(xs, 0.5), "p99": _q(xs, 0.99), "max": max(xs, default=None),
                          "min": min(xs, default=None), "all": xs}
    doc["succeeded"] = sum(1 for _, _, e in rows if e.get("state") == "succeeded")
    return doc


def markdown(doc: dict) -> str:
    m = doc.get("machine", {})
    lines = [f"Command: `{doc.get('command', '')}`  ",
             f"Machine: {m.get('nproc')} CPUs; load at start {m.get('loadavg', '?')}. {doc['live']:,} live jobs on "
             f"the board ({doc['running']} running, saturating), {doc['agents']} agents (`--scheduler steal`), "
             f"{doc['history']:,} history rows, {doc['probes']} probes {doc['gap_s']} s apart"
             + (f", after {doc['warm']} warm-up jobs on {doc.get('warm_agents')} agents." if doc.get("warm") else ".")
             , "",
             "| submit → | n | p50 (s) | p99 (s) | min | max |", "|---|---|---|---|---|---|"]
    for k in ("claimed", "opened", "committed"):
        s = doc[f"to_{k}"]
        if s["n"]:
            lines.append(f"| {k} | {s['n']} | {s['p50']:.3f} | {s['p99']:.3f} | {s['min']:.3f} | {s['max']:.3f} |")
    lines += ["", f"Succeeded {doc['succeeded']} of {doc['probes']}. Agents' CPU {doc['agents_cpu_per_s']:.2f} s/s "
              f"({doc['agents_cpu_per_s'] / doc['agents'] * 1000:.0f} ms/s each); Redis "
              f"{doc['redis_cmds_per_s']:.0f} commands/s ({doc['redis_cmds_per_s'] / doc['agents']:.1f} per agent), "
              f"Redis CPU {doc['redis_cpu_per_s'] or 0:.2f} s/s."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fstream bench facility", description=__doc__.split("\n\n")[0])
    ap.add_argument("--live", type=int, default=10_000)
    ap.add_argument("--running", type=int, default=4)
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--history", type=int, default=1_000_000)
    ap.add_argument("--probes", type=int, default=40)
    ap.add_argument("--gap", type=float, default=1.5)
    ap.add_argument("--warm", type=int, default=0, help="jobs run before the probes, so that the agents that ran "
                    "one have loaded the history (a process does once)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--results", default=None)
    args = ap.parse_args(argv)
    from fstream_bench.core.saved import run_saved

    workdir = Path(args.workdir or f"/tmp/fstream-bench-facility-{os.getpid()}")
    try:
        doc = run_saved("facility", list(sys.argv[1:] if argv is None else argv), MODULES,
                        lambda: run(workdir, live=args.live, running=args.running, agents=args.agents,
                                    history=args.history, probes=args.probes, gap=args.gap, warm=args.warm),
                        args.results)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(markdown(doc))
    return 0 if doc["succeeded"] == doc["probes"] else 1
