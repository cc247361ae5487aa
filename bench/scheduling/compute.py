"""What one SEAL/STEAL scheduling cycle costs in Python at thousands of live tasks (no Redis, no I/O).

``python -m fstream_bench.scheduling.compute [--live 1000,10000] [--running 2,32] [--repeat 20] [--profile]
[--json out.json]`` (``run(live, running) -> dict``)

The board an idle agent sees behind busy ones: ``running`` interactive tasks on two streams each from ``a`` to
``b`` and ``c``, and ``live - running`` waiting tasks behind them, one in fifty interactive and the rest batch,
1-100 GB, arrived over the last ten minutes. Two scenarios:

- ``acting``: the running tasks move 80 % of ``a``'s maximum (below saturation (a), so the ends go through
  the link test (b)) and have run long enough to be preempted: the cycle preempts and starts;
- ``steady``: they move 97 % of it and restarted 5 s ago (the preempt guard spares them): the cycle decides
  nothing, as every idle agent's cycle does while a queue waits behind busy ones.

For the agents' configuration (STEAL, ``small_s=1``, no resizing) and SEAL's defaults:

- ``cycle_ms``: ``SealScheduler.cycle(now)`` on a scheduler built for it at ``now`` (as ``bus.sched_board``
  builds one for every cycle), median of ``repeat``; the build is not timed;
- ``kept_ms``: the next cycles of one scheduler half a second apart (as the simulator drives it), median;
- ``submit_ms``: building that scheduler through the public API (``Task`` + ``submit``, TT_ideal memoized
  across cycles as the board's ``IdealMemo`` does), the part of the board's cycle that is not ``cycle``;
- ``evaluations``: the model's evaluations (throughput and aggregate) in one cycle;
- with ``--profile``, cProfile's top entries (by own time) of one cycle.

Short by design (seconds): it runs beside other benchmarks. Nothing is written unless ``--json`` is given.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import pstats
import random
import statistics
import sys
import time
from typing import Any

from fstream_provider.bus.sched_view import IdealMemo
from fstream_provider.tuning.sched_model import EndpointCurve, LoadModel
from fstream_provider.tuning.scheduler import SealConfig, SealScheduler, Task

ENDS = {"a": 10e9, "b": 5e9, "c": 5e9, "d": 2e9}
PAIRS = [("a", "b"), ("a", "c"), ("a", "d")]
CONFIGS = {"steal-agents": SealConfig(steal=True, small_s=1.0, resize_running=False), "seal": SealConfig()}
NOW = 600.0


class Counting(LoadModel):
    """A ``LoadModel`` that counts its evaluations."""

    evaluations = 0

    def throughput(self, *args, **kwargs) -> float:
        self.evaluations += 1
        return super().throughput(*args, **kwargs)

    def aggregate(self, *args, **kwargs) -> float:
        self.evaluations += 1
        return super().aggregate(*args, **kwargs)


def _curves() -> dict[str, EndpointCurve]:
    return {e: EndpointCurve(c, unit_bps=1e9, overload=0.1) for e, c in ENDS.items()}


def board(live: int, running: int, scenario: str = "acting", seed: int = 0) -> list[Task]:
    """The tasks, as the board would hand them to a scheduler at ``NOW``."""
    rng = random.Random(seed)
    fill, ran = (0.97, 45.0) if scenario == "steady" else (0.8, 0.0)
    tasks = []
    for i in range(running):
        src, dst = PAIRS[i % 2]
        t = Task(f"r{i}", src, dst, 500e9, arrival=NOW - 60.0, state="running", cc=2, done_bytes=50e9,
                 rate_bps=fill * ENDS["a"] / running, trans_s=50.0, wait_s=10.0, run_start=ran)
        tasks.append(t)
    for i in range(live - running):
        src, dst = rng.choice(PAIRS)
        arrival = NOW - rng.uniform(0.0, 600.0)
        tasks.append(Task(f"w{i}", src, dst, 10 ** rng.uniform(9, 11), arrival=arrival,
                          klass="interactive" if i % 50 == 0 else "batch", wait_s=NOW - arrival))
    return tasks


def _scheduler(tasks: list[Task], cfg: SealConfig, ideal: dict[tuple, float]) -> tuple[SealScheduler, Counting]:
    model = Counting(_curves(), startup_s=1.0)
    sched = SealScheduler(model, cfg, now=NOW)
    for t in tasks:  # copies with TT_ideal computed once (submit's own work is timed in submit_ms)
        c = dataclasses.replace(t)
        key = (c.src, c.dst, c.size, sched._cc_cap(c))
        if key not in ideal:
            ideal[key] = model.ideal_time(c.src, c.dst, c.size, key[3], cfg.beta)
        c.ideal_s = ideal[key]
        sched.tasks[c.id] = c
    model.evaluations = 0
    return sched, model


def _submit_ms(tasks: list[Task], cfg: SealConfig, repeat: int) -> float:
    memo: dict[Any, Any] = {}
    out = []
    for _ in range(repeat + 1):  # the first fills the memo (the board's is kept between cycles)
        t0 = time.perf_counter()
        sched = SealScheduler(IdealMemo(_curves(), 1.0, memo), cfg, now=NOW)
        for t in tasks:
            task = Task(t.id, t.src, t.dst, t.size, t.arrival, t.klass)
            sched.submit(task)
            task.state, task.cc, task.wait_s, task.trans_s = t.state, t.cc, t.wait_s, t.trans_s
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out[1:])


def measure(live: int, running: int, config: str, scenario: str = "acting", repeat: int = 20,
            profile: bool = False) -> dict[str, Any]:
    """One scenario's numbers (see the module docstring)."""
    cfg, tasks, ideal = CONFIGS[config], board(live, running, scenario), {}
    times, evaluations, actions = [], 0, 0
    for _ in range(repeat):
        sched, model = _scheduler(tasks, cfg, ideal)
        t0 = time.perf_counter()
        acts = sched.cycle(NOW)
        times.append((time.perf_counter() - t0) * 1e3)
        evaluations, actions = model.evaluations, len(acts)
    kept = []
    for k in range(1, repeat + 1):
        t0 = time.perf_counter()
        sched.cycle(NOW + 0.5 * k)
        kept.append((time.perf_counter() - t0) * 1e3)
    row = {"live": live, "running": running, "config": config, "scenario": scenario,
           "cycle_ms": round(statistics.median(times), 3), "kept_ms": round(statistics.median(kept), 3),
           "submit_ms": round(_submit_ms(tasks, cfg, 3), 3), "evaluations": evaluations, "actions": actions}
    if profile:
        sched, _model = _scheduler(tasks, cfg, ideal)
        prof = cProfile.Profile()
        prof.runcall(sched.cycle, NOW)
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(8)
        row["profile"] = [line for line in text.getvalue().splitlines() if line.strip()][-9:]
    return row


