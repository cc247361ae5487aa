"""The agents' shared scheduler view on Redis: SEAL/STEAL deciding which queued job runs next, across agents.

Seed: Kettimuthu et al., "An Elegant Sufficiency" (SEAL §4, STEAL §5); the decisions are
``fstream_provider.tuning.scheduler.SealScheduler``'s, unchanged. This module is the driver the paper's
scheduler has in GridFTP's place: the board of all queued and running jobs of one namespace, shared by
every ``fstream agent --scheduler seal|steal`` on the bus.

- **Admission.** An agent that reads a job from the stream admits it: its task (ends, size, class,
  arrival) goes into ``sched_tasks`` and the stream entry is acknowledged *in the same transaction*, so
  a job is always either pending in the stream or on the board, never neither.
- **Decisions without a leader.** Each idle agent runs one scheduling cycle over the whole board inside a
  WATCH/MULTI transaction (``plan``): it rebuilds the scheduler from the board (waits, run times, committed
  bytes, recent rates), runs ``cycle(now)`` once, takes the first task the cycle starts for itself, marks
  the tasks that start preempts, and writes all of that atomically; if any other agent changed the board
  meanwhile, the transaction fails and the cycle runs again on the new board. Two agents can never start
  one task; an agent that dies decides nothing and its running tasks go back to waiting at the next cycle
  (its heartbeat key is gone). Why not a leader: ``docs/scheduling.md``.
- **Preemption (§4.3, §4.5).** A task marked ``preempt_by`` keeps running until its preemptor moved bytes,
  then its agent stops it at its checkpoint (committed ranges stay at the receiver) and ``requeue`` puts
  it back as waiting with its run time; it resumes where it stopped when a later cycle picks it.
- **Concurrency is streams.** The model's unit is one TCP stream (``unit:``); a running task's load is the
  streams it reports moving data (``jobrun.busy_streams``), not the cap it was given (its tuner and the
  stream pool may open fewer, and a transfer on its last file moves on one channel).
- **The model (§4.2).** Each endpoint's known maximum (``cap:``) and one stream's rate (``unit:``) come from
  ``fstream schedule set`` or the defaults; the maximum is raised when running tasks are seen moving more
  in aggregate (history's "known maximum"), one stream's rate is lowered to what the agents' streams are
  seen moving (``unit_seen:``), and the correction from recent transfers is kept per pair.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from fstream_provider.bus.keys import Keys
from fstream_provider.tuning.sched_model import EndpointCurve, LoadModel
from fstream_provider.tuning.scheduler import Action, SealConfig, SealScheduler, Task

DEFAULT_CAPACITY_BPS = 10e9
DEFAULT_UNIT_BPS = 1e9
TRANSACTION_TRIES = 50
LEARN_AFTER_S = 5.0  # a task's rate says what its streams move only after its start-up
LEARN_WEIGHT = 0.05  # a cycle's observation of one stream's rate, folded into the learned one


@dataclass
class Decision:
    """What one scheduling cycle decided for the agent that ran it.

    :param job_id: the job this agent starts (None: nothing for it now).
    :param cc: the concurrency the scheduler gives it.
    :param reason: the scheduler's reason for starting it.
    :param preempted: ``(job id, reason)`` of each task marked to stop for it.
    :param actions: every action of the cycle (for the log).
    :param resized: the resizes this cycle wrote (a running task's concurrency in the model changed).
    """

    job_id: str | None = None
    entry_id: str = ""
    cc: int = 0
    reason: str = ""
    preempted: list[tuple[str, str]] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    resized: list[Action] = field(default_factory=list)


class SchedBoard:
    """The shared view of one namespace's queued and running jobs (see the module docstring).

    :param client: ``redis.Redis`` with ``decode_responses=True``.
    :param keys: the key schema.
    :param config: SEAL/STEAL parameters (``config.steal`` selects STEAL).
    :param startup_s: the model's cost of (re)starting a transfer.
    """

    def __init__(self, client: redis.Redis, keys: Keys | None = None, config: SealConfig | None = None,
                 startup_s: float = 1.0) -> None:
        self.client, self.keys = client, keys or Keys()
        self.config = config or SealConfig()
        self.startup_s = startup_s

    # ------------------------------------------------------------------ admission and progress
    def admit(self, job_id: str, entry_id: str, *, src: str, dst: str, size: float, klass: str,
              arrival: float) -> bool:
        """Put a job read from the stream on the board and acknowledge its entry, atomically.

        Returns False when the job was already on the board (the entry is acknowledged all the same).
        """
        task = {"src": src, "dst": dst, "size": float(size), "klass": klass, "arrival": float(arrival),
                "entry": entry_id, "state": "waiting", "agent": "", "cc": 0, "started": 0.0, "ran_s": 0.0,
                "done": 0.0, "preemptions": 0, "preempt_by": "", "preempt_reason": ""}
        k = self.keys
        pipe = self.client.pipeline(transaction=True)
        pipe.hsetnx(k.sched_tasks(), job_id, json.dumps(task))
        pipe.xack(k.jobs_stream(), k.jobs_group(), entry_id)
        added, _ = pipe.execute()
        return bool(added)

    def report(self, job_id: str, done_bytes: float, rate_bps: float, streams: int = 0) -> None:
        """A running task's bytes moved so far, its recent rate and the TCP streams it has open (read by the
        next cycles: the concurrency a task really uses, not the cap it was given, is its load)."""
        self.client.hset(self.keys.sched_progress(), job_id, json.dumps(
            {"done": float(done_bytes), "rate": float(rate_bps), "streams": int(streams), "ts": time.time()}))

    def task(self, job_id: str) -> dict | None:
        raw = self.client.hget(self.keys.sched_tasks(), job_id)
        return json.loads(raw) if raw else None

    def progress(self, job_id: str) -> dict | None:
        raw = self.client.hget(self.keys.sched_progress(), job_id)
        return json.loads(raw) if raw else None

    def tasks(self) -> dict[str, dict]:
        """Every task on the board, with its live progress under ``progress``."""
        tasks = {j: json.loads(v) for j, v in self.client.hgetall(self.keys.sched_tasks()).items()}
        prog = {j: json.loads(v) for j, v in self.client.hgetall(self.keys.sched_progress()).items()}
        for j, t in tasks.items():
            t["progress"] = prog.get(j)
        return tasks

    # ------------------------------------------------------------------ a task's end on an agent
    def remove(self, job_id: str) -> None:
        """The job ended (any terminal state): off the board."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hdel(self.keys.sched_tasks(), job_id)
        pipe.hdel(self.keys.sched_progress(), job_id)
        pipe.execute()

    def requeue(self, job_id: str, *, done_bytes: float | None = None, preempted: bool = False) -> bool:
        """A running task stopped (preempted, or its agent stopping): back to waiting with its run time and
        committed bytes, so its xfactor counts what it already waited and ran."""

        def change(tasks: dict[str, dict], now: float) -> dict[str, dict]:
            t = tasks.get(job_id)
            if t is None:
                return {}
            _stop(t, now)
            if done_bytes is not None:
                t["done"] = float(done_bytes)
            if preempted:
                t["preemptions"] = int(t.get("preemptions", 0)) + 1
            return {job_id: t}

        return bool(self._transact(change, drop_progress=[job_id]))

    def cancel_preemption(self, job_id: str) -> None:
        """The task marked for preemption keeps running (its preemptor stopped before moving a byte)."""

        def change(tasks: dict[str, dict], now: float) -> dict[str, dict]:
            t = tasks.get(job_id)
            if t is None or not t.get("preempt_by"):
                return {}
            t["preempt_by"], t["preempt_reason"] = "", ""
            return {job_id: t}

        self._transact(change)

    # ------------------------------------------------------------------ one scheduling cycle
    def plan(self, agent: str, now: float | None = None) -> Decision:
        """Run one SEAL/STEAL cycle over the board for ``agent`` (idle) and apply it atomically."""
        decision = Decision()
        learned: dict[str, str] = {}  # what the committed cycle learned for the next ones (sched_config)

        def change(tasks: dict[str, dict], t_now: float) -> dict[str, dict]:
            decision.__init__()
            learned.clear()
            changed: dict[str, dict] = {}
            self._drop_finished(tasks, changed)
            self._requeue_orphans(tasks, changed, t_now)
            live = {j: t for j, t in tasks.items() if t is not None}
            if not live:
                return changed
            sched, model, prog = self._scheduler(live, t_now)
            actions = sched.cycle(t_now)
            decision.actions = actions
            mine = next((a for a in actions if a.kind == "start" and live[a.task]["state"] == "waiting"), None)
            if mine is not None:
                t = live[mine.task]
                t.update(state="running", agent=agent, cc=mine.cc, started=t_now, preempt_by="", preempt_reason="")
                changed[mine.task] = t
                decision.job_id, decision.entry_id, decision.cc, decision.reason = (
                    mine.task, t.get("entry", ""), mine.cc, mine.reason)
                for a in actions:
                    v = live.get(a.task)
                    if (a.kind == "preempt" and a.by == mine.task and v is not None and v["state"] == "running"
                            and not v.get("preempt_by")):
                        v.update(preempt_by=mine.task, preempt_reason=a.reason)
                        changed[a.task] = v
                        decision.preempted.append((a.task, a.reason))
            for a in actions:
                if (a.kind == "resize" and a.task in live and live[a.task]["state"] == "running"
                        and live[a.task]["cc"] != a.cc):
                    live[a.task]["cc"] = a.cc
                    changed[a.task] = live[a.task]
                    decision.resized.append(a)
            learned.update(_learned(model, prog, live, t_now))
            return changed

        self._transact(change, now=now,
                       extra=lambda pipe: pipe.hset(self.keys.sched_config(), mapping=learned) if learned else None)
        return decision

    # ------------------------------------------------------------------ internals
    def _transact(self, change: Any, *, now: float | None = None, drop_progress: list[str] = (),
                  extra: Any = None) -> dict[str, dict]:
        key = self.keys.sched_tasks()
        for _ in range(TRANSACTION_TRIES):
            with self.client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(key)
                    tasks = {j: json.loads(v) for j, v in pipe.hgetall(key).items()}
                    changed = change(tasks, time.time() if now is None else now)
                    pipe.multi()
                    for j, t in changed.items():
                        if t is None:
                            pipe.hdel(key, j)
                            pipe.hdel(self.keys.sched_progress(), j)
                        else:
                            pipe.hset(key, j, json.dumps(t))
                    for j in drop_progress:
                        pipe.hdel(self.keys.sched_progress(), j)
                    if extra is not None:
                        extra(pipe)
                    pipe.execute()
                    return changed
                except redis.WatchError:
                    continue
        raise RuntimeError(f"scheduler board {key}: {TRANSACTION_TRIES} transactions in a row lost to other "
                           "agents' writes")

    def _drop_finished(self, tasks: dict[str, dict], changed: dict[str, dict]) -> None:
        """Tasks whose job ended meanwhile (cancelled while queued, expired, or an agent's removal lost to a
        Redis blip) leave the board."""
        ids = list(tasks)
        if not ids:
            return
        pipe = self.client.pipeline(transaction=False)
        for j in ids:
            pipe.hget(self.keys.job(j), "state")
        for j, state in zip(ids, pipe.execute()):
            if state in (None, "succeeded", "failed", "cancelled"):
                tasks[j] = None
                changed[j] = None

    def _requeue_orphans(self, tasks: dict[str, dict], changed: dict[str, dict], now: float) -> None:
        """Running tasks of agents whose heartbeat is gone go back to waiting (the claim fences the dead one)."""
        agents = {t["agent"] for t in tasks.values() if t is not None and t["state"] == "running" and t["agent"]}
        if not agents:
            return
        pipe = self.client.pipeline(transaction=False)
        for a in sorted(agents):
            pipe.exists(self.keys.agent(a))
        alive = {a for a, e in zip(sorted(agents), pipe.execute()) if e}
        for j, t in tasks.items():
            if t is not None and t["state"] == "running" and t["agent"] not in alive:
                _stop(t, now)
                changed[j] = t

    def _scheduler(self, tasks: dict[str, dict], now: float) -> tuple[SealScheduler, LoadModel, dict]:
        cfg = self.client.hgetall(self.keys.sched_config())
        prog = {j: json.loads(v) for j, v in self.client.hgetall(self.keys.sched_progress()).items()}
        ends = {t["src"] for t in tasks.values()} | {t["dst"] for t in tasks.values()}
        curves = {e: EndpointCurve(float(cfg.get(f"cap:{e}", DEFAULT_CAPACITY_BPS)), _unit(cfg, e)) for e in ends}
        model = LoadModel(curves, startup_s=self.startup_s)
        for name, value in cfg.items():
            if name.startswith("ratio:"):
                src, _, dst = name[len("ratio:"):].partition("|")
                model.set_correction(src, dst, float(value))
        sched = SealScheduler(model, self.config, now=now)  # the waits and run times below are up to ``now``
        for j, t in tasks.items():
            task = Task(j, t["src"], t["dst"], max(1.0, float(t["size"])), float(t["arrival"]), t["klass"])
            sched.submit(task)  # computes TT_ideal
            ran = float(t.get("ran_s", 0.0))
            p = prog.get(j) or {}
            task.preemptions = int(t.get("preemptions", 0))
            if t["state"] == "running":
                # the streams it has open, once it reported them: its tuner (and the pool) may use fewer than
                # the cap the cycle gave, and a task on 4 streams does not saturate a path that takes 7
                task.state, task.cc = "running", max(1, int(p.get("streams") or t.get("cc") or 1))
                task.trans_s = ran + max(0.0, now - float(t["started"]))
                task.run_start = ran
                task.wait_s = max(0.0, float(t["started"]) - float(t["arrival"]) - ran)
                task.done_bytes = max(float(t.get("done", 0.0)), float(p.get("done", 0.0)))
                task.rate_bps = float(p.get("rate", 0.0))
            else:
                task.trans_s = ran
                task.wait_s = max(0.0, now - float(t["arrival"]) - ran)
                task.done_bytes = float(t.get("done", 0.0))
        return sched, model, prog


