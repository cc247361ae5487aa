"""Issue 28 (one part): what one scheduling cycle costs Redis, and what an idle agent costs Redis per second.

``python -m fstream_bench.scheduling.cycle [--live 10,100,1000] [--finished 0,10000] [--agents 32]
[--seconds 10] [--cycles 20] [--results DIR] [--json out.json]`` (``main(argv)``: ready for
``fstream bench sched-cycle``)

For each (live, finished) pair, a fresh ``redis-server`` (``bus.embedded.RedisServer``, no AOF) gets:

- ``finished`` finished jobs, through ``JobStore`` as agents leave them (submit, claim, finish ``succeeded``;
  job hashes and event streams stay for their retention, acknowledged entries are trimmed);
- ``live`` tasks on the SEAL/STEAL board (``SchedBoard.admit``): ``running = min(agents // 2, live // 2)`` of
  them interactive and started by busy agents (heartbeat keys alive), reporting progress that fills both ends
  (97 % of their maximum), the rest batch tasks waiting. Under STEAL a batch task starts only below the ends'
  maximum and never preempts, so the board holds still while it is measured: every cycle decides nothing new
  (the steady state of an idle agent with a queue behind busy ones).

Measured:

(b) **one scheduling cycle** (``SchedBoard.plan``, the call the agent's loop makes each ``sched_interval``) of
    an idle agent with the agents' own SealConfig (STEAL, ``small_s=1``, ``resize_running=False``): the first
    (cold) cycle, which reads the whole board (as every agent's resync does, every ``sched_board.RESYNC_S``),
    the steady cycle (board unchanged since the last one), and a cycle after one running task reported
    progress. Per cycle: wall ms, Redis commands and server usec (``INFO commandstats`` deltas, INFO
    itself left out), bytes Redis wrote to the client (``total_net_output_bytes`` delta less the INFO replies'
    own bytes, calibrated with an empty interval). Medians of ``cycles`` cycles.
(c) **idle agents' loops**: ``agents`` real ``transfer_agent.daemon.worker.Agent`` objects, in-process threads,
    default intervals, in plain (``fifo``) mode and in scheduled (``steal``) mode, on the same board and stream
    (no new entry comes: every one of them is idle). After a warm-up, Redis commands and server usec over
    ``seconds`` (``INFO commandstats`` delta) divided by agents and seconds: ops/s per idle agent, with the
    commands that make it up.

The result, with its provenance, goes to ``bench/results/sched-cycle-<UTC stamp>.json`` (``core.saved.run_saved``;
``--results DIR`` elsewhere, ``--json`` a copy). Run it alone: 32 agents and a ``redis-server`` on one machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from fstream_provider.bus.client import connect
from fstream_provider.bus.embedded import RedisServer
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.sched_board import SchedBoard
from fstream_provider.model.spec import TransferSpec
from fstream_provider.tuning.scheduler import SealConfig
from fstream_bench.core import provenance

NAMESPACE = "bench-sched"
SRC, DST = "src-dtn", "dst-dtn:9000"
CAP_BPS, UNIT_BPS = 10e9, 1e9
TASK_BYTES = 100e9
MODULES = (*provenance.AGENT, "fstream_bench.scheduling.cycle")
AGENT_CONFIG = SealConfig(small_s=1.0, steal=True, resize_running=False)  # as worker.Agent.run builds it


# ------------------------------------------------------------------ filling the bus
def _spec(i: int, klass: str) -> TransferSpec:
    return TransferSpec.from_options([f"/data/{i}"], f"fstream://{DST}/x{i}", priority_class=klass)


def _read_all(client: redis.Redis, keys: Keys, n: int) -> list[tuple[str, str]]:
    """``n`` new entries of the jobs stream, read by one consumer: ``(job id, entry id)``."""
    out: list[tuple[str, str]] = []
    while len(out) < n:
        resp = client.xreadgroup(keys.jobs_group(), "filler", {keys.jobs_stream(): ">"}, count=min(1000, n - len(out)))
        if not resp:
            break
        out += [(f["job_id"], e) for e, f in resp[0][1]]
    return out


def fill_finished(client: redis.Redis, keys: Keys, n: int) -> None:
    """``n`` jobs submitted, claimed and finished (``succeeded``) as an agent does."""
    store = JobStore(client, keys=keys)
    for i in range(n):
        store.submit(_spec(i, "batch"))
    for job, entry in _read_all(client, keys, n):
        claim = store.claim(job, entry, worker="filler", max_deliveries=5)
        store.finish(job, claim.attempt, entry, state="succeeded")
    store.trim_acked()


def _beat(client: redis.Redis, keys: Keys, name: str) -> None:
    client.hset(keys.agent(name), mapping={"name": name})
    client.pexpire(keys.agent(name), 3_600_000)


def fill_live(client: redis.Redis, keys: Keys, live: int, running: int) -> list[str]:
    """``live`` tasks on the board, ``running`` of them started by busy agents; returns the running ones."""
    client.hset(keys.sched_config(), mapping={f"{k}:{e}": v for e in (SRC, DST)
                                              for k, v in (("cap", CAP_BPS), ("unit", UNIT_BPS))})
    store = JobStore(client, keys=keys)
    for i in range(live):
        store.submit(_spec(i, "interactive" if i < running else "batch"))
    entries = _read_all(client, keys, live)
    setup = SchedBoard(client, keys, SealConfig(small_bytes=1e18))  # every task "small": each plan starts one
    now = time.time()
    started = []
    for i, (job, entry) in enumerate(entries[:running]):
        setup.admit(job, entry, src=SRC, dst=DST, size=TASK_BYTES, klass="interactive", arrival=now)
        _beat(client, keys, f"busy-{i}")
        d = setup.plan(f"busy-{i}")
        if d.job_id != job:
            raise RuntimeError(f"bench setup: busy-{i} started {d.job_id}, not {job}")
        started.append(job)
    for job in started:
        setup.report(job, 1e9, 0.97 * CAP_BPS / len(started), streams=4)
    for job, entry in entries[running:]:
        setup.admit(job, entry, src=SRC, dst=DST, size=TASK_BYTES, klass="batch", arrival=now)
    return started


# ------------------------------------------------------------------ measuring
def _snapshot(client: redis.Redis) -> tuple[dict, dict]:
    return client.info("commandstats"), client.info("stats")


def _delta(a: tuple[dict, dict], b: tuple[dict, dict]) -> dict[str, Any]:
    calls: dict[str, int] = {}
    usec = 0
    for name, row in b[0].items():
        if name == "cmdstat_info":
            continue
        before = a[0].get(name, {"calls": 0, "usec": 0})
        n = int(row["calls"]) - int(before["calls"])
        if n:
            calls[name[len("cmdstat_"):]] = n
            usec += int(row["usec"]) - int(before["usec"])
    return {"commands": sum(calls.values()), "by_command": dict(sorted(calls.items(), key=lambda kv: -kv[1])),
            "server_usec": usec,
            "bytes_out": int(b[1]["total_net_output_bytes"]) - int(a[1]["total_net_output_bytes"]),
            "bytes_in": int(b[1]["total_net_input_bytes"]) - int(a[1]["total_net_input_bytes"])}


def _calibrate(client: redis.Redis) -> tuple[int, int]:
    """The bytes the snapshots' own INFO calls add to a delta (out, in): the smallest of a few empty deltas."""
    deltas = []
    for _ in range(5):
        a = _snapshot(client)
        b = _snapshot(client)
        d = _delta(a, b)
        deltas.append((d["bytes_out"], d["bytes_in"]))
    return min(o for o, _ in deltas), min(i for _, i in deltas)


