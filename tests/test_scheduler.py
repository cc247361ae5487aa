"""SEAL/STEAL (issue #11): xfactor, FindThrCC, saturation, preemption choice, lambda limits, traces, replay."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fstream_provider.tuning import sched_sim as S
from fstream_provider.tuning import trace as T
from fstream_provider.tuning.sched_model import EndpointCurve, LoadModel, find_thr_cc
from fstream_provider.tuning.scheduler import SealConfig, SealScheduler, Task

GB = 1e9


def _model(**caps: float) -> LoadModel:
    return LoadModel({k: EndpointCurve(v, unit_bps=1e9, overload=0.1) for k, v in caps.items()}, startup_s=1.0)


def _sched(cfg: SealConfig | None = None, **caps: float) -> SealScheduler:
    return SealScheduler(_model(**(caps or {"src": 10e9, "dst": 10e9})), cfg or SealConfig())


def test_find_thr_cc_stops_when_one_more_cc_buys_less_than_beta_and_returns_a_matching_pair():
    m = _model(src=10e9, dst=2e9)  # the 2 Gbit/s end limits: a third cc buys nothing
    cc, thr = find_thr_cc(lambda c: m.throughput("src", "dst", c), 16, 1.1)
    assert (cc, thr) == (2, 2e9)
    assert find_thr_cc(lambda c: m.throughput("src", "dst", c), 1, 1.1) == (1, 1e9)
    with pytest.raises(ValueError, match="beta >= 1"):
        find_thr_cc(lambda c: 1.0, 4, 0.9)


def test_on_a_busy_endpoint_the_printed_findthrcc_grabs_share_and_aggregate_gain_does_not():
    m = _model(src=10e9, dst=10e9)
    share = lambda c: m.throughput("src", "dst", c, 20, 20)  # noqa: E731 - 20 cc already saturate both ends
    printed, _ = find_thr_cc(share, 16, 1.1)
    ours, _ = find_thr_cc(share, 16, 1.1, lambda c: m.aggregate("src", "dst", c, 20, 20))
    assert printed >= 4 and ours == 1  # more cc only moves bandwidth from the others to this task


def test_xfactor_is_one_for_a_task_alone_and_grows_with_its_wait():
    s = _sched()
    s.submit(Task("a", "src", "dst", 10 * GB, arrival=0.0))
    s.cycle(0.0)
    assert s.tasks["a"].state == "running" and s.tasks["a"].xfactor == pytest.approx(1.0)
    s2 = _sched(SealConfig(max_total_cc=1))  # one cc per endpoint: the second task must wait
    s2.submit(Task("a", "src", "dst", 10 * GB, arrival=0.0))
    s2.cycle(0.0)
    s2.submit(Task("b", "src", "dst", 10 * GB, arrival=0.0))
    s2.progress("a", 0.0, 1e9)
    for now in (1.0, 2.0, 3.0):
        s2.cycle(now)
    b = s2.tasks["b"]
    assert b.state == "waiting"
    assert b.xfactor == pytest.approx((3.0 + b.ideal_s + 9 * 10 * GB * 8 / 1e9 / 10) / b.ideal_s, rel=0.35)
    assert b.xfactor > 1.2


def test_saturation_by_aggregate_rate_and_by_a_proportionally_insignificant_gain():
    s = _sched(SealConfig(small_bytes=0))
    s.submit(Task("a", "src", "dst", 50 * GB, arrival=0.0))
    s.cycle(0.0)
    a = s.tasks["a"]
    assert a.cc == 10  # the ends are 10 Gbit/s, one cc moves 1
    s.progress("a", 1 * GB, 9.6e9)  # >= 95 % of the known maximum
    s.cycle(0.5)
    assert s._saturated("src") and s._saturated("dst")
    s.progress("a", 2 * GB, 5e9)  # below 95 %, but doubling a's 10 cc would add nothing: (b)
    s.cycle(1.0)
    assert s._aggregate("src") < 0.95 * 10e9 and s._saturated("src")


def _old_and_new(**cfg) -> SealScheduler:
    """A 400 GB task running alone on 4 Gbit/s ends capped at 4 cc, and a 20 GB task arriving behind it."""
    s = _sched(SealConfig(small_bytes=0, max_total_cc=4, **cfg), src=4e9, dst=4e9)
    s.submit(Task("old", "src", "dst", 400 * GB, arrival=0.0))
    s.cycle(0.0)
    s.submit(Task("new", "src", "dst", 20 * GB, arrival=0.0))
    return s


def test_a_waiting_task_preempts_only_a_running_one_whose_xfactor_is_lower_by_pf():
    s = _old_and_new(preempt_guard_s=0)
    acts = []
    t = 0.0
    while not any(a.kind == "preempt" for a in acts) and t < 600:
        t += 0.5
        s.progress("old", s.tasks["old"].done_bytes + 0.25 * GB, 4e9)
        acts = s.cycle(t)
        assert s.tasks["new"].state == "running" or all(a.kind != "start" for a in acts)
    pre = [a for a in acts if a.kind == "preempt"]
    assert pre and pre[0].task == "old" and pre[0].by == "new" and "pf=1.5" in pre[0].reason
    assert s.tasks["new"].xfactor >= 1.5 * s.tasks["old"].xfactor * 0.99
    assert s.tasks["old"].state == "waiting" and s.tasks["old"].preemptions == 1


def test_the_preempt_guard_spares_a_task_that_just_started():
    s = _old_and_new(preempt_guard_s=30.0)
    kinds = set()
    for i in range(1, 50):  # 24.5 s: the waiting task's xfactor passes pf x old's, the guard holds
        s.progress("old", i * 0.25 * GB, 4e9)
        kinds |= {a.kind for a in s.cycle(i * 0.5)}
    assert "preempt" not in kinds and s.tasks["new"].xfactor > 1.5 * s.tasks["old"].xfactor


def test_steal_batch_waits_above_lambda_never_preempts_batch_and_yields_to_interactive():
    cfg = SealConfig(steal=True, lambda_=0.5, small_bytes=0, preempt_guard_s=0)
    s = _sched(cfg, src=10e9, dst=10e9)
    s.submit(Task("b1", "src", "dst", 500 * GB, arrival=0.0, klass="batch"))
    s.cycle(0.0)
    assert s.tasks["b1"].state == "running"
    s.submit(Task("b2", "src", "dst", 500 * GB, arrival=0.0, klass="batch"))
    s.progress("b1", 1 * GB, 6e9)  # above lambda x max: no more batch
    acts = s.cycle(0.5)
    assert s.tasks["b2"].state == "waiting" and not any(a.kind == "preempt" for a in acts)
    assert s.tasks["b2"].xfactor < 1e-3  # batch xfactors are scaled down (Listing 3, line 29.2)
    s.submit(Task("i", "src", "dst", 5 * GB, arrival=0.5))
    acts = s.cycle(1.0)
    assert [a.task for a in acts if a.kind == "preempt"] == ["b1"]
    assert s.tasks["i"].state == "running" and "batch" in next(a.reason for a in acts if a.kind == "preempt")


def test_steal_promotes_a_batch_task_after_its_age():
    s = _sched(SealConfig(steal=True, promote_after_s=10.0))
    s.submit(Task("b", "src", "dst", 5 * GB, arrival=0.0, klass="batch"))
    s.tasks["b"].state = "waiting"
    s.cycle(5.0)
    assert s.tasks["b"].klass == "batch"
    s.tasks["b"].state = "waiting"
    s.cycle(10.0)
    assert s.tasks["b"].klass == "interactive"


def test_trace_round_trip_and_a_bad_row_names_its_line(tmp_path: Path):
    tasks = T.generate("45%", scale=0.1, seed=3, batch=True)
    path = tmp_path / "t.csv"
    T.write_trace(tasks, path)
    back = T.read_trace(path)
    assert [(t.destination, t.size, t.klass) for t in back] == [(t.destination, t.size, t.klass) for t in tasks]
    text = path.read_text().splitlines()
    text[3] = text[3].replace("interactive", "urgent").replace("batch", "urgent")
    path.write_text("\n".join(text) + "\n")
    with pytest.raises(ValueError, match=r"line 4: class must be interactive or batch, got 'urgent'"):
        T.read_trace(path)


def test_generated_traces_follow_table2_counts_and_the_load():
    for name in ("25%", "60%"):
        tasks = T.generate(name, scale=0.5, seed=1)
        counts = [sum(1 for t in tasks if t.category() == c) for c, _lo, _hi in T.CATEGORIES]
        assert counts == [round(n * 0.5) for n in T.TABLE2[name]]
        volume = sum(t.size for t in tasks)
        assert volume == pytest.approx(T.LOADS[name] * T.SOURCE_BPS / 8 * 900 * 0.5, rel=0.01)
        assert max(t.arrival_s for t in tasks) <= 450


def test_replay_resumes_a_preempted_task_from_its_checkpoint_without_resending_committed_bytes():
    trace = [T.TraceTask(0.0, T.SOURCE, "darter", int(60 * GB), "interactive"),
             T.TraceTask(20.0, T.SOURCE, "darter", int(2 * GB), "interactive")]
    cfg = dict(small_bytes=0, max_total_cc=2, preempt_guard_s=0, pf=1.0)  # as printed: preempts back and forth
    res = S.replay(trace, S.make_scheduler("seal", **cfg), external_load=0.0)
    big = next(r for r in res.tasks if r["size"] == int(60 * GB))
    assert big["preempted"] >= 1 and big["end"] is not None
    # every byte it moved is its size plus what it moved after its last 1 s checkpoint before each preemption
    # (2 Gbit/s end): committed bytes are never sent again
    assert big["moved_bytes"] == pytest.approx(big["size"] + big["resent_bytes"])
    assert big["resent_bytes"] <= big["preempted"] * 2e9 / 8 * 1.0 + 1


def test_bench_scheduling_prints_one_json_object_per_algorithm(tmp_path: Path):
    path = tmp_path / "t.csv"
    T.write_trace(T.generate("25%", scale=0.05, seed=2), path)
    out = subprocess.run([sys.executable, "-m", "fstream_bench.cli", "scheduling", "--trace", str(path), "--json",
                          "--algorithms", "basecc1,seal"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["algorithm"] for r in rows] == ["basecc1", "seal"]
    for r in rows:
        assert r["avg_slowdown"] >= 1.0 and r["worst_slowdown"] >= r["avg_slowdown"] and r["avg_turnaround"] > 0
        assert set(r["per_class"]) <= {c for c, _lo, _hi in T.CATEGORIES}
    bad = subprocess.run([sys.executable, "-m", "fstream_bench.cli", "scheduling", "--trace", str(tmp_path / "no.csv")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no.csv" in bad.stderr


def test_the_preempt_guard_ends_the_back_and_forth_of_the_printed_rule():
    """As printed, a task just preempted outranks its preemptor by pf at once (its xfactor counts the
    preemptor's contention) and takes its place back every cycle; the guard compares with the victim gone."""
    trace = [T.TraceTask(0.0, T.SOURCE, "darter", int(60 * GB), "interactive"),
             T.TraceTask(20.0, T.SOURCE, "darter", int(2 * GB), "interactive")]
    printed = S.replay(trace, S.make_scheduler("seal", small_bytes=0, max_total_cc=2, preempt_guard_s=0),
                       external_load=0.0)  # the paper's pf = 1.5
    guarded = S.replay(trace, S.make_scheduler("seal", small_bytes=0, max_total_cc=2, preempt_guard_s=5.0),
                       external_load=0.0)
    assert printed.preemptions >= 10
    assert guarded.preemptions == 1  # the small task preempts the large one once, and keeps its place
    small = next(r for r in guarded.tasks if r["size"] == int(2 * GB))
    assert small["slowdown"] < next(r for r in printed.tasks if r["size"] == int(2 * GB))["slowdown"]