def _stop(t: dict, now: float) -> None:
    """A running task back to waiting: its run time so far kept, its agent and preemption mark cleared."""
    if t["state"] == "running" and t.get("started"):
        t["ran_s"] = float(t.get("ran_s", 0.0)) + max(0.0, now - float(t["started"]))
    t.update(state="waiting", agent="", cc=0, started=0.0, preempt_by="", preempt_reason="")


def _unit(cfg: dict[str, str], endpoint: str) -> float:
    """One stream's rate at an endpoint: the configured one, or less when the agents' streams were seen
    moving less (``unit_seen:``, learned by ``_learned``)."""
    unit = float(cfg.get(f"unit:{endpoint}", DEFAULT_UNIT_BPS))
    seen = cfg.get(f"unit_seen:{endpoint}")
    return min(unit, float(seen)) if seen else unit


def _learned(model: LoadModel, prog: dict, tasks: dict[str, dict], now: float) -> dict[str, str]:
    """What this cycle learned for the next ones (§4.2, history corrected by recent transfers):

    - each endpoint's maximum raised to what its running tasks move in aggregate (the "known maximum"),
      once all of them are past their start-up;
    - one stream's rate (``unit_seen:``) from the agents' own streams: rate over streams of tasks past
      their start-up (``LEARN_AFTER_S``), while the endpoint is below its maximum (at the maximum, streams
      share it and say nothing about one stream), folded in with weight ``LEARN_WEIGHT`` per cycle. The
      configured unit (an ``iperf3`` stream) can be more than an agent's stream moves; the knee of the
      curve, and with it saturation test (b), then sits at too few streams;
    - the per-pair correction.
    """
    out: dict[str, str] = {}
    agg: dict[str, float] = {}
    steady: dict[str, list[float]] = {}  # endpoint -> [rate, streams, tasks] of tasks past their start-up
    everyone_steady: dict[str, bool] = {}
    for j, t in tasks.items():
        if t["state"] == "running":
            p = prog.get(j) or {}
            rate = float(p.get("rate", 0.0))
            past = now - float(t.get("started") or now) >= LEARN_AFTER_S
            for e in (t["src"], t["dst"]):
                agg[e] = agg.get(e, 0.0) + rate
                everyone_steady[e] = everyone_steady.get(e, True) and past
                if int(p.get("streams") or 0) > 0 and past:
                    r, n = steady.get(e, [0.0, 0.0])
                    steady[e] = [r + rate, n + int(p["streams"])]
    for e, bps in agg.items():
        curve = model.curve(e)
        # a start-up's first intervals fill socket buffers and report rates the path never sustains
        if bps > curve.capacity_bps and everyone_steady[e]:
            out[f"cap:{e}"] = repr(bps)
        rate, streams = steady.get(e, (0.0, 0))
        if streams and 0 < bps < 0.9 * curve.capacity_bps:
            unit = (1 - LEARN_WEIGHT) * curve.unit_bps + LEARN_WEIGHT * rate / streams
            out[f"unit_seen:{e}"] = repr(unit)
    for (src, dst), ratio in model.corrections().items():
        out[f"ratio:{src}|{dst}"] = repr(ratio)
    return out
