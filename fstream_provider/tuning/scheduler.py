"""SEAL and STEAL: load-aware scheduling of many transfers (Kettimuthu et al., "An Elegant Sufficiency", §4-§5).

Pure: the caller (the simulator, or the agents' shared scheduler) submits tasks, reports each running
task's progress, and calls ``cycle(now)`` every ``n`` seconds (the paper: 0.5 s); the scheduler answers
with ``Action``s (start with cc, preempt, change cc), each with a reason string.

SEAL (Listings 1-2): per task ``xfactor = (wait + TT_load) / TT_ideal`` (Eq. 3), both times from the
``sched_model.LoadModel`` corrected by recent transfers (§4.2). Waiting tasks, highest xfactor first,
are started when neither endpoint is saturated or the task is small; otherwise running tasks at the
saturated end(s) whose xfactor is lower by the preemption factor ``pf`` are preempted for it
(FindTasksToPreempt). When nothing waits, running tasks get more concurrency, largest remaining first,
while their ends are not saturated. An endpoint is *saturated* when (a) its aggregate throughput (the
tasks' recent rates plus the predictions of what this cycle started) is >= 95 % of its known maximum,
or (b) on the (up to three) links in use at it, doubling the concurrency buys less than a quarter of
the proportional gain (a relative gain < 0.25 for a 100 % cc increase; §4.3 para. 4).

STEAL (Listings 3-4): batch tasks' xfactors are scaled by 1e-5; a batch task starts only while both ends
are below ``lambda_`` of their maximum (``saturated'``) and never preempts; an interactive task first
preempts running batch tasks that stand between it and the throughput it would get without them
(FindBatchTasksToPreempt); batch tasks older than ``promote_after_s`` are promoted to interactive (§5.1).

Readings where the printed listings and the text disagree (the text wins):

- Listing 1 line 21 schedules the waiting task even when no task could be preempted; §4.3's example has
  T3 *wait* until its xfactor reaches pf times a running task's, so a saturated task starts only when
  the candidate list is not empty.
- Listing 2 line 47 reads ``rtask.xfactor > pf * task.xfactor``; the text: a running task is a candidate
  "if its xfactor is lower than that of the waiting task by pf or more", i.e. ``pf * rtask.xfactor <=
  task.xfactor``.
- Saturation test (a) would see none of the tasks started in this cycle (rates are observed); their
  predicted throughput is added so one cycle does not start everything on a quiet endpoint.

Departures: changing a running task's cc is not a restart in FStream (the agent retunes live), so
``Action('resize')`` costs the transfer nothing; the paper's GridFTP restarts the transfer.

Cost (thousands of live tasks, a cycle by every idle agent twice a second): per-endpoint sums, saturation and
FindThrCC per (ends, loads) are kept until a task changes; a waiting task's xfactor is a few operations; waiting
tasks that cannot act until a running one changes (``_gate``) are neither sorted nor visited. The decisions and
reasons are the plain computation's (``tests/test_scheduler_scale.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from fstream_provider.tuning.sched_model import LoadModel, find_thr_cc

BATCH_SCALE = 1e-5  # Listing 3, line 29.2


@dataclass
class Task:
    """A transfer task as the scheduler sees it.

    :param id: unique name.
    :param src: source endpoint.
    :param dst: destination endpoint.
    :param size: bytes in all.
    :param arrival: when it was submitted (scheduler time, s).
    :param klass: ``interactive`` or ``batch``.
    """

    id: str
    src: str
    dst: str
    size: float
    arrival: float
    klass: str = "interactive"
    state: str = "waiting"  # waiting | running | done
    cc: int = 0
    done_bytes: float = 0.0  # committed (a preempted task resumes from here)
    rate_bps: float = 0.0  # recent observed rate (moving average) while running
    wait_s: float = 0.0
    trans_s: float = 0.0  # TT_trans: time spent running so far
    xfactor: float = 1.0
    ideal_s: float = 0.0
    preemptions: int = 0
    run_start: float = 0.0  # trans_s when it last (re)started

    @property
    def left(self) -> float:
        return max(0.0, self.size - self.done_bytes)


@dataclass(frozen=True)
class Action:
    """What the scheduler decided: ``start`` (with cc), ``preempt`` (for ``by``), ``resize`` (new cc)."""

    kind: str
    task: str
    cc: int = 0
    by: str = ""
    reason: str = ""


@dataclass
class SealConfig:
    """SEAL/STEAL parameters (names as in Table 1).

    :param pf: preemption factor (§4.3; the paper's runs use 1.5).
    :param beta: FindThrCC's threshold (a 10 % gain per extra cc: 1.1).
    :param max_cc: most concurrency one task may use.
    :param max_total_cc: most concurrency one endpoint may carry (the paper capped its runs at 80).
    :param small_bytes: tasks below this start even on a saturated endpoint (§4.4: 1 GB).
    :param small_s: if set, "small" is instead what the slower end's known maximum moves in this many seconds
        (the paper's 1 GB is about 1 s on its 9.2 Gbit/s source; on a 1 Gbit/s path it is 8 s, and every
        job of a burst counted as small). The agents set 1 s; the simulator keeps the paper's bytes.
    :param single_bytes: tasks at or below this run with cc = 1 (§6.3: "<= 10 MB ... CC of 1").
    :param saturation: share of the known maximum that counts as saturated (a) (0.95).
    :param gain_floor: relative gain per 100 % more cc below which a link counts as saturated (b) (0.25).
    :param steal: type-aware (STEAL) instead of SEAL.
    :param lambda_: STEAL's share of the maximum batch tasks may fill (1, 0.9, 0.8 in §6.4).
    :param promote_after_s: a batch task waiting this long becomes interactive (None: never).
    :param preempt_guard_s: departure (``preempt-guard``): preempt only tasks that ran this long since they
        (re)started and still need more than two restarts' worth of time (0: as printed). 30 s: on the
        Table 2 traces (seeds 0 and 1) fewer preemptions, each of which costs a restart and a wait, lowered
        the worst slowdown at every load against 5 s (BENCHMARKS §10).
    :param aggregate_gain: departure: one more cc must also raise the endpoints' aggregate (see
        ``sched_model.find_thr_cc``); False runs FindThrCC as printed.
    :param small_preempts_batch: departure (STEAL): as printed (True), every interactive task preempts the batch
        tasks in its way; off, a small one (below ``small_bytes``) starts beside them, as §4.4 starts small
        tasks on a saturated endpoint (on the Table 2 traces it cut batch preemptions by 60-70 % for 1-6 %
        more interactive slowdown).
    :param batch_goal_share: departure (STEAL): FindBatchTasksToPreempt (Listing 4) frees batch tasks until the
        interactive task gets this share of the throughput it would get with no batch task at all (printed:
        all of it). 0.6: batch used 0.90-0.99 of SEAL's spare bandwidth on seeds 0 and 1 (printed: 0.72-0.89),
        interactive slowdown 2-18 % above the printed rule's and still 97-99 % below BaseVary's
        (BENCHMARKS §10).
    :param resize_running: Listing 1 lines 7-9, raising running tasks' cc when nothing waits. The agents turn
        it off: their transfers retune live within their pool grants, so a raise the scheduler only
        imagines would count as load in the same cycle and keep batch tasks out of a path a task on its
        last file leaves nearly empty.
    """

    pf: float = 1.5
    beta: float = 1.1
    max_cc: int = 16
    max_total_cc: int = 80
    small_bytes: float = 1e9
    small_s: float | None = None
    single_bytes: float = 10e6
    saturation: float = 0.95
    gain_floor: float = 0.25
    steal: bool = False
    lambda_: float = 1.0
    promote_after_s: float | None = None
    aggregate_gain: bool = True
    preempt_guard_s: float = 30.0
    resize_running: bool = True
    small_preempts_batch: bool = False
    batch_goal_share: float = 0.6

    def __post_init__(self) -> None:
        if self.pf < 1 or self.beta < 1 or self.max_cc < 1 or self.max_total_cc < 1:
            raise ValueError(f"scheduler config: need pf >= 1, beta >= 1, max_cc >= 1, max_total_cc >= 1: {self}")
        if not 0 < self.batch_goal_share <= 1:
            raise ValueError(f"scheduler config: batch_goal_share must be in (0, 1]: {self}")
        if not 0 < self.lambda_ <= 1 or not 0 < self.saturation <= 1:
            raise ValueError(f"scheduler config: lambda and saturation must be in (0, 1]: {self}")


class SealScheduler:
    """SEAL (``config.steal`` False) or STEAL over one model of the endpoints.

    :param model: throughput estimates (history + correction).
    :param config: parameters.
    :param now: the scheduler's clock when it is made: waits and run times before it are the caller's (the
        agents' board rebuilds a scheduler with them for every cycle).
    """

    def __init__(self, model: LoadModel, config: SealConfig | None = None, now: float = 0.0) -> None:
        self.model, self.cfg = model, config or SealConfig()
        self.tasks: dict[str, Task] = {}
        self._last = now
        self._fresh: dict[str, float] = {}  # endpoint -> predicted bps started this cycle
        self._thr_cache: dict[tuple, tuple[int, float]] = {}  # FindThrCC per (ends, loads, cap) within a cycle
        self._run: list[Task] = []
        self._memo: dict[tuple, Any] = {}  # sums, saturation...: until a task changes here; a cycle starts afresh
        self._version = 0  # bumped by ``_touch``

    @property
    def name(self) -> str:
        return f"steal(lambda={self.cfg.lambda_:g})" if self.cfg.steal else "seal"

    # -- what the driver tells us ---------------------------------------------------------------
    def submit(self, task: Task) -> None:
        if task.id in self.tasks:
            raise ValueError(f"task {task.id!r} submitted twice")
        task.state = "waiting"
        task.ideal_s = self.model.ideal_time(task.src, task.dst, task.size, self._cc_cap(task), self.cfg.beta)
        self.tasks[task.id] = task
        self._memo.clear()

    def progress(self, task_id: str, done_bytes: float, rate_bps: float) -> None:
        """A task's committed bytes and its recent rate (folded into the model's correction next cycle)."""
        t = self.tasks[task_id]
        t.done_bytes, t.rate_bps = done_bytes, rate_bps
        self._memo.clear()

    def finished(self, task_id: str) -> None:
        self.tasks[task_id].state = "done"
        self._memo.clear()

    # -- one scheduling cycle (Listing 1) ---------------------------------------------------------
    def cycle(self, now: float) -> list[Action]:
        dt, self._last = max(0.0, now - self._last), now
        self._fresh, self._thr_cache = {}, {}
        self.tasks = {k: t for k, t in self.tasks.items() if t.state != "done"}  # Listing 1 line 3
        for t in self.tasks.values() if dt or self.cfg.promote_after_s is not None else ():  # (+= 0.0: no change)
            if t.state == "waiting":
                t.wait_s += dt if t.arrival <= now - dt else max(0.0, now - t.arrival)
                if t.klass == "batch" and self.cfg.promote_after_s is not None and \
                        now - t.arrival >= self.cfg.promote_after_s:
                    t.klass = "interactive"
            elif t.state == "running":
                t.trans_s += dt
        live = list(self.tasks.values())
        self._run = [t for t in live if t.state == "running"]
        self._touch()
        for t in self._run:  # §4.2: recent transfers correct the history's model
            if t.rate_bps > 0:
                predicted = self.model.throughput(t.src, t.dst, t.cc, self._load(t.src, t), self._load(t.dst, t),
                                                  corrected=False)
                self.model.observe(t.src, t.dst, predicted, t.rate_bps)
        waiting, awake, interactive_waiting = self._xfactors(live)
        actions: list[Action] = []
        if self.cfg.resize_running and (not waiting or (self.cfg.steal and not interactive_waiting)):
            actions += self._raise_cc("interactive" if self.cfg.steal else None)
        if self.cfg.resize_running and self.cfg.steal and not waiting:
            actions += self._raise_cc("batch")
        awake.sort(key=attrgetter("xfactor"), reverse=True)  # stable: ties in submission order
        queue, version, last, i = awake, self._version, None, 0
        while True:  # the waiting tasks, highest xfactor first
            if version != (version := self._version) and len(awake) < len(waiting):  # those held may act now
                queue, awake, i = self._after(waiting, last), waiting, 0
            if i == len(queue):
                return actions
            task = last = queue[i]
            i += 1
            if task.state != "waiting":
                continue
            key = ("gate", task.src, task.dst, task.klass)
            gate = self._memo.get(key) or self._memo.setdefault(key, self._gate(task))
            if task.xfactor < gate[0] and task.size >= gate[1]:
                continue
            if self.cfg.steal and task.klass == "batch":  # not held: both ends below lambda
                actions += self._start(task, f"batch: both ends below lambda={self.cfg.lambda_:g} of their maximum")
                continue
            small = self._small(task)
            if self.cfg.steal and (self.cfg.small_preempts_batch or not small):
                cl = self._batch_to_preempt(task)
                if cl:
                    actions += self._preempt(cl, task, "interactive task needs the bandwidth batch tasks hold")
                    actions += self._start(task, f"preempted {len(cl)} batch task(s)")
                    continue
            src_sat, dst_sat = self._saturated(task.src), self._saturated(task.dst)
            if not src_sat and not dst_sat or small:
                why = "small task" if (src_sat or dst_sat) else "neither end saturated"
                actions += self._start(task, f"{why}, xfactor {task.xfactor:.2f}")
                continue
            cl: list[Task] = []
            for host, sat in ((task.src, src_sat), (task.dst, dst_sat)):
                if sat:
                    cl += [c for c in self._to_preempt(host, task) if c not in cl]
            if cl:
                actions += self._preempt(cl, task, f"xfactor {task.xfactor:.2f} >= pf={self.cfg.pf:g} x theirs")
                actions += self._start(task, f"saturated; preempted {len(cl)} task(s)")

    def _xfactors(self, live: list[Task]) -> tuple[list[Task], list[Task], bool]:
        """Sets the xfactors; the waiting tasks, those their ``_gate`` does not hold, and if one is interactive."""
        for t in self._run:  # first: the gates sort them by xfactor
            t.xfactor = self._xfactor(t)
        waiting, awake, group, interactive = [], [], {}, False
        steal, startup, single, inf = self.cfg.steal, self.model.startup_s, self.cfg.single_bytes, float("inf")
        for t in live:
            if t.state != "waiting":
                if t.state != "running":
                    t.xfactor = self._xfactor(t)
                continue
            waiting.append(t)
            size, batch = t.size, t.klass == "batch"
            g = group.get((t.src, t.dst, size <= single, t.klass))  # the same for one pair, size class and class
            if g is None:
                g = group[(t.src, t.dst, size <= single, t.klass)] = (self._find_thr_cc(t, False)[1], *self._gate(t))
            thr, below, limit = g
            left, ideal = size - t.done_bytes, t.ideal_s  # max(0.0, left) and max(ideal, 1e-9), as max() picks
            load_s = ((left if left > 0.0 else 0.0) * 8 / thr if thr > 0 else inf) + t.trans_s + startup
            x = (t.wait_s + load_s) / (1e-9 if 1e-9 > ideal else ideal)
            t.xfactor = x = x * BATCH_SCALE if steal and batch else x
            interactive = interactive or t.klass == "interactive"
            if not (x < below and size >= limit):
                awake.append(t)
        return waiting, awake, interactive

    def _gate(self, t: Task) -> tuple[float, float]:
        """``(below, limit)``: until a running task changes, a waiting task with an xfactor below ``below`` and a size
        not below ``limit`` does nothing. STEAL: a batch task while an end is above lambda (interactive ones are
        decided one by one). SEAL: a task that is not small on a saturated end where FindTasksToPreempt stops at
        once, pf x the lowest xfactor it could preempt being above the task's."""
        inf, src, dst, lam = float("inf"), t.src, t.dst, self.cfg.lambda_
        if self.cfg.steal:
            held = t.klass == "batch" and (self._saturated(src, lam) or self._saturated(dst, lam))
            return inf if held else -inf, -inf
        ends = [self._candidates(h) for h in (src, dst) if self._saturated(h)]
        limit = self.cfg.small_bytes if self.cfg.small_s is None else self.cfg.small_s * min(
            self.model.curve(src).capacity_bps, self.model.curve(dst).capacity_bps) / 8  # as ``_small``
        return min((self.cfg.pf * c[0].xfactor if c else inf for c in ends), default=-inf), limit

    def _after(self, waiting: list[Task], last: Task | None) -> list[Task]:
        """The waiting tasks the cycle comes to after ``last`` (all if None), in its order."""
        rest = sorted((t for t in waiting if t.state == "waiting" or t is last), key=attrgetter("xfactor"),
                      reverse=True)
        return rest[next(i for i, t in enumerate(rest) if t is last) + 1:] if last is not None else rest

    # -- what the running tasks add up to, kept until a task changes (``_touch``, ``_memo.clear``) ------
    def _touch(self) -> None:
        self._memo, self._version = {}, self._version + 1

    def _kept(self, key: tuple, make: Callable[[], Any]) -> Any:
        return self._memo[key] if key in self._memo else self._memo.setdefault(key, make())

    def _sums(self) -> tuple[dict, dict, dict, dict, set]:
        """Per endpoint over the running tasks (``_run`` order): cc, rates (added as ``sum`` did), links, tasks; ids."""
        if ("sums",) in self._memo:
            return self._memo[("sums",)]
        load, rate, links, at, ids = {}, {}, {}, {}, set()
        for t in self._run:
            if t.state == "running":
                ids.add(id(t))
                for host in (t.src,) if t.src == t.dst else (t.src, t.dst):
                    load[host] = load.get(host, 0) + t.cc
                    rate[host] = rate.get(host, 0) + t.rate_bps
                    pairs = links.setdefault(host, {})
                    pairs[(t.src, t.dst)] = pairs.get((t.src, t.dst), 0) + t.cc
                    at.setdefault(host, []).append(t)
        self._memo[("sums",)] = load, rate, links, at, ids
        return load, rate, links, at, ids

    # -- Listing 2 ------------------------------------------------------------------------------------
    def _small(self, t: Task) -> bool:
        if self.cfg.small_s is None:
            return t.size < self.cfg.small_bytes
        slower = min(self.model.curve(t.src).capacity_bps, self.model.curve(t.dst).capacity_bps)
        return t.size < self.cfg.small_s * slower / 8

    def _cc_cap(self, t: Task) -> int:
        return 1 if t.size <= self.cfg.single_bytes else self.cfg.max_cc

    def _load(self, host: str, exclude: Task | None = None, without: tuple[Task, ...] = ()) -> float:
        load, _rate, _links, _at, ids = self._sums()  # (``without`` never holds ``exclude`` nor a task twice)
        return load.get(host, 0) - sum(u.cc for u in (exclude, *without)
                                       if u is not None and id(u) in ids and host in (u.src, u.dst))

    def _find_thr_cc(self, t: Task, ideal: bool, without: tuple[Task, ...] = ()) -> tuple[int, float]:
        src_cc = 0.0 if ideal else self._load(t.src, t, without)
        dst_cc = 0.0 if ideal else self._load(t.dst, t, without)
        room = self.cfg.max_total_cc - max(src_cc, dst_cc)
        cap = max(1, min(self._cc_cap(t), int(room))) if not ideal else self._cc_cap(t)
        key = (t.src, t.dst, src_cc, dst_cc, cap, ideal)
        if key not in self._thr_cache:  # the prediction depends on the ends and their loads, not on the task
            agg = None if ideal or not self.cfg.aggregate_gain else (
                lambda c: self.model.aggregate(t.src, t.dst, c, src_cc, dst_cc))
            self._thr_cache[key] = find_thr_cc(
                lambda c: self.model.throughput(t.src, t.dst, c, src_cc, dst_cc, corrected=not ideal), cap,
                self.cfg.beta, agg)
        return self._thr_cache[key]

    def _xfactor(self, t: Task, without: tuple[Task, ...] = ()) -> float:
        _cc, thr = self._find_thr_cc(t, False, without)
        load_s = (t.left * 8 / thr if thr > 0 else float("inf")) + t.trans_s
        if t.state == "waiting":
            load_s += self.model.startup_s
        x = (t.wait_s + load_s) / max(t.ideal_s, 1e-9)
        return x * BATCH_SCALE if (self.cfg.steal and t.klass == "batch") else x

    def _aggregate(self, host: str) -> float:
        return self._sums()[1].get(host, 0) + self._fresh.get(host, 0.0)

    def _saturated(self, host: str, share: float = 1.0) -> bool:
        return self._kept(("saturated", host, share), lambda: self._saturation(host, share))

    def _saturation(self, host: str, share: float) -> bool:
        curve = self.model.curve(host)
        if self._aggregate(host) >= self.cfg.saturation * share * curve.capacity_bps:
            return True
        if self._load(host) >= self.cfg.max_total_cc:
            return True
        tested = sorted(self._sums()[2].get(host, {}).items(), key=lambda kv: -kv[1])[:3]
        if not tested:
            return False
        for (src, dst), cc in tested:
            others_src, others_dst = self._load(src) - cc, self._load(dst) - cc
            measure = self.model.aggregate if self.cfg.aggregate_gain else self.model.throughput
            now = measure(src, dst, cc, others_src, others_dst)
            more = measure(src, dst, 2 * cc, others_src, others_dst)
            if now <= 0 or (more - now) / now >= self.cfg.gain_floor:
                return False
        return True

    def _to_preempt(self, host: str, task: Task) -> list[Task]:
        """FindTasksToPreempt: running tasks at ``host``, lowest xfactor first, while pf allows and needed."""
        running = self._candidates(host)
        if not running or self.cfg.pf * running[0].xfactor > task.xfactor:
            return []
        highest = self._kept(("highest",), lambda: max(t.xfactor for t in self._run if t.state == "running"))
        cl: list[Task] = []
        for r in running:
            if self.cfg.pf * r.xfactor > task.xfactor:
                break  # sorted ascending: no later one qualifies either
            if self.cfg.preempt_guard_s and not self._worth_preempting(r, task, cl):
                continue
            if self.cfg.steal and r.klass == "batch" and task.klass == "batch":
                continue
            cl.append(r)
            if self._xfactor(task, tuple(cl)) <= highest:
                break
        return cl

    def _candidates(self, host: str) -> list[Task]:
        """The running tasks at ``host`` by xfactor, less those the preempt guard spares whatever waits."""
        at = self._kept(("running", host), lambda: sorted(self._sums()[3].get(host, []), key=attrgetter("xfactor")))
        return self._kept(("preemptible", host), lambda: [r for r in at if self._preemptible(r)]) \
            if self.cfg.preempt_guard_s else at

    def _preemptible(self, r: Task) -> bool:
        return not r.trans_s - r.run_start < self.cfg.preempt_guard_s and not (
            r.rate_bps > 0 and r.left * 8 / r.rate_bps <= 2 * self.model.startup_s)

    def _worth_preempting(self, r: Task, task: Task, cl: list[Task]) -> bool:
        """The ``preempt-guard`` switch: a task is preempted only once it has run ``preempt_guard_s`` since it
        (re)started, would still need longer than a restart costs (§4.3: each preemption pays a new
        connection and authentication and resends what moved since the last checkpoint), and the waiting
        task's xfactor is pf times its own *with the victim gone*. The waiting task's xfactor under the
        current load counts the very contention the victim causes, so a task just preempted at once
        outranked its preemptor by pf and took its place back, cycle after cycle."""
        return self._preemptible(r) and self._xfactor(task, tuple(cl) + (r,)) >= self.cfg.pf * r.xfactor

    def _batch_to_preempt(self, task: Task) -> list[Task]:
        """FindBatchTasksToPreempt (Listing 4): batch tasks at the task's ends, while each one freed helps."""
        batch = self._kept(("batch", task.src, task.dst), lambda: sorted(
            (t for t in self._run if t.state == "running" and t.klass == "batch"
             and ({t.src, t.dst} & {task.src, task.dst})), key=attrgetter("xfactor")))
        if not batch:
            return []
        goal = self._find_thr_cc(task, False, tuple(batch))[1]
        thr = self._find_thr_cc(task, False)[1]
        cl: list[Task] = []
        for b in batch:
            if thr >= goal * min(self.cfg.batch_goal_share, 0.999):  # 1 (printed): all of it, to rounding
                break
            thr2 = self._find_thr_cc(task, False, tuple(cl) + (b,))[1]
            if thr2 > thr:
                thr = thr2
                cl.append(b)
        return cl

    # -- actions ------------------------------------------------------------------------------------
    def _start(self, task: Task, why: str) -> list[Action]:
        cc, thr = self._find_thr_cc(task, False)
        task.state, task.cc, task.run_start, task.rate_bps = "running", cc, task.trans_s, 0.0
        self._run.append(task)
        for host in (task.src, task.dst):
            self._fresh[host] = self._fresh.get(host, 0.0) + thr
        self._touch()
        return [Action("start", task.id, cc, reason=f"{self.name}: start {task.id} cc={cc} "
                                                    f"(predicted {thr / 1e6:.0f} Mbit/s): {why}")]

    def _preempt(self, victims: list[Task], task: Task, why: str) -> list[Action]:
        out = []
        for v in victims:
            v.state, v.cc, v.rate_bps = "waiting", 0, 0.0
            v.preemptions += 1
            out.append(Action("preempt", v.id, by=task.id, reason=f"{self.name}: preempt {v.id} (xfactor "
                                                                    f"{v.xfactor:.2f}) for {task.id}: {why}"))
        self._touch()
        return out

    def _raise_cc(self, klass: str | None) -> list[Action]:
        """Listing 1 lines 7-9: more concurrency for running tasks, largest remaining first, ends not saturated."""
        out = []
        share = self.cfg.lambda_ if klass == "batch" else 1.0
        for t in sorted((t for t in self._run if t.state == "running"
                         and (klass is None or t.klass == klass)), key=lambda t: -t.left):
            if self._saturated(t.src, share) or self._saturated(t.dst, share):
                continue
            cc, thr = self._find_thr_cc(t, False)
            if cc > t.cc:
                gain = thr - t.rate_bps
                old, t.cc = t.cc, cc
                for host in (t.src, t.dst):
                    self._fresh[host] = self._fresh.get(host, 0.0) + max(0.0, gain)
                self._touch()
                why = "nothing waits" if klass in (None, "batch") else "no interactive task waits"
                out.append(Action("resize", t.id, cc, reason=f"{self.name}: {t.id} cc {old} -> {cc}: {why} "
                                                               f"and its ends have room"))
        return out
