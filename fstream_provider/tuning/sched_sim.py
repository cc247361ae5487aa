"""Trace replay for schedulers: SEAL, STEAL and the paper's baselines over shared endpoints (SEAL §6).

Pure and deterministic. ``replay(trace, make_scheduler)`` moves every task of a ``trace`` through a
fluid model of the endpoints (``sched_model.EndpointCurve`` as ground truth, with a seeded external
load the schedulers do not see) in steps of ``dt``, calling the scheduler every ``cycle_s`` (0.5 s, §4.4).

What the simulation charges, as the paper's testbed would:

- every start and every restart costs ``startup_s`` (connection and authentication) before bytes move;
- a preempted task resumes from its last checkpoint (every ``checkpoint_s``: 1 s, §4.5), losing what it
  moved since; it keeps running until the task that preempted it has started moving bytes (§4.5);
- an endpoint driven past its knee moves less in aggregate (the overload of the curve).

Baselines (§6.3): ``basecc1``, ``basecc2``, ``basecc4`` start every task on arrival with cc 1, 2 or 4
(cc 1 for <= 10 MB), ``basevary`` with cc 1 up to 1 GB and 4 above; all queue FIFO only when an
endpoint's total concurrency cap (80) is reached.

Endpoints (§6.1, §6.2): ``endpoints_for`` picks the curves a replay runs on (the schedulers' model gets
the same ones; the external load is what it does not see). Given curves (``--endpoints FILE``) must name
every endpoint of the trace, else ``check_endpoints`` refuses the first task that uses one they do not
name, giving the endpoint, the task's trace line and id, and where the curves came from. Without them a
trace of the paper's six hosts runs on §6.1's capacities, and any other trace on capacities learned from
the trace itself (``learn_endpoints``: the trace's interactive volume through each endpoint read as the
paper's busiest load, 60 %, over its window; see there why).

Metrics (§3.2): bounded slowdown ``(wait + max(runtime, bound)) / max(TT_ideal, bound)`` with a 1 s
bound, TT_ideal from the uncorrected model at zero load and FindThrCC's concurrency; turnaround;
per Table 2 size category; for batch tasks the fraction of the spare bandwidth (capacity x duration
minus the interactive bytes) they used within the trace's window (§3.2.2); "capacity" is the sum of the
trace's sources' capacities (the paper's one source: Stampede's 9.2 Gbit/s).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from fstream_provider.tuning.sched_model import EndpointCurve, LoadModel
from fstream_provider.tuning.scheduler import Action, SealConfig, SealScheduler, Task
from fstream_provider.tuning.seal_share import SealShareScheduler
from fstream_provider.tuning.srpt_share import SrptShareScheduler
from fstream_provider.tuning.trace import DESTINATIONS, SOURCE, SOURCE_BPS, TraceTask, category_of

BOUND_S = 1.0


#: ``learn_endpoints``: the load a trace is read as (§6.2's busiest trace), the shortest window its volume is
#: spread over (§6.2 averages concurrency per minute), the least an endpoint moves (§6.1's slowest DTN, Darter)
LEARN_LOAD = 0.60
LEARN_MIN_WINDOW_S = 60.0
LEARN_FLOOR_BPS = 2e9


def paper_endpoints(unit_bps: float = 1e9, overload: float = 0.1) -> dict[str, EndpointCurve]:
    """§6.1's source and five destinations."""
    out = {SOURCE: EndpointCurve(SOURCE_BPS, unit_bps, overload)}
    out.update({k: EndpointCurve(v, unit_bps, overload) for k, v in DESTINATIONS.items()})
    return out


