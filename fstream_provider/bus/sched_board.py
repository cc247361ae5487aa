"""The agents' shared scheduler view on Redis: SEAL/STEAL deciding which queued job runs next, across agents.

Seed: Kettimuthu et al., "An Elegant Sufficiency" (SEAL §4, STEAL §5); the decisions are
``fstream_provider.tuning.scheduler.SealScheduler``'s, unchanged. This module is the driver the paper's
scheduler has in GridFTP's place: the board of all queued and running jobs of one namespace, shared by
every ``fstream agent --scheduler seal|steal`` on the bus (``seal-share|steal-share``: the same driver over
``fstream_provider.tuning.seal_share.SealShareScheduler``, which shares below the knee, issue 44).

- **Admission.** An agent that reads a job from the stream admits it: its task (ends, size, class,
  arrival) goes into ``sched_tasks`` and the stream entry is acknowledged *in the same transaction*, so
  a job is always either pending in the stream or on the board, never neither.
- **Decisions without a leader.** Each idle agent runs one scheduling cycle over the whole board and commits
  it in one WATCH/MULTI transaction (``plan``): it rebuilds the scheduler from the board (waits, run times,
  committed bytes, recent rates), runs ``cycle(now)`` once, takes the first task the cycle starts for
  itself, marks the tasks that start preempts, and writes all of that atomically; if any other agent changed
  the board's tasks meanwhile, the transaction fails and the cycle runs again on the new board. Two agents can never start
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
- **What a cycle reads (issue 28).** Every write to the board (admission, a decision, a requeue, a removal, a
  progress report) bumps the board's version in ``sched_version`` in its own transaction and notes there
  which task (``t:<job id>``) or progress (``p:<job id>``) changed at that version. A board keeps what it
  read (the tasks' JSON, parsed, and their progress) and a cycle asks only what changed since: an unchanged
  board costs one round trip and no task read (the change log, the model's config, one EXISTS over the
  running tasks' agents), a changed one reads the changed fields (HMGET). The whole board is read again when
  the log cannot tell (too many changes, or pruned past the board's version) and every
  ``resync_s`` in any case (a writer that did not bump, e.g. an agent of an older version, or an edit by
  hand). Jobs that end without the board knowing (cancelled while waiting, a removal lost to a Redis blip)
  are found by a sweep that reads a few job states per cycle in turn (``bus.sched_view``), and the job a cycle is
  about to start is checked first. A decision commits only if the tasks' version is still the one it read
  and each task it changes is as it read it (compared under WATCH), so a writer that did not bump cannot
  make two agents start one task either. Finished jobs are never read: the cost follows the live tasks.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from fstream_provider.bus.job_state import TERMINAL_STATES
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.sched_view import BoardView, IdealMemo, bump
from fstream_provider.tuning.sched_model import EndpointCurve, LoadModel
from fstream_provider.tuning.scheduler import Action, SealConfig, SealScheduler, Task
from fstream_provider.tuning.seal_share import SealShareScheduler

DEFAULT_CAPACITY_BPS = 10e9
DEFAULT_UNIT_BPS = 1e9
TRANSACTION_TRIES = 50
LEARN_AFTER_S = 5.0  # a task's rate says what its streams move only after its start-up
LEARN_WEIGHT = 0.05  # a cycle's observation of one stream's rate, folded into the learned one
RESYNC_S = 30.0  # the whole board is read again at least this often (+- 20 %), whatever its version says


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
    :param share: run SEAL/STEAL that shares below the knee (``tuning.seal_share.SealShareScheduler``, issue 44:
        ``fstream agent --scheduler seal-share|steal-share``) instead of the rule as written.
    :param startup_s: the model's cost of (re)starting a transfer.
    :param resync_s: the whole board is read again at least this often (± 20 %), whatever its version says.
    :param clock: monotonic seconds (for ``resync_s``; tests pass their own).
    :param rng: randomness (the resync's spread, the sweep's starting point).
    """

    def __init__(self, client: redis.Redis, keys: Keys | None = None, config: SealConfig | None = None,
                 startup_s: float = 1.0, *, resync_s: float = RESYNC_S, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None, share: bool = False) -> None:
        self.client, self.keys = client, keys or Keys()
        self.config = config or SealConfig()
        self.share = share
        self.startup_s = startup_s
        self._view = BoardView(client, self.keys, resync_s=resync_s, clock=clock, rng=rng or random.Random())
        self._ideal: dict[Any, Any] = {}  # TT_ideal by (ends, size, cap) for these curves: a cycle's costliest part
        self._lock = threading.Lock()  # plan() and its cache (the heartbeat thread uses the stateless calls)

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
        bump(pipe, self.keys, "t", [job_id])
        added, _, _ = pipe.execute()
        return bool(added)

    def report(self, job_id: str, done_bytes: float, rate_bps: float, streams: int = 0) -> None:
        """A running task's bytes moved so far, its recent rate and the TCP streams it has open (read by the
        next cycles: the concurrency a task really uses, not the cap it was given, is its load)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(self.keys.sched_progress(), job_id, json.dumps(
            {"done": float(done_bytes), "rate": float(rate_bps), "streams": int(streams), "ts": time.time()}))
        bump(pipe, self.keys, "p", [job_id])
        pipe.execute()

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
        bump(pipe, self.keys, "t", [job_id])
        pipe.execute()

    def requeue(self, job_id: str, *, done_bytes: float | None = None, preempted: bool = False) -> bool:
        """A running task stopped (preempted, or its agent stopping): back to waiting with its run time and
        committed bytes, so its xfactor counts what it already waited and ran."""

        def change(t: dict, now: float) -> dict:
            _stop(t, now)
            if done_bytes is not None:
                t["done"] = float(done_bytes)
            if preempted:
                t["preemptions"] = int(t.get("preemptions", 0)) + 1
            return t

        return self._transact_one(job_id, change, drop_progress=True)

    def cancel_preemption(self, job_id: str) -> None:
        """The task marked for preemption keeps running (its preemptor stopped before moving a byte)."""

        def change(t: dict, now: float) -> dict | None:
            if not t.get("preempt_by"):
                return None
            t["preempt_by"], t["preempt_reason"] = "", ""
            return t

        self._transact_one(job_id, change)

    # ------------------------------------------------------------------ one scheduling cycle
    def take_turn(self, agent: str, interval_s: float) -> bool:
        """Whether ``agent`` runs this turn's cycle: one idle agent per half ``interval_s``, facility-wide.

        Every idle agent computing the same schedule twice a second costs CPU in proportion to agents × live
        jobs (issue 28: 32 agents over 10,000 live jobs took both cores of the bench machine and a small job
        waited 2.3 s for its first byte); the paper runs one scheduler. A turn is a ``SET NX PX`` lease: the
        agent that gets it cycles; the others skip until it lapses, or until a cycle that started a job hands
        it on (:meth:`end_turn`) so a burst of jobs starts one after another without waiting for the lease.
        """
        return bool(self.client.set(self.keys.sched_turn(), agent, nx=True, px=max(1, int(interval_s * 500))))

    def end_turn(self, agent: str) -> None:
        """Hand the turn on at once (this agent's cycle started a job; another idle agent may start the next)."""
        self.client.eval(_END_TURN, 1, self.keys.sched_turn(), agent)

    def plan(self, agent: str, now: float | None = None) -> Decision:
        """Run one SEAL/STEAL cycle over the board for ``agent`` (idle) and apply it atomically.

        Reads what changed since the last cycle (see the module docstring); writes only when it decided
        something, compare-and-set on the tasks it changes, and only if no other task changed meanwhile.
        """
        with self._lock:
            states: dict[str, str | None] = {}  # job states read during this plan (sweep, candidates)
            for _ in range(TRANSACTION_TRIES):
                t_now = time.time() if now is None else now
                cfg, dead = self._view.refresh(states)
                decision, changed, learned = self._decide(agent, cfg, dead, states, t_now)
                if changed:
                    if not self._commit(changed, learned):
                        continue
                elif learned:  # the model's estimates only: no task changes, nothing to compare
                    self.client.hset(self.keys.sched_config(), mapping=learned)
                return decision
        raise RuntimeError(f"scheduler board {self.keys.sched_tasks()}: {TRANSACTION_TRIES} transactions in a row "
                           "lost to other agents' writes")

    def _decide(self, agent: str, cfg: dict[str, str], dead: set[str], states: dict[str, str | None],
                now: float) -> tuple[Decision, dict[str, dict | None], dict[str, str]]:
        """The cycle on the board as read: what to write (None: drop the task) and what the model learned.
        The read tasks are never changed in place (a lost transaction leaves the cache as Redis has it)."""
        tasks = self._view.tasks
        ended = {j for j, s in states.items() if j in tasks and (s is None or s in TERMINAL_STATES)}
        while True:
            decision = Decision()
            changed: dict[str, dict | None] = {j: None for j in ended}  # jobs that ended leave the board
            live = {j: t for j, t in tasks.items() if j not in ended}
            for j, t in live.items():  # running tasks of agents whose heartbeat is gone wait again
                if t["state"] == "running" and (not t["agent"] or t["agent"] in dead):
                    live[j] = changed[j] = _stop(dict(t), now)
            if not live:
                return decision, changed, {}
            sched, model = self._scheduler(live, cfg, now)
            actions = sched.cycle(now)
            decision.actions = actions
            mine = next((a for a in actions if a.kind == "start" and live[a.task]["state"] == "waiting"), None)
            if mine is not None and mine.task not in states:  # about to start it: has its job ended meanwhile?
                states[mine.task] = self.client.hget(self.keys.job(mine.task), "state")
                if states[mine.task] is None or states[mine.task] in TERMINAL_STATES:
                    ended.add(mine.task)
                    continue
            if mine is not None:
                t = live[mine.task] = changed[mine.task] = dict(live[mine.task])
                t.update(state="running", agent=agent, cc=mine.cc, started=now, preempt_by="", preempt_reason="")
                decision.job_id, decision.entry_id, decision.cc, decision.reason = (
                    mine.task, t.get("entry", ""), mine.cc, mine.reason)
                for a in actions:
                    v = live.get(a.task)
                    if (a.kind == "preempt" and a.by == mine.task and v is not None and v["state"] == "running"
                            and not v.get("preempt_by")):
                        live[a.task] = changed[a.task] = {**v, "preempt_by": mine.task, "preempt_reason": a.reason}
                        decision.preempted.append((a.task, a.reason))
            for a in actions:
                if (a.kind == "resize" and a.task in live and live[a.task]["state"] == "running"
                        and live[a.task]["cc"] != a.cc):
                    live[a.task] = changed[a.task] = {**live[a.task], "cc": a.cc}
                    decision.resized.append(a)
            learned = _learned(model, self._view.progress, live, now)
            return decision, changed, {k: v for k, v in learned.items() if _moved(cfg.get(k), v)}

    # ------------------------------------------------------------------ what a cycle writes
    def _commit(self, changed: dict[str, dict | None], learned: dict[str, str]) -> bool:
        """Write a cycle's decisions if the board is still the one it decided on: under WATCH of the tasks, the
        tasks' version is the one read and each changed task is as read (a writer that did not bump the version
        is caught too). False: the cache is updated from what was found, decide again."""
        k, view = self.keys, self._view
        key, ids = k.sched_tasks(), sorted(changed)
        new = {j: json.dumps(t) for j, t in changed.items() if t is not None}
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)
                top, tasks_version = pipe.zmscore(k.sched_version(), ["#", "#t"])
                found = pipe.hmget(key, ids)
                stale = [(j, raw) for j, raw in zip(ids, found) if raw != view.raw.get(j)]
                if stale or tasks_version != view.tasks_version:
                    for j, raw in stale:
                        view.set_task(j, raw)
                    if (top or 0) < view.version or tasks_version is None or view.tasks_version is None \
                            or tasks_version < view.tasks_version:
                        view.resync_at = -math.inf  # the log was reset or went back: read the whole board
                    return False
                pipe.multi()
                for j in ids:
                    if j in new:
                        pipe.hset(key, j, new[j])
                    else:
                        pipe.hdel(key, j)
                        pipe.hdel(k.sched_progress(), j)
                bump(pipe, self.keys, "t", ids)
                if learned:
                    pipe.hset(k.sched_config(), mapping=learned)
                pipe.execute()
            except redis.WatchError:
                return False
        for j in ids:
            view.set_task(j, new.get(j))
        return True

    def _transact_one(self, job_id: str, change: Callable[[dict, float], dict | None], *,
                      drop_progress: bool = False) -> bool:
        """Change one task under WATCH (reads that task only); True if it was on the board and changed."""
        key = self.keys.sched_tasks()
        for _ in range(TRANSACTION_TRIES):
            with self.client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(key)
                    raw = pipe.hget(key, job_id)
                    t = change(json.loads(raw), time.time()) if raw else None
                    if t is None and not drop_progress:
                        return False
                    pipe.multi()
                    if t is not None:
                        pipe.hset(key, job_id, json.dumps(t))
                    if drop_progress:
                        pipe.hdel(self.keys.sched_progress(), job_id)
                    bump(pipe, self.keys, "t" if t is not None else "p", [job_id])
                    pipe.execute()
                    return t is not None
                except redis.WatchError:
                    continue
        raise RuntimeError(f"scheduler board {key}: {TRANSACTION_TRIES} transactions in a row lost to other "
                           "agents' writes")

    def _scheduler(self, tasks: dict[str, dict], cfg: dict[str, str], now: float) -> tuple[SealScheduler, LoadModel]:
        prog = self._view.progress
        ends = {t["src"] for t in tasks.values()} | {t["dst"] for t in tasks.values()}
        curves = {e: EndpointCurve(float(cfg.get(f"cap:{e}", DEFAULT_CAPACITY_BPS)), _unit(cfg, e)) for e in ends}
        if len(self._ideal) > 4 * len(tasks) + 256 or self._ideal.get("model") != (curves, self.startup_s):
            self._ideal.clear()  # kept while the ends' curves are the same (and bounded by the board's size)
            self._ideal["model"] = (curves, self.startup_s)
        model = IdealMemo(curves, self.startup_s, self._ideal)
        for name, value in cfg.items():
            if name.startswith("ratio:"):
                src, _, dst = name[len("ratio:"):].partition("|")
                model.set_correction(src, dst, float(value))
        rule = SealShareScheduler if self.share else SealScheduler
        sched = rule(model, self.config, now=now)  # the waits and run times below are up to ``now``
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
        return sched, model


_END_TURN = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


def _moved(old: str | None, new: str) -> bool:
    """A learned value worth writing: new, or changed by more than rounding."""
    return old is None or abs(float(new) - float(old)) > 1e-9 * max(abs(float(old)), 1e-300)


def _stop(t: dict, now: float) -> dict:
    """A running task back to waiting: its run time so far kept, its agent and preemption mark cleared."""
    if t["state"] == "running" and t.get("started"):
        t["ran_s"] = float(t.get("ran_s", 0.0)) + max(0.0, now - float(t["started"]))
    t.update(state="waiting", agent="", cc=0, started=0.0, preempt_by="", preempt_reason="")
    return t


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
