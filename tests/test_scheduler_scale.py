"""SEAL/STEAL at scale: the cycle's cached sums and memoized predictions decide exactly what the plain
computation decided (seeded workloads replayed against a frozen record), and a cycle's model evaluations
do not grow with the waiting tasks.

The record (``tests/data/scheduler_replay.json``) holds every action (kind, task, cc, by, reason) and a
digest of every task's state and xfactor after every cycle, written by the scheduler before its per-cycle
caches existed. Regenerate it only for an intended change of decisions:
``python tests/test_scheduler_scale.py --record``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
from pathlib import Path

import pytest

from fstream_provider.tuning.sched_model import EndpointCurve, LoadModel
from fstream_provider.tuning.scheduler import SealConfig, SealScheduler, Task
from fstream_bench.scheduling.compute import Counting  # the same evaluation counter the bench uses

RECORD = Path(__file__).parent / "data" / "scheduler_replay.json"
ENDS = {"a": 10e9, "b": 5e9, "c": 2e9, "d": 1e9}
PAIRS = [("a", "b"), ("a", "c"), ("a", "d"), ("b", "c"), ("c", "d"), ("b", "a"), ("d", "d")]  # d->d: one host
CONFIGS = {
    "seal": {},
    "seal-printed": dict(preempt_guard_s=0, aggregate_gain=False, max_total_cc=12, pf=1.2),
    "steal-agents": dict(steal=True, small_s=1.0, resize_running=False),  # as worker.Agent.run builds it
    "steal-printed": dict(steal=True, lambda_=0.8, small_preempts_batch=True, batch_goal_share=1.0,
                          preempt_guard_s=0, promote_after_s=20.0, max_total_cc=16, small_bytes=2e8),
    "steal-resize": dict(steal=True, lambda_=0.5, preempt_guard_s=5.0),
}
ARRIVALS = {"steal-resize": (0, 0, 0, 1)}  # tasks a step (one drawn): light enough for the ends to have room
RUNS = [(cfg, seed, fresh) for cfg in CONFIGS for seed in (0, 1, 2) for fresh in (False, True)
        if not fresh or cfg.startswith("steal")]
STEPS = 200


def _model() -> LoadModel:
    return LoadModel({e: EndpointCurve(c, unit_bps=1e9, overload=0.1) for e, c in ENDS.items()}, startup_s=1.0)


def _digest(sched: SealScheduler) -> str:
    state = [(t.id, t.state, t.klass, t.cc, t.xfactor, t.wait_s, t.trans_s, t.preemptions)
             for t in sched.tasks.values()]
    state.append(sorted(sched.model.corrections().items()))
    return hashlib.sha256(repr(state).encode()).hexdigest()[:16]


def _rebuilt(sched: SealScheduler, model: LoadModel, cfg: SealConfig, now: float) -> SealScheduler:
    """A new scheduler over copies of the tasks, as the agents' board builds one for every cycle."""
    new = SealScheduler(model, cfg, now=now)
    for t in sched.tasks.values():
        c = dataclasses.replace(t)
        new.submit(c)
        c.state, c.cc = t.state, t.cc
    return new


def replay(config: str, seed: int, fresh: bool = False, steps: int = STEPS) -> list[list]:
    """Submits, progress, cancellations and cycles drawn from ``seed``; every cycle's actions and digest."""
    rng = random.Random(seed)
    truth, model, cfg = _model(), _model(), SealConfig(**CONFIGS[config])
    sched, n, out = SealScheduler(model, cfg), 0, []
    for step in range(steps):
        now = step * 0.5
        for _ in range(rng.choice(ARRIVALS.get(config, (0, 0, 1, 1, 2)))):
            src, dst = rng.choice(PAIRS)
            size = 10 ** rng.uniform(6, 10.7)
            klass = "batch" if rng.random() < 0.5 else "interactive"
            sched.submit(Task(f"t{n}", src, dst, size, arrival=now - rng.choice((0.0, 0.0, rng.uniform(0, 0.5))),
                              klass=klass))
            n += 1
        load: dict[str, int] = {}
        running = [t for t in sched.tasks.values() if t.state == "running"]
        for t in running:
            for e in {t.src, t.dst}:
                load[e] = load.get(e, 0) + t.cc
        for t in running:
            rate = truth.throughput(t.src, t.dst, t.cc, load[t.src] - t.cc, load[t.dst] - t.cc, corrected=False)
            rate *= 0.0 if rng.random() < 0.05 else rng.uniform(0.5, 1.1)
            done = min(t.size, t.done_bytes + rate * 0.5 / 8)
            sched.progress(t.id, done, rate)
            if done >= t.size:
                sched.finished(t.id)
        waiting = [t for t in sched.tasks.values() if t.state == "waiting"]
        if waiting and rng.random() < 0.05:
            sched.finished(rng.choice(waiting).id)  # cancelled while it waited
        if fresh and step:
            sched = _rebuilt(sched, model, cfg, now - 0.5)
        acts = sched.cycle(now)
        out.append([step, [[a.kind, a.task, a.cc, a.by, a.reason] for a in acts], _digest(sched)])
    return out