def learn_endpoints(trace: list[TraceTask], *, window_s: float | None = None, load: float = LEARN_LOAD,
                    floor_bps: float = LEARN_FLOOR_BPS, unit_bps: float = 1e9,
                    overload: float = 0.1) -> dict[str, EndpointCurve]:
    """Each endpoint's capacity learned from ``trace`` alone, for a trace with no endpoints file.

    ``capacity = max(floor_bps, 8 * interactive bytes through the endpoint / (load * window))``

    A trace row holds arrival, ends, size and class, no rates or durations, so the only evidence of what an
    endpoint can move is the volume it was asked to move per unit of time. §6.2 defines a trace's load as
    its volume over what the source can move in the window; we invert that definition, reading every
    endpoint's share of the trace at the paper's busiest load, 60 %. That is the lowest capacity the
    paper's own traces (25 to 60 %) would imply: conservative, so contention shows in the replay rather
    than hides (a 25 % reading would make every endpoint 2.4 times faster). The paper's 60 % trace comes out
    at about Stampede's 9.2 Gbit/s; its lower-load traces come out slower, its destinations (only the
    share they were sent) slower still, and the floor keeps them at least Darter's 2 Gbit/s (§6.1's slowest
    DTN), without which a trace of a few small files would give endpoints of a few kbit/s. Batch tasks are not
    counted: they are sized to fill whatever the endpoints leave (§6.4), so their volume says nothing
    about a rate. The window is ``window_s`` (default the last arrival, the replay's window) but at least a
    minute (§6.2 reads concurrency in one-minute averages): tasks that arrive all at once show no rate.
    A file (``endpoint_curves``) replaces all of this with measured capacities.

    :param load: the share of its capacity each endpoint's volume is read as.
    :param floor_bps: the least capacity an endpoint is given.
    :param unit_bps: one stream's rate on an idle path (the model's default).
    """
    if not 0 < load <= 1:
        raise ValueError(f"learn_endpoints: load must be in (0, 1], got {load!r}")
    window = max((t.arrival_s for t in trace), default=0.0) if window_s is None else window_s
    window = max(LEARN_MIN_WINDOW_S, window)
    volume: dict[str, float] = {}
    for t in trace:
        for host in dict.fromkeys((t.source, t.destination)):  # a task from a host to itself counts once
            volume[host] = volume.get(host, 0.0) + (t.size if t.klass == "interactive" else 0.0)
    return {host: EndpointCurve(max(floor_bps, b * 8 / (load * window)), unit_bps, overload)
            for host, b in volume.items()}


def check_endpoints(trace: list[TraceTask], endpoints: dict[str, EndpointCurve], *,
                    origin: str = "the endpoints given", trace_name: str = "trace") -> None:
    """Refuse (``ValueError``) the first task of ``trace`` whose source or destination ``endpoints`` lacks.

    The message names the endpoint, the task (its trace line when read from a file, and its replay id
    ``t<index>``), and ``origin`` (e.g. ``endpoints file sites.toml``)."""
    for i, t in enumerate(trace):
        for host in (t.source, t.destination):
            if host not in endpoints:
                line = f" line {t.line}" if t.line is not None else ""
                raise ValueError(
                    f"{trace_name}{line} (transfer t{i}: {t.source} -> {t.destination}, {t.size} bytes at "
                    f"{t.arrival_s:g} s): endpoint {host!r} is not in {origin}, which names "
                    f"{', '.join(sorted(endpoints)) or 'none'}; add it there with its capacity")


def endpoints_for(trace: list[TraceTask], endpoints: dict[str, EndpointCurve] | None = None, *,
                  origin: str = "the endpoints given", trace_name: str = "trace",
                  window_s: float | None = None) -> dict[str, EndpointCurve]:
    """The curves ``trace`` replays on: ``endpoints`` if given (every trace endpoint checked to be there),
    else §6.1's when every endpoint is one of the paper's six hosts, else learned (``learn_endpoints``)."""
    if endpoints is not None:
        check_endpoints(trace, endpoints, origin=origin, trace_name=trace_name)
        return endpoints
    paper = paper_endpoints()
    if all(t.source in paper and t.destination in paper for t in trace):
        return paper
    return learn_endpoints(trace, window_s=window_s)