def run(live: tuple[int, ...] = (1000, 10000), running: tuple[int, ...] = (2, 32), repeat: int = 20,
        profile: bool = False, configs: tuple[str, ...] = tuple(CONFIGS),
        scenarios: tuple[str, ...] = ("steady", "acting")) -> dict[str, Any]:
    """Every (config, scenario, live, running): ``{"rows": [...]}``."""
    return {"rows": [measure(n, r, c, s, repeat, profile) for c in configs for s in scenarios for n in live
                     for r in running]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sched_compute_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--live", default="1000,10000")
    ap.add_argument("--running", default="2,32")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--config", default=",".join(CONFIGS))
    ap.add_argument("--scenario", default="steady,acting")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--results", default=None, help="directory of the result file (default bench/results)")
    args = ap.parse_args(argv)
    from fstream_bench.core.saved import run_saved

    res = run_saved("sched-compute", list(sys.argv[1:] if argv is None else argv),
                    ("fstream_provider.tuning", "fstream_bench.scheduling.compute"),
                    lambda: run(tuple(int(x) for x in args.live.split(",")),
                                tuple(int(x) for x in args.running.split(",")), args.repeat, args.profile,
                                tuple(args.config.split(",")), tuple(args.scenario.split(","))), args.results)
    for row in res["rows"]:
        print(f"{row['config']:>13} {row['scenario']:>7} live={row['live']:>6} running={row['running']:>3}: "
              f"cycle {row['cycle_ms']:8.2f} ms  kept {row['kept_ms']:8.2f} ms  submit {row['submit_ms']:8.2f} ms  "
              f"evaluations {row['evaluations']:>6}  actions {row['actions']}")
        for line in row.get("profile", []):
            print("     ", line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
