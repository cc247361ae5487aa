"""Shortest remaining first past the knee (issue 44, ``tuning.srpt_share``): below the knee every task runs at the
concurrency it would use alone; past it the shortest take the streams and the longer keep one (resized, never
stopped); a starting task's streams count for nothing until it moves; batch tasks yield to interactive ones; the
replay runs it by name and every decision says why."""

from __future__ import annotations

import pytest

from fstream_provider.tuning import sched_sim as S
from fstream_provider.tuning import trace as T
from fstream_provider.tuning.sched_model import EndpointCurve, LoadModel
from fstream_provider.tuning.scheduler import SealConfig, Task
from fstream_provider.tuning.srpt_share import SrptShareScheduler

GB = 1e9


def _board(running: list[tuple[str, float, int, str]], **switches) -> SrptShareScheduler:
    """A 10 Gbit/s source and destination (knee: 20 streams, one stream 1 Gbit/s) with ``running``'s (id, bytes
    left, cc, class) tasks moving bytes for a minute."""
    model = LoadModel({h: EndpointCurve(10e9, unit_bps=1e9, overload=0.1) for h in ("src", "dst")}, startup_s=1.0)
    s = SrptShareScheduler(model, SealConfig(), now=0.0, **switches)
    for tid, left, cc, klass in running:
        s.submit(Task(tid, "src", "dst", 100 * GB, arrival=0.0, klass=klass))
        t = s.tasks[tid]
        t.state, t.cc, t.trans_s = "running", cc, 60.0
        s.progress(tid, 100 * GB - left, 1e9 * cc)
    s.cycle(60.0)
    return s


def _by_task(actions) -> dict:
    return {a.task: a for a in actions}


def test_below_the_knee_every_task_starts_at_its_concurrency_alone():
    s = _board([])
    for i in range(2):
        s.submit(Task(f"w{i}", "src", "dst", 4 * GB, arrival=60.0))
    got = _by_task(s.cycle(60.5))
    assert {k: (a.kind, a.cc) for k, a in got.items()} == {"w0": ("start", 10), "w1": ("start", 10)}
    assert "wants 10" in got["w0"].reason and got["w0"].reason.startswith("srpt-share: start w0 cc=10")


def test_past_the_knee_the_shortest_takes_the_streams_and_the_longest_keeps_one():
    s = _board([("r0", 20 * GB, 10, "interactive"), ("r1", 30 * GB, 10, "interactive")])
    s.submit(Task("w", "src", "dst", 2 * GB, arrival=60.0))
    first = _by_task(s.cycle(60.5))
    assert {k: (a.kind, a.cc) for k, a in first.items()} == {"w": ("start", 10)}  # its start-up counts nothing
    s.progress("w", 0.0, 0.0)
    assert s.cycle(61.0) == []  # still starting (0.5 s of 1)
    s.progress("w", 0.5 * GB, 8e9)
    moved = _by_task(s.cycle(62.0))  # w moves: w 10 + r0 10 fill the knee, r1 (the longest) keeps one stream
    assert {k: (a.kind, a.cc) for k, a in moved.items()} == {"r1": ("resize", 1)}
    assert "shorter tasks fill its ends" in moved["r1"].reason and s.tasks["r1"].state == "running"
    s.finished("w")
    back = _by_task(s.cycle(62.5))
    assert {k: (a.kind, a.cc) for k, a in back.items()} == {"r1": ("resize", 10)}
    assert "room below the knee" in back["r1"].reason


def test_counting_starting_tasks_resizes_at_once():
    """The ablation: counted, w's start-up takes r1's streams in the cycle w starts in."""
    s = _board([("r0", 20 * GB, 10, "interactive"), ("r1", 30 * GB, 10, "interactive")], count_starting=True)
    s.submit(Task("w", "src", "dst", 2 * GB, arrival=60.0))
    got = _by_task(s.cycle(60.5))
    assert {k: (a.kind, a.cc) for k, a in got.items()} == {"w": ("start", 10), "r1": ("resize", 1)}
    assert s.name == "srpt-share+count-starting"


def test_a_longer_task_waits_past_the_knee_but_a_one_stream_task_starts():
    s = _board([("r0", 2 * GB, 10, "interactive"), ("r1", 3 * GB, 10, "interactive")])
    s.submit(Task("big", "src", "dst", 50 * GB, arrival=60.0))
    s.submit(Task("tiny", "src", "dst", 5e6, arrival=60.0))
    got = _by_task(s.cycle(60.5))
    assert {k: (a.kind, a.cc) for k, a in got.items()} == {"tiny": ("start", 1)}
    assert s.tasks["big"].state == "waiting"


def test_starts_stop_at_two_knees_of_moving_and_starting_streams():
    """In a burst every waiting task would start in one cycle (starting ones count for nothing): the limit stops
    starts at 40 streams at an end (2 knees): r0's 10 and three starts of 10."""
    burst = [Task(f"w{i}", "src", "dst", 5 * GB, arrival=60.0) for i in range(10)]
    s = _board([("r0", 1 * GB, 10, "interactive")])
    for t in burst:
        s.submit(t)
    got = s.cycle(60.5)
    assert [(a.task, a.cc) for a in got] == [("w0", 10), ("w1", 10), ("w2", 10)]
    assert "30 with those starting" in got[2].reason and s.tasks["w3"].state == "waiting"
    unlimited = _board([("r0", 1 * GB, 10, "interactive")], start_limit=float("inf"))
    for t in burst:
        unlimited.submit(Task(t.id, t.src, t.dst, t.size, t.arrival))
    assert [a.task for a in unlimited.cycle(60.5)] == [f"w{i}" for i in range(10)]


def test_batch_tasks_yield_to_interactive_ones_whatever_they_have_left():
    s = _board([("i1", 30 * GB, 10, "interactive"), ("b1", 2 * GB, 10, "batch"), ("i2", 40 * GB, 1, "interactive")])
    assert s.tasks["i2"].cc == 10 and s.tasks["b1"].cc == 1  # the first cycle: i1, then i2 raised; b1 gave way
    assert s.cycle(60.5) == []


def test_an_unknown_order_is_refused_by_name():
    model = LoadModel({"a": EndpointCurve(1e9)})
    with pytest.raises(ValueError, match="srpt-share order 'fifo': expected one of remaining, xfactor"):
        SrptShareScheduler(model, order="fifo")
    with pytest.raises(ValueError, match="srpt-share start_limit 0.5: expected at least 1"):
        SrptShareScheduler(model, start_limit=0.5)


def test_the_replay_runs_it_by_name_and_every_task_ends_with_reasons():
    trace = T.generate("60%", scale=0.05, seed=7)
    result = S.replay(trace, S.make_scheduler("srpt-share"), window_s=45, seed=7)
    assert result.name == "srpt-share" and all(t["end"] is not None for t in result.tasks)
    assert result.preemptions == 0 and any("srpt-share: start" in d for d in result.decisions)
    ablation = S.make_scheduler("srpt-share", order="xfactor", count_starting=True)
    assert ablation.name == "srpt-share+count-starting+xfactor"