class BaselineScheduler:
    """Start on arrival with a static cc by size; FIFO queue only at the endpoint concurrency cap.

    :param name: ``basecc1``, ``basecc2``, ``basecc4`` or ``basevary``.
    :param max_total_cc: concurrency cap per endpoint.
    """

    def __init__(self, name: str, max_total_cc: int = 80) -> None:
        if name not in BASELINES:
            raise ValueError(f"baseline {name!r}: expected one of {', '.join(BASELINES)}")
        self.name, self.max_total_cc = name, max_total_cc
        self.tasks: dict[str, Task] = {}
        self._queue: deque[Task] = deque()

    def cc_for(self, size: float) -> int:
        if self.name == "basevary":
            return 1 if size <= 1e9 else 4
        return 1 if size <= 10e6 else int(self.name[-1])

    def submit(self, task: Task) -> None:
        self.tasks[task.id] = task
        self._queue.append(task)

    def progress(self, task_id: str, done_bytes: float, rate_bps: float) -> None:
        t = self.tasks[task_id]
        t.done_bytes, t.rate_bps = done_bytes, rate_bps

    def finished(self, task_id: str) -> None:
        self.tasks.pop(task_id).state = "done"

    def cycle(self, now: float) -> list[Action]:
        load: dict[str, int] = {}
        for t in self.tasks.values():
            if t.state == "running":
                load[t.src] = load.get(t.src, 0) + t.cc
                load[t.dst] = load.get(t.dst, 0) + t.cc
        out = []
        while self._queue:
            t = self._queue[0]
            cc = self.cc_for(t.size)
            if max(load.get(t.src, 0), load.get(t.dst, 0)) + cc > self.max_total_cc:
                break
            self._queue.popleft()
            t.state, t.cc = "running", cc
            load[t.src] = load.get(t.src, 0) + cc
            load[t.dst] = load.get(t.dst, 0) + cc
            out.append(Action("start", t.id, cc, reason=f"{self.name}: start {t.id} cc={cc} on arrival"))
        return out


BASELINES = ("basecc1", "basecc2", "basecc4", "basevary")


@dataclass
class _Run:
    task: TraceTask
    id: str
    cc: int = 0
    state: str = "pending"  # pending | waiting | startup | running | draining | done
    startup_left: float = 0.0
    done: float = 0.0
    committed: float = 0.0
    next_checkpoint: float = 0.0
    runtime: float = 0.0
    end: float | None = None
    drain_for: str = ""
    history: deque = field(default_factory=deque)  # (t, bytes) for the 5 s moving average
    resent: float = 0.0
    moved: float = 0.0  # every byte put on the wire, resends included
    preempted: int = 0


@dataclass
class ReplayResult:
    """Per-task outcomes and the trace's aggregates."""

    name: str
    tasks: list[dict]
    batch_spare_fraction: float | None
    preemptions: int
    decisions: list[str]

    def summary(self) -> dict:
        inter = [t for t in self.tasks if t["class"] == "interactive" and t["end"] is not None]

        def stats(rows: list[dict]) -> dict:
            if not rows:
                return {"count": 0}
            sd = [r["slowdown"] for r in rows]
            ta = [r["turnaround"] for r in rows]
            return {"count": len(rows), "avg_slowdown": statistics.fmean(sd), "worst_slowdown": max(sd),
                    "avg_turnaround": statistics.fmean(ta), "worst_turnaround": max(ta)}

        out = {"algorithm": self.name, **stats(inter), "preemptions": self.preemptions,
               "unfinished_interactive": sum(1 for t in self.tasks if t["class"] == "interactive" and t["end"] is None),
               "per_class": {c: stats([t for t in inter if t["category"] == c])
                             for c in sorted({t["category"] for t in inter})}}
        if self.batch_spare_fraction is not None:
            out["batch_spare_fraction"] = self.batch_spare_fraction
        return out


