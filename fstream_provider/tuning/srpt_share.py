"""Shortest remaining first when an endpoint saturates, processor sharing below it (issue 44; SEAL §4.3-4.4, §6).

SEAL (``scheduler.SealScheduler``) orders waiting tasks by xfactor and makes a task that is not small wait on a
saturated endpoint; ``seal_share`` admits it below the knee. Both still lose most of what ordering can win at
ordinary load (BENCHMARKS §10.1b): the idealized SRPT (``sched_srpt``) is 8-25 % below the best baseline at 25-60 %
load, seal-share 3-11 %. This rule is the SRPT/PS hybrid issue 44 asks for, built from what an FStream transfer can
do cheaply: changing a running task's concurrency costs nothing (``Action('resize')``), a start costs one
start-up (``LoadModel.startup_s``), a preemption a restart; so it never preempts.

Every cycle, interactive tasks first, then batch tasks, each class by **remaining time alone** (bytes left at the rate
FindThrCC gives the task on an idle path; SRPT's order):

- a task that moves bytes takes the concurrency it would use alone (FindThrCC, capped at ``single_bytes``) while
  the streams of the tasks before it leave room at both its ends, up to each end's knee
  (``EndpointCurve.knee``; batch tasks: ``lambda_`` of it); past that it keeps one stream (a resize, never a stop:
  stopping would cost it a restart);
- a waiting task starts, with what is left (at least one stream), whenever the moving tasks before it leave a stream
  at both its ends: below the knee every task runs (processor sharing), past it the shortest take the endpoint; a
  task of one stream (at or below ``single_bytes``) starts in any case, as SEAL starts small tasks (§4.4);
- a task still starting (less than ``startup_s`` since it started) holds its streams but counts for nothing: it
  moves no bytes until it is connected. (Counting it as starting while its reported rate is still 0, up to 4
  start-ups, cost 1 point at 45 % and 60 % in the replay, whose rates lag a start by a step: not done. A connect
  slower than ``startup_s`` counts its streams early, which holds the others back, never overloads.) Counted
  (the ablation switch ``count_starting``), the 1 s start-ups of the 10 MB-1 GB tasks hold streams that move
  nothing, and at 45 % load the rule is worse than the best baseline on some traces (BENCHMARKS §10.1b);
- starting and moving tasks together stop new starts at ``start_limit`` knees (2): in an overloaded burst every
  waiting task would start in one cycle, and when they connect the ends run far past their knee, where each stream
  lowers what all move. Against the best baseline, 2 knees took srpt-share from −86 % to −91/−92 % and from
  −71 % to −78 % on three 60 %-HV traces and from −74 % to −78 % on a 45 % trace whose burst took basecc1 to 11;
  other runs moved by 0-2 points, none for the worse (9 seeds).

The load estimate is the board's own: the streams of the moving tasks at each end. Every decision carries its
reason. Selectable beside SEAL as written and seal-share (``sched_sim.make_scheduler('srpt-share')``); ``order=
'xfactor'`` walks SEAL's expected-slowdown order instead of SRPT's (ablation).
"""

from __future__ import annotations

from fstream_provider.tuning.sched_model import LoadModel
from fstream_provider.tuning.scheduler import Action, SealConfig, SealScheduler, Task

ORDERS = ("remaining", "xfactor")