def _one(client: redis.Redis, fn: Callable[[], Any], overhead: tuple[int, int]) -> dict[str, Any]:
    a = _snapshot(client)
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    d = _delta(a, _snapshot(client))
    d["bytes_out"] = max(0, d["bytes_out"] - overhead[0])
    d["bytes_in"] = max(0, d["bytes_in"] - overhead[1])
    d["wall_ms"] = wall * 1e3
    return d


def _median(rows: list[dict]) -> dict[str, Any]:
    out = {k: statistics.median(r[k] for r in rows) for k in ("wall_ms", "commands", "server_usec", "bytes_out",
                                                             "bytes_in")}
    out["by_command"] = rows[len(rows) // 2]["by_command"]
    out["n"] = len(rows)
    return out


def measure_cycle(client: redis.Redis, keys: Keys, running: list[str], cycles: int = 20) -> dict[str, Any]:
    """(b): one idle agent's scheduling cycle: cold, steady (board unchanged), after one progress report."""
    overhead = _calibrate(client)
    _beat(client, keys, "idle-cycle")
    board = SchedBoard(client, keys, AGENT_CONFIG)
    cold = _one(client, lambda: board.plan("idle-cycle"), overhead)
    decided = board.plan("idle-cycle").job_id
    if decided:
        raise RuntimeError(f"bench: the board was meant to hold still, but the idle agent started {decided}")
    steady = [_one(client, lambda: board.plan("idle-cycle"), overhead) for _ in range(cycles)]
    changed = []
    for k in range(cycles if running else 0):
        job = running[k % len(running)]
        board.report(job, 1e9 + k, 0.97 * CAP_BPS / len(running), streams=4)  # as another agent's heartbeat
        changed.append(_one(client, lambda: board.plan("idle-cycle"), overhead))
    return {"cold": cold, "steady": _median(steady), "changed": _median(changed) if changed else None}


def measure_idle(url: str, client: redis.Redis, keys: Keys, mode: str, agents: int, seconds: float,
                 warmup: float = 2.0) -> dict[str, Any]:
    """(c): ``agents`` real idle agents' loops (``mode`` fifo or steal) for ``seconds``: ops/s per agent."""
    from transfer_agent.daemon.worker import Agent

    fleet = [Agent(url, name=f"idle-{mode}-{i}", keys=keys, scheduler=mode) for i in range(agents)]
    threads = [threading.Thread(target=a.run, name=a.name, daemon=True) for a in fleet]
    for t in threads:
        t.start()
    try:
        time.sleep(warmup)  # connected, group ensured, first beat, first (cold) cycle
        a = _snapshot(client)
        t0 = time.monotonic()
        time.sleep(seconds)
        d = _delta(a, _snapshot(client))
        elapsed = time.monotonic() - t0
    finally:
        for ag in fleet:
            ag.stop()
        for t in threads:
            t.join(30)
    started = [dict(ag.counters) for ag in fleet if ag.counters]
    per = agents * elapsed
    return {"agents": agents, "seconds": elapsed, "ops_per_agent_s": d["commands"] / per,
            "server_usec_per_agent_s": d["server_usec"] / per, "bytes_out_per_agent_s": d["bytes_out"] / per,
            "by_command_per_agent_s": {k: round(v / per, 2) for k, v in d["by_command"].items()},
            "counters": started}


def run(live: tuple[int, ...] = (10, 100, 1000), finished: tuple[int, ...] = (0, 10000), agents: int = 32,
        seconds: float = 10.0, cycles: int = 20, modes: tuple[str, ...] = ("fifo", "steal")) -> dict:
    """Every (live, finished) pair on a fresh ``redis-server``: (b) one cycle, (c) idle agents' ops/s."""
    logging.getLogger("transfer_agent").setLevel(logging.ERROR)
    rows = []
    for n_live in live:
        for n_fin in finished:
            server = RedisServer().start()
            client = connect(server.url)
            try:
                keys = Keys(NAMESPACE)
                t0 = time.monotonic()
                fill_finished(client, keys, n_fin)
                running = fill_live(client, keys, n_live, min(agents // 2, n_live // 2))
                fill_s = time.monotonic() - t0
                row: dict[str, Any] = {"live": n_live, "finished": n_fin, "running": len(running),
                                       "fill_s": round(fill_s, 1), "keys": client.dbsize()}
                row["cycle"] = measure_cycle(client, keys, running, cycles)
                row["idle"] = {m: measure_idle(server.url, client, keys, m, agents, seconds) for m in modes}
                rows.append(row)
            finally:
                client.close()
                server.stop()
    return {"agents": agents, "seconds": seconds, "cycles": cycles, "rows": rows}


def table(result: dict) -> str:
    """The result as markdown: one line per (live, finished, cycle), the idle agents' ops/s on each."""
    lines = ["| live | finished | cycle | ms | cmds | server µs | bytes out | idle fifo ops/s/agent | "
             "idle steal ops/s/agent |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        idle = [f"{r['idle'][m]['ops_per_agent_s']:.1f}" if m in r["idle"] else "" for m in ("fifo", "steal")]
        for name in ("cold", "steady", "changed"):
            c = r["cycle"][name]
            if c is not None:
                lines.append(f"| {r['live']} | {r['finished']} | {name} | {c['wall_ms']:.2f} | {c['commands']:.0f} | "
                             f"{c['server_usec']:.0f} | {c['bytes_out']:.0f} | {idle[0]} | {idle[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sched_cycle_bench", description=__doc__.splitlines()[0])
    p.add_argument("--live", default="10,100,1000")
    p.add_argument("--finished", default="0,10000")
    p.add_argument("--agents", type=int, default=32)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--cycles", type=int, default=20)
    p.add_argument("--json", help="also write the whole result here")
    p.add_argument("--results", default=None, help="directory of the result file (default bench/results)")
    a = p.parse_args(argv)
    from fstream_bench.core.saved import run_saved

    result = run_saved("sched-cycle", list(sys.argv[1:] if argv is None else argv), MODULES,
                       lambda: run(tuple(int(x) for x in a.live.split(",")),
                                   tuple(int(x) for x in a.finished.split(",")), a.agents, a.seconds, a.cycles),
                       a.results)
    print(table(result))
    for r in result["rows"]:
        for mode, idle in r["idle"].items():
            print(f"live {r['live']} finished {r['finished']} {mode}: {idle['ops_per_agent_s']:.1f} ops/s per idle "
                  f"agent: {idle['by_command_per_agent_s']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