def _key(config: str, seed: int) -> str:
    return f"{config}/{seed}"


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text())


@pytest.mark.parametrize("config,seed,fresh", RUNS,
                         ids=[f"{_key(c, s)}/{'rebuilt' if f else 'kept'}" for c, s, f in RUNS])
def test_every_action_and_xfactor_is_the_recorded_ones(record, config, seed, fresh):
    """Kept (one scheduler for the run) and rebuilt (a new one every cycle, as the board does) alike."""
    want = record[_key(config, seed)]
    got = replay(config, seed, fresh)
    for w, g in zip(want, got):
        assert g[1] == w[1], f"step {w[0]}: actions differ"
        assert g[2] == w[2], f"step {w[0]}: task states or xfactors differ"
    assert len(got) == len(want)


def test_the_record_exercises_every_kind_of_decision(record):
    reasons = [a[4] for run in record.values() for _step, acts, _d in run for a in acts]
    kinds = {a[0] for run in record.values() for _step, acts, _d in run for a in acts}
    assert kinds == {"start", "preempt", "resize"}
    for phrase in ("neither end saturated", "small task", "saturated; preempted", "batch: both ends below",
                   "preempted 1 batch task(s)", "interactive task needs the bandwidth", ">= pf=", "nothing waits",
                   "no interactive task waits"):
        assert any(phrase in r for r in reasons), phrase


def _board(waiting: int, running: int, cfg: SealConfig) -> tuple[SealScheduler, Counting]:
    """``running`` interactive tasks from ``a`` to ``b`` and ``c`` moving 80 % of ``a``'s maximum (below
    saturation (a): every waiting task's ends go through the link test (b)) and ``waiting`` tasks behind them,
    one in fifty interactive (the board of idle agents behind busy ones)."""
    model = Counting({e: EndpointCurve(c, unit_bps=1e9, overload=0.1) for e, c in ENDS.items()}, startup_s=1.0)
    sched = SealScheduler(model, cfg)
    rng = random.Random(7)
    for i in range(running):
        src, dst = PAIRS[i % 2]
        t = Task(f"r{i}", src, dst, 500e9, arrival=0.0)
        sched.submit(t)
        t.state, t.cc, t.rate_bps, t.trans_s, t.done_bytes = "running", 2, 0.8 * 10e9 / running, 10.0, 1e9
    for i in range(waiting):
        src, dst = rng.choice(PAIRS[:2])
        sched.submit(Task(f"w{i}", src, dst, 10 ** rng.uniform(9.5, 11), arrival=rng.uniform(0, 5),
                          klass="interactive" if i % 50 == 0 else "batch"))
    model.evaluations = 0
    return sched, model


@pytest.mark.parametrize("cfg", [SealConfig(steal=True, small_s=1.0, resize_running=False), SealConfig()],
                         ids=["steal-agents", "seal"])
def test_a_cycles_model_evaluations_do_not_grow_with_the_waiting_tasks(cfg):
    counts = {}
    for waiting in (200, 2000):
        sched, model = _board(waiting, 8, cfg)
        sched.cycle(10.0)
        counts[waiting] = model.evaluations
    assert counts[2000] <= counts[200] * 10  # at most linear in the live tasks ...
    assert counts[2000] <= 2 * counts[200]  # ... and in fact memoized per pair and load, not per task


def _record() -> None:
    RECORD.parent.mkdir(exist_ok=True)
    runs = {_key(c, s): replay(c, s) for c, s, fresh in RUNS if not fresh}
    RECORD.write_text(json.dumps(runs, separators=(",", ":")) + "\n")
    print(f"wrote {RECORD} ({RECORD.stat().st_size} bytes)")


if __name__ == "__main__":
    if sys.argv[1:] == ["--record"]:
        _record()