class SrptShareScheduler(SealScheduler):
    """The hybrid above, over SEAL's model, tasks and reports (``submit``, ``progress``, ``finished``).

    :param count_starting: count a starting task's streams against its ends (ablation; off is the rule).
    :param order: ``remaining`` (SRPT) or ``xfactor`` (SEAL's order, highest first; ablation).
    :param start_limit: no task of more than one stream starts while the streams at one of its ends, starting ones
        included, reach this many knees; a start gets at most what is left below it.
    """

    def __init__(self, model: LoadModel, config: SealConfig | None = None, now: float = 0.0, *,
                 count_starting: bool = False, order: str = "remaining", start_limit: float = 2.0) -> None:
        if order not in ORDERS:
            raise ValueError(f"srpt-share order {order!r}: expected one of {', '.join(ORDERS)}")
        if not start_limit >= 1:
            raise ValueError(f"srpt-share start_limit {start_limit!r}: expected at least 1 (knees)")
        super().__init__(model, config, now)
        self.count_starting, self.order, self.start_limit = count_starting, order, start_limit

    @property
    def name(self) -> str:
        return "srpt-share" + ("+count-starting" if self.count_starting else "") + (
            "" if self.order == "remaining" else "+" + self.order)

    def cycle(self, now: float) -> list[Action]:
        dt, self._last = max(0.0, now - self._last), now
        self._fresh, self._thr_cache = {}, {}
        self.tasks = {k: t for k, t in self.tasks.items() if t.state != "done"}
        for t in self.tasks.values():
            if t.state == "waiting":
                t.wait_s += dt if t.arrival <= now - dt else max(0.0, now - t.arrival)
                if t.klass == "batch" and self.cfg.promote_after_s is not None and \
                        now - t.arrival >= self.cfg.promote_after_s:
                    t.klass = "interactive"
            elif t.state == "running":
                t.trans_s += dt
        self._run = [t for t in self.tasks.values() if t.state == "running"]
        self._touch()
        for t in self._run:  # §4.2: recent transfers correct the history's model, as SEAL's cycle does
            if t.rate_bps > 0:
                predicted = self.model.throughput(t.src, t.dst, t.cc, self._load(t.src, t), self._load(t.dst, t),
                                                  corrected=False)
                self.model.observe(t.src, t.dst, predicted, t.rate_bps)
        used: dict[str, float] = {}  # streams of the tasks placed so far that move bytes, per end
        held: dict[str, float] = {}  # ... and of those starting too
        actions: list[Action] = []
        for t in sorted(self.tasks.values(), key=self._priority):
            actions += self._place(t, used, held)
        self._touch()
        return actions

    def _priority(self, t: Task) -> tuple:
        if self.order == "xfactor":
            t.xfactor = self._xfactor(t)
            return t.klass == "batch", -t.xfactor
        return t.klass == "batch", self._remaining_s(t)

    def _remaining_s(self, t: Task) -> float:
        """Bytes left at the task's rate alone (FindThrCC on an idle path, uncorrected)."""
        rate = self._find_thr_cc(t, True)[1]
        return t.left * 8 / rate if rate > 0 else float("inf")

    def _starting(self, t: Task) -> bool:
        return t.trans_s - t.run_start < self.model.startup_s - 1e-9

    def _place(self, t: Task, used: dict[str, float], held: dict[str, float]) -> list[Action]:
        share = self.cfg.lambda_ if t.klass == "batch" else 1.0
        room = min(min(self.model.curve(h).knee * share, self.cfg.max_total_cc) - used.get(h, 0.0)
                   for h in (t.src, t.dst))
        want = self._find_thr_cc(t, True)[0]
        cc = max(1, min(want, int(room)))
        where = f"{t.src} {used.get(t.src, 0.0):g}, {t.dst} {used.get(t.dst, 0.0):g} streams moving before it"
        out: list[Action] = []
        if t.state == "waiting":
            below = min(self.model.curve(h).knee * self.start_limit - held.get(h, 0.0) for h in (t.src, t.dst))
            if t.size > self.cfg.single_bytes and (room < 1 or below < 1):
                return out  # held: shorter tasks fill its ends past the knee, or enough are starting (§4.4: a
                # one-stream task starts in any case)
            cc = max(1, int(min(cc, below)))
            where += f", {max(h for h in (held.get(t.src, 0.0), held.get(t.dst, 0.0))):g} with those starting"
            t.state, t.cc, t.run_start, t.rate_bps = "running", cc, t.trans_s, 0.0
            self._run.append(t)
            out.append(Action("start", t.id, cc, reason=(
                f"{self.name}: start {t.id} cc={cc} ({self._remaining_s(t):.1f} s left alone, wants {want}): "
                f"{where}, room for {max(0, int(room))}")))
        elif t.state == "running" and cc != t.cc:
            old, t.cc = t.cc, cc
            why = "room below the knee" if cc > old else "shorter tasks fill its ends"
            out.append(Action("resize", t.id, cc, reason=(
                f"{self.name}: {t.id} cc {old} -> {cc} ({self._remaining_s(t):.1f} s left alone): {why} ({where})")))
        if t.state == "running":
            for h in dict.fromkeys((t.src, t.dst)):
                held[h] = held.get(h, 0.0) + t.cc
                if self.count_starting or not self._starting(t):
                    used[h] = used.get(h, 0.0) + t.cc
        return out
