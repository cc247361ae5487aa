"""SEAL that shares below the knee (issue 44): shares where SEAL as written waits, waits past the knee, gives a small
task an equal share; the floor bounds every replay; the idealized SRPT orders and divides the ends as it says;
``fstream bench seal-load`` records its fresh seeds, and the goals table reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fstream_bench.scheduling import seal_load
from fstream_bench.scheduling.readers import seal_at_load, steal_share_at_load
from fstream_provider.tuning import sched_sim as S
from fstream_provider.tuning import trace as T
from fstream_provider.tuning.sched_model import EndpointCurve, LoadModel
from fstream_provider.tuning.scheduler import SealConfig, SealScheduler, Task
from fstream_provider.tuning.sched_srpt import srpt_estimate
from fstream_provider.tuning.seal_share import SealShareScheduler

GB = 1e9


def _busy(kind, running: list[tuple[float, int]], size: float = 4 * GB):
    """A 10 Gbit/s source and destination (knee: 20 streams), ``running``'s (bytes left, cc) tasks on them for a
    minute at a rate that saturates both, and a task of ``size`` that has just arrived: the scheduler and the
    actions of its next cycle."""
    model = LoadModel({h: EndpointCurve(10e9, unit_bps=1e9, overload=0.1) for h in ("src", "dst")}, startup_s=1.0)
    s = kind(model, SealConfig(), now=0.0)
    total = sum(cc for _, cc in running)
    for i, (left, cc) in enumerate(running):
        s.submit(Task(f"r{i}", "src", "dst", 20 * GB, arrival=0.0))
        t = s.tasks[f"r{i}"]
        t.state, t.cc, t.trans_s = "running", cc, 60.0
        s.progress(t.id, 20 * GB - left, 10e9 * cc / total)
    s.cycle(60.0)
    s.submit(Task("w", "src", "dst", size, arrival=60.0))
    return s, [a for a in s.cycle(60.5) if a.task == "w"]


def test_below_the_knee_a_large_task_shares_where_seal_as_written_makes_it_wait():
    running = [(10 * GB, 5), (12 * GB, 5)]  # 10 streams: saturated, half the knee
    seal, actions = _busy(SealScheduler, running)
    assert seal.tasks["w"].state == "waiting" and actions == []
    share, actions = _busy(SealShareScheduler, running)
    assert share.tasks["w"].state == "running" and share.name == "seal+share"
    assert [(a.kind, a.cc) for a in actions] == [("start", 5)]  # the mean cc beside it: an equal share
    assert "below the knee at src 15 of 20 streams, dst 15 of 20 streams" in actions[0].reason
    off, actions = _busy(lambda m, c, now: SealShareScheduler(m, c, now, admit=False), running)
    assert off.tasks["w"].state == "waiting" and actions == [] and off.name == "seal+share-admit"


def test_past_the_knee_seal_decides_and_the_task_waits():
    share, actions = _busy(SealShareScheduler, [(10 * GB, 4)] * 5)  # 20 streams: one more share passes the knee
    assert share.tasks["w"].state == "waiting" and actions == []
    fewer, actions = _busy(SealShareScheduler, [(10 * GB, 4)] * 4)  # 16 + 4: at the knee, not past it
    assert fewer.tasks["w"].state == "running" and [a.cc for a in actions] == [4]


def test_a_small_task_on_a_saturated_end_gets_an_equal_share_not_one_stream():
    running = [(10 * GB, 5), (12 * GB, 5)]
    seal, actions = _busy(SealScheduler, running, size=0.5 * GB)
    assert [(a.kind, a.cc) for a in actions] == [("start", 1)]  # FindThrCC on a saturated end
    share, actions = _busy(lambda m, c, now: SealShareScheduler(m, c, now, admit=False), running, size=0.5 * GB)
    assert [(a.kind, a.cc) for a in actions] == [("start", 5)] and "cc 1 -> 5: an equal share" in actions[0].reason
    tiny, actions = _busy(SealShareScheduler, running, size=5e6)  # at or below single_bytes: one stream still
    assert [a.cc for a in actions] == [1]


def test_the_floor_is_below_every_replayed_task_and_a_lone_task_sits_on_it():
    trace = T.generate("25%", scale=0.1, seed=3)
    floor = S.slowdown_floor(trace, window_s=90)
    for name in ("basecc4", "seal", "seal-share"):
        rows = S.replay(trace, S.make_scheduler(name), window_s=90, seed=3).tasks
        for f, row in zip(floor, rows):
            if f is not None and row["slowdown"] is not None:
                assert row["slowdown"] >= f - 1e-9, (name, row["id"])
    lone = [T.TraceTask(12.3, T.SOURCE, "gordon", 3 * GB, "interactive")]
    got = S.replay(lone, S.make_scheduler("seal"), external_load=0.0).tasks[0]["slowdown"]
    assert got == pytest.approx(S.slowdown_floor(lone)[0], abs=0.15)  # the replay's steps of 0.1 s only


def test_idealized_srpt_serves_the_shorter_first_and_gives_the_other_what_its_ends_have_left():
    ends = {"a": EndpointCurve(8e9), "b": EndpointCurve(8e9), "c": EndpointCurve(2e9)}
    # one pair: the 4 s task first (ready at 1 s, done at 5 s), then the 8 s task (done at 13 s; ideal 9 s)
    one = [T.TraceTask(0.0, "a", "b", int(8 * GB), "interactive"),
           T.TraceTask(0.0, "a", "b", int(4 * GB), "interactive")]
    assert srpt_estimate(one, ends) == pytest.approx([13 / 9, 1.0], abs=0.02)
    # two destinations: the task to c (2 Gbit/s alone, 4 s) takes 2 of the source's 8, the other the 6 left until
    # it ends at 5 s; then 8: 3 GB moved by 5 s, 5 GB in 5 s more, done at 10 s against an ideal of 9 s
    two = [T.TraceTask(0.0, "a", "b", int(8 * GB), "interactive"),
           T.TraceTask(0.0, "a", "c", int(1 * GB), "interactive"), T.TraceTask(0.0, "a", "b", int(50 * GB), "batch")]
    assert srpt_estimate(two, ends) == pytest.approx([10 / 9, 1.0, None], abs=0.02)


def test_idealized_srpt_is_never_below_the_floor_and_below_the_baselines_under_contention():
    trace = T.generate("60%", scale=0.1, seed=5)
    floor, srpt = S.slowdown_floor(trace, window_s=90), srpt_estimate(trace, window_s=90)
    assert all(s >= f - 1e-9 for f, s in zip(floor, srpt) if f is not None)
    avg = sum(s for s in srpt if s is not None) / sum(s is not None for s in srpt)
    best = min(S.replay(trace, S.make_scheduler(b), window_s=90, seed=5).summary()["avg_slowdown"] for b in S.BASELINES)
    assert avg < best and avg > sum(f for f in floor if f is not None) / sum(f is not None for f in floor)


def test_bench_seal_load_records_fresh_seeds_and_the_goal_reads_it(tmp_path: Path, capsys):
    assert seal_load.main(["--fresh", "2", "--traces", "25%", "--scale", "0.05", "--results", str(tmp_path)]) == 0
    path = next(tmp_path.glob("seal-load-*.json"))
    doc = json.loads(path.read_text())
    assert doc["seeds_fresh"] and len(doc["seeds"]) == 2 and [r["seed"] for r in doc["rows"]] == doc["seeds"]
    row = doc["rows"][0]
    assert set(row["results"]) == {*seal_load.ALGORITHMS, *seal_load.ABLATIONS}
    assert set(row["batch"]) == set(seal_load.BATCH_ALGORITHMS)
    assert row["floor"]["avg_slowdown"] <= min(r["avg_slowdown"] for r in row["results"].values())
    assert row["floor"]["avg_slowdown"] <= row["srpt"]["avg_slowdown"]
    again = S.replay(T.generate("25%", scale=0.05, seed=row["seed"]), S.make_scheduler("seal-share"),
                     window_s=45, seed=row["seed"]).summary()
    assert again["avg_slowdown"] == pytest.approx(row["results"]["seal-share"]["avg_slowdown"])  # seed replays it
    text, met = seal_at_load(doc, path)
    assert text.startswith("srpt-share: 25%: ") and "2 runs" in text and met.startswith("0 of 3 loads")
    assert "seal-share " in text and "idealized SRPT " in text
    for row, share in zip(doc["rows"], (0.9, 0.5)):  # the floor 10 % and 50 % below the best baseline
        row["floor"]["avg_slowdown"] = share * min(row["results"][b]["avg_slowdown"] for b in S.BASELINES)
    assert "20 % lower is below the floor in 1 of 2 runs" in seal_at_load(doc, path)[0]
    for row in doc["rows"]:  # a result from before srpt-share: the goal reads seal-share, as it did
        del row["results"]["srpt-share"]
    assert seal_at_load(doc, path)[0].startswith("seal-share: 25%: ")
    text, met = steal_share_at_load(doc, path)
    assert "25%: " in text and met in ("yes", "no")
    assert "seed" in capsys.readouterr().out
    png = tmp_path / "seal-load.png"
    assert seal_load.main(["--figure", str(path), str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_bench_seal_load_help_prints(capsys):
    """Regression: ``--traces``' default (25%,45%,...) went into argparse's help unescaped, so ``--help`` failed."""
    import pytest

    from fstream_bench.scheduling import seal_load

    with pytest.raises(SystemExit) as ex:
        seal_load.main(["--help"])
    assert ex.value.code == 0 and "25%" in capsys.readouterr().out