def _external(seed: int, hosts: list[str], duration_s: float, level: float) -> Callable[[str, float], float]:
    """A seeded, slowly varying external load per endpoint (share of its capacity, 0..2*level)."""
    if level <= 0:
        return lambda host, t: 0.0
    rng = random.Random(seed)
    steps = int(duration_s // 60) + 2
    walk = {h: [min(2 * level, max(0.0, rng.gauss(level, level / 2))) for _ in range(steps)] for h in hosts}
    return lambda host, t: walk[host][min(steps - 1, int(t // 60))]


def replay(trace: list[TraceTask], scheduler, *, endpoints: dict[str, EndpointCurve] | None = None,
           dt: float = 0.1, cycle_s: float = 0.5, startup_s: float = 1.0, checkpoint_s: float = 1.0,
           external_load: float = 0.05, seed: int = 0, window_s: float | None = None,
           max_time_s: float = 6 * 3600) -> ReplayResult:
    """Move ``trace`` through the endpoints under ``scheduler`` (``SealScheduler`` or ``BaselineScheduler``).

    :param endpoints: the endpoints' curves (ground truth); default ``endpoints_for(trace)``: the paper's
        for its six hosts, else learned from the trace. A scheduler with a model (SEAL, STEAL) must have
        been made with curves that name every endpoint of the trace (``make_scheduler(name, endpoints)``).
    """
    window = window_s if window_s is not None else max((t.arrival_s for t in trace), default=0.0)
    curves = endpoints_for(trace, endpoints, window_s=window)
    model = getattr(scheduler, "model", None)
    if isinstance(model, LoadModel):
        check_endpoints(trace, model.endpoints, origin="the scheduler's model (make_scheduler(name, endpoints))")
    truth = LoadModel(curves, startup_s=startup_s)
    ext = _external(seed, list(curves), max(window, 1.0) * 4, external_load)
    runs = [_Run(t, f"t{i}") for i, t in enumerate(trace)]
    by_id = {r.id: r for r in runs}
    pending = deque(sorted(runs, key=lambda r: r.task.arrival_s))
    decisions: list[str] = []
    preemptions = 0
    now, next_cycle = 0.0, 0.0
    batch_bytes_in_window = inter_bytes_in_window = 0.0
    while now < max_time_s:
        while pending and pending[0].task.arrival_s <= now:
            r = pending.popleft()
            r.state = "waiting"
            t = r.task
            scheduler.submit(Task(r.id, t.source, t.destination, float(t.size), t.arrival_s, t.klass))
        if now >= next_cycle - 1e-9:
            next_cycle += cycle_s
            for r in runs:
                if r.state in ("running", "startup", "draining", "waiting") and r.id in scheduler.tasks:
                    scheduler.progress(r.id, r.done if r.state != "waiting" else r.committed, _rate(r, now))
            for a in scheduler.cycle(now):
                decisions.append(f"{now:8.1f} {a.reason}")
                r = by_id[a.task]
                if a.kind == "start":
                    if r.state == "draining":  # restarted before it stopped: back to its checkpoint all the same
                        r.resent += r.done - r.committed
                    r.state, r.cc, r.startup_left = "startup", a.cc, startup_s
                    r.done = r.committed
                    r.history.clear()
                elif a.kind == "resize":
                    r.cc = a.cc
                elif a.kind == "preempt":
                    preemptions += 1
                    r.preempted += 1
                    r.state, r.drain_for = "draining", a.by
        active = [r for r in runs if r.state in ("running", "draining")]
        n: dict[str, int] = {}
        for r in active:
            n[r.task.source] = n.get(r.task.source, 0) + r.cc
            n[r.task.destination] = n.get(r.task.destination, 0) + r.cc
        for r in active:
            shares = []
            for host in (r.task.source, r.task.destination):
                shares.append(curves[host].aggregate(n[host]) * (1 - ext(host, now)) * r.cc / n[host])
            moved = min(shares) * dt / 8
            moved = min(moved, r.task.size - r.done)
            r.done += moved
            r.moved += moved
            r.runtime += dt
            if now < window:
                if r.task.klass == "batch":
                    batch_bytes_in_window += moved
                else:
                    inter_bytes_in_window += moved
            if now + dt >= r.next_checkpoint:
                r.committed, r.next_checkpoint = r.done, now + dt + checkpoint_s
            r.history.append((now + dt, r.done))
            while r.history and r.history[0][0] < now + dt - 5.0:
                r.history.popleft()
            if r.done >= r.task.size - 0.5:
                r.state, r.end = "done", now + dt
                scheduler.finished(r.id)
        for r in runs:
            if r.state == "startup":
                r.runtime += dt
                r.startup_left -= dt
                if r.startup_left <= 1e-9:
                    r.state = "running"
            elif r.state == "draining":
                by = by_id.get(r.drain_for)
                if by is None or by.state in ("running", "done", "waiting"):
                    r.resent += r.done - r.committed
                    r.done, r.state, r.cc = r.committed, "waiting", 0
        now = round(now + dt, 6)
        if not pending and all(r.state == "done" or (r.task.klass == "batch" and now >= window) for r in runs):
            break
    rows = []
    for r in runs:
        t = r.task
        ideal = truth.ideal_time(t.source, t.destination, t.size, 1 if t.size <= 10e6 else 16)
        turnaround = None if r.end is None else r.end - t.arrival_s
        wait = None if turnaround is None else max(0.0, turnaround - r.runtime)
        slowdown = None if turnaround is None else (wait + max(r.runtime, BOUND_S)) / max(ideal, BOUND_S)
        rows.append({"id": r.id, "class": t.klass, "category": category_of(t.size), "size": t.size,
                     "arrival": t.arrival_s, "end": r.end, "turnaround": turnaround, "runtime": r.runtime,
                     "wait": wait, "ideal": ideal, "slowdown": slowdown, "resent_bytes": r.resent,
                     "moved_bytes": r.moved, "preempted": r.preempted})
    spare = None
    if any(t.klass == "batch" for t in trace) and window > 0:
        sources = dict.fromkeys(t.source for t in trace)
        free = sum(curves[s].capacity_bps for s in sources) / 8 * window - inter_bytes_in_window
        spare = batch_bytes_in_window / free if free > 0 else math.nan
    return ReplayResult(getattr(scheduler, "name", type(scheduler).__name__), rows, spare, preemptions, decisions)


def slowdown_floor(trace: list[TraceTask], endpoints: dict[str, EndpointCurve] | None = None, *,
                   cycle_s: float = 0.5, startup_s: float = 1.0, max_cc: int = 16,
                   window_s: float | None = None) -> list[float | None]:
    """Each task's bounded slowdown were it alone (None for batch tasks): no scheduler does better under
    ``replay``'s charges, so a trace's average of these is the floor its goals can be judged against.

    Alone, a task is seen at the first cycle at or after its arrival (the replay calls the scheduler every
    ``cycle_s``), pays one ``startup_s`` and then moves at the most its two ends move together with up to
    ``max_cc`` (no external load, no step rounding): each of those only lowers the figure, so it is a
    bound, not an estimate. The slowdown is ``replay``'s, against the same TT_ideal."""
    window = window_s if window_s is not None else max((t.arrival_s for t in trace), default=0.0)
    truth = LoadModel(endpoints_for(trace, endpoints, window_s=window), startup_s=startup_s)
    out: list[float | None] = []
    for t in trace:
        if t.klass != "interactive":
            out.append(None)
            continue
        wait = math.ceil(t.arrival_s / cycle_s - 1e-9) * cycle_s - t.arrival_s
        fastest = max(truth.throughput(t.source, t.destination, cc, corrected=False) for cc in range(1, max_cc + 1))
        runtime = startup_s + t.size * 8 / fastest
        ideal = truth.ideal_time(t.source, t.destination, t.size, 1 if t.size <= 10e6 else 16)
        out.append((max(0.0, wait) + max(runtime, BOUND_S)) / max(ideal, BOUND_S))
    return out


def _rate(r: _Run, now: float) -> float:
    if len(r.history) < 2:
        return 0.0
    (t0, b0), (t1, b1) = r.history[0], r.history[-1]
    return (b1 - b0) * 8 / (t1 - t0) if t1 > t0 else 0.0


ALGORITHMS = BASELINES + ("seal", "steal", "seal-share", "steal-share", "srpt-share")


def make_scheduler(name: str, endpoints: dict[str, EndpointCurve] | None = None, **config) -> object:
    """A fresh scheduler by name: a baseline, ``seal`` or ``steal`` (``lambda_=`` etc. in ``config``), or either
    sharing below the knee (``seal-share``, ``steal-share``: ``seal_share.SealShareScheduler``; ``admit=`` and
    ``fair_small=`` switch its two changes), or shortest remaining first past the knee (``srpt-share``:
    ``srpt_share.SrptShareScheduler``; ``count_starting=``, ``order=`` and ``start_limit=`` for its ablation).

    SEAL and STEAL model ``endpoints`` (default §6.1's; for another trace pass ``endpoints_for(trace)``)."""
    if name in BASELINES:
        return BaselineScheduler(name)
    if name in ALGORITHMS[len(BASELINES):]:
        model = LoadModel(endpoints or paper_endpoints())
        if name == "srpt-share":
            switches = {k: config.pop(k) for k in ("count_starting", "order", "start_limit") if k in config}
            return SrptShareScheduler(model, SealConfig(**config), **switches)
        if name.endswith("-share"):  # ``admit=``, ``fair_small=``: its two changes, for an ablation
            switches = {k: config.pop(k) for k in ("admit", "fair_small") if k in config}
            return SealShareScheduler(model, SealConfig(steal=name.startswith("steal"), **config), **switches)
        return SealScheduler(model, SealConfig(steal=name == "steal", **config))
    raise ValueError(f"scheduling algorithm {name!r}: expected one of {', '.join(ALGORITHMS)}")
