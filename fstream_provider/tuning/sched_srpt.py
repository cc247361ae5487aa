"""What an idealized scheduler reaches on a trace: preemptive SRPT with free preemption and exact rates (issue 44).

``sched_sim.slowdown_floor`` puts every task alone on the path: no contention at all, so at ordinary load it is far
below anything a scheduler can reach (a burst of 1-10 GB tasks must share the source whoever orders them).
``srpt_estimate`` replays a trace under the scheduler that queueing theory ranks first for mean response time,
shortest remaining processing time (SRPT; Schrage 1968, and for mean slowdown Bansal and Harchol-Balter 2001),
given everything the real schedulers lack:

- preemption and resumption are free (no restart, no checkpoint lost);
- every running task gets the exact rate the order leaves it, with no concurrency to choose: walking the tasks
  shortest remaining first, each takes ``min(its rate alone, what its source has left, what its destination
  has left)`` (the rates the ends still have, not streams), so no end is ever driven past its capacity;
- no external load (``replay`` runs the others under its seeded external load).

It keeps the replay's charges (a task is seen at the next ``cycle_s`` after it arrives, pays one ``startup_s``,
then moves in steps of ``dt``, as ``replay`` does), and the same bounded slowdown against the same TT_ideal.
It is an estimate, not a bound: SRPT is not the exact optimum of mean slowdown and a greedy walk is not the
best division of two ends. What it shows is how much of the gap between the floor and the best baseline any
scheduler can hope to take under the replay's charges: where it is above a goal, the goal asks more than
contention allows.
"""

from __future__ import annotations

import math

from fstream_provider.tuning.sched_model import EndpointCurve, LoadModel
from fstream_provider.tuning.sched_sim import BOUND_S, endpoints_for
from fstream_provider.tuning.trace import TraceTask


def srpt_estimate(trace: list[TraceTask], endpoints: dict[str, EndpointCurve] | None = None, *,
                  dt: float = 0.1, cycle_s: float = 0.5, startup_s: float = 1.0, max_cc: int = 16,
                  single_bytes: float = 10e6, window_s: float | None = None) -> list[float | None]:
    """Each task's bounded slowdown under the idealized SRPT above (None for batch tasks, which it leaves out).

    :param max_cc: a task's rate alone is the most its ends move together with up to this many streams (1 at or
        below ``single_bytes``), as ``slowdown_floor`` has it.
    """
    window = window_s if window_s is not None else max((t.arrival_s for t in trace), default=0.0)
    curves = endpoints_for(trace, endpoints, window_s=window)
    truth = LoadModel(curves, startup_s=startup_s)
    alone: dict[tuple, float] = {}
    state = []  # [ready, left, rate, index]
    for i, t in enumerate(trace):
        if t.klass != "interactive":
            continue
        cap = 1 if t.size <= single_bytes else max_cc
        key = (t.source, t.destination, cap)
        if key not in alone:
            alone[key] = max(truth.throughput(t.source, t.destination, c, corrected=False) for c in range(1, cap + 1))
        ready = math.ceil(t.arrival_s / cycle_s - 1e-9) * cycle_s + startup_s
        state.append([ready, float(t.size), alone[key], i])
    state.sort(key=lambda s: s[0])
    ends: dict[int, float] = {}
    active: list[list] = []
    now, j = 0.0, 0
    while j < len(state) or active:
        if not active and state[j][0] > now:  # an idle path: jump to the next arrival's step
            now = round(math.ceil(state[j][0] / dt - 1e-9) * dt, 6)
        while j < len(state) and state[j][0] <= now + 1e-9:
            active.append(state[j])
            j += 1
        active.sort(key=lambda s: s[1] * 8 / s[2])  # shortest remaining time (alone) first
        room = {h: c.capacity_bps for h, c in curves.items()}
        for s in active:
            t = trace[s[3]]
            rate = min(s[2], room[t.source], room[t.destination])
            if rate <= 0:
                continue
            room[t.source] -= rate
            if t.destination != t.source:
                room[t.destination] -= rate
            s[1] -= rate * dt / 8
            if s[1] <= 0.5:
                ends[s[3]] = now + dt
        active = [s for s in active if s[3] not in ends]
        now = round(now + dt, 6)
    out: list[float | None] = []
    for i, t in enumerate(trace):
        if t.klass != "interactive":
            out.append(None)
            continue
        ideal = truth.ideal_time(t.source, t.destination, t.size, 1 if t.size <= single_bytes else max_cc)
        out.append(max(ends[i] - t.arrival_s, BOUND_S) / max(ideal, BOUND_S))
    return out
