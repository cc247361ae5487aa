"""Issue 42: ``fstream bench carry`` re-stamps a result only with evidence; ``fstream bench refresh`` plans the rest.

A real carry: a scheduling result made by today's code, carried by running its smoke in a git worktree
of the result's commit and in today's tree, ABBA (a deterministic smoke: every number must be equal).
A metric that moves between the sides refuses the carry and writes no re-stamp. The goals table shows
a stale result with a carry whose code still hashes the same as current, "carried from" its commit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from fstream_bench import refresh
from fstream_bench.core import carry as C
from fstream_bench.core import goals_table as gt
from fstream_bench.core import provenance
from fstream_bench.smokes import SMOKES

FSTREAM = str(Path(sys.executable).with_name("fstream"))


def _pairs(then, today):
    return [{"order": "AB", "then": {"m": a}, "today": {"m": b}} for a, b in zip(then, today)]


def test_within_the_noise_the_same_code_shows_against_itself():
    v = C.verdict(_pairs([100, 104, 98], [101, 99, 103]), exact=False)["m"]
    assert v["within"] and v["noise"] == pytest.approx(0.0577, abs=1e-3)


def test_a_metric_that_moved_beyond_the_noise_is_not_within():
    v = C.verdict(_pairs([100, 101, 100], [110, 111, 109]), exact=False)["m"]
    assert not v["within"] and v["median"] == pytest.approx(1.1, abs=0.01)


def test_an_exact_smoke_needs_every_number_equal():
    assert C.verdict(_pairs([3.0, 3.0], [3.0, 3.0]), exact=True)["m"]["within"]
    assert not C.verdict(_pairs([3.0, 3.0], [3.0, 3.0000001]), exact=True)["m"]["within"]
    # rounding is no change: the ETA's least squares in plain Python (issue 43) against numpy's
    assert C.verdict(_pairs([0.1 + 0.2, 3.0], [0.3, 3.0]), exact=True)["m"]["within"]


def test_the_deadline_smoke_repeats_itself(tmp_path):
    """It drew a fresh seed per run (``--seeds 1``), so no deadline result could ever be carried: its two sides
    differed by up to 14 % against themselves (2026-12-01). Two runs of the smoke now give the same numbers."""
    smoke = SMOKES["deadline sim"]
    got = []
    for i in range(2):
        out = tmp_path / str(i)
        done = subprocess.run([FSTREAM, "bench", smoke.bench, *smoke.args, "--results", str(out)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        got.append(smoke.metrics(json.loads(next(out.glob("deadline-*.json")).read_text())))
    assert len(got[0]) > 10 and got[0] == got[1]


@pytest.fixture(scope="module")
def sched_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("made")
    smoke = SMOKES["scheduling"]
    done = subprocess.run([FSTREAM, "bench", "scheduling", *smoke.args, "--results", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return next(out.glob("scheduling-*.json"))


def test_a_real_carry_between_a_worktree_and_today(sched_result, tmp_path):
    ok, record = C.carry(sched_result, SMOKES["scheduling"], pairs=2, results=tmp_path, log=lambda *_: None)
    body = json.loads(record.read_text())
    assert ok and body["carried"], body["metrics"]
    assert [p["order"] for p in body["pairs"]] == ["AB", "BA"]
    assert body["then"] == json.loads(sched_result.read_text())["provenance"]["commit"]
    assert len(body["metrics"]) > 10 and all(v["within"] for v in body["metrics"].values())
    assert "bench/scheduling/replay.py" in body["files"]
    assert body["code_hash"] == provenance.files_hash(body["files"])
    assert not list(Path(tmp_path).glob("wt-*")) and "wt-" not in subprocess.run(
        ["git", "-C", str(provenance.REPO), "worktree", "list"], capture_output=True, text=True).stdout


def test_a_moved_metric_refuses_the_carry_and_restamps_nothing(sched_result, tmp_path):
    moved = C.Smoke("scheduling", SMOKES["scheduling"].args, lambda d: {"started": d["provenance"]["started_unix"]},
                    exact=True)
    ok, record = C.carry(sched_result, moved, pairs=2, results=tmp_path, log=lambda *_: None)
    body = json.loads(record.read_text())
    assert not ok and not body["carried"] and "files" not in body and "code_hash" not in body
    assert C.carries(tmp_path) == {}


def test_a_result_of_another_bench_is_refused(sched_result, tmp_path):
    with pytest.raises(ValueError, match="is a `scheduling` result; this smoke runs `loopback`"):
        C.carry(sched_result, SMOKES["loopback"], results=tmp_path)


def _goal():
    return gt.Goal("99", "probe", "bench/results/probe-*.json", "fstream bench scheduling",
                   measure=lambda d, _p: (str(d["value"]), "yes"))


def _write_result(root: Path, files: list[str], code_hash: str) -> Path:
    res = root / "bench" / "results" / "probe-20260101-000000.json"
    res.parent.mkdir(parents=True, exist_ok=True)
    res.write_text(json.dumps({"value": 7, "provenance": {
        "bench": "scheduling", "commit": "0" * 40, "modules": [], "files": files, "code_hash": code_hash,
        "started_unix": 0, "load_start": [0.1]}}))
    return res


def test_the_table_shows_a_carried_result_as_current_while_its_code_holds(tmp_path):
    files = ["bench/smokes.py"]
    _write_result(tmp_path, files, "sha256:older")
    gt._carry_cache.clear()
    assert gt.resolve(_goal(), tmp_path).status == "stale"
    steps, _ = refresh.plan(root=tmp_path, goals=[_goal()])
    assert [s.command for s in steps] == ["fstream bench scheduling"] and steps[0].rows == ["issue 99: probe"]
    (tmp_path / "bench/results/carry-20260102-000000.json").write_text(json.dumps({
        "result": "bench/results/probe-20260101-000000.json", "carried": True, "then": "a" * 40, "today": "b" * 40,
        "files": files, "code_hash": provenance.files_hash(files)}))
    gt._carry_cache.clear()
    row = gt.resolve(_goal(), tmp_path)
    assert row.status == "current" and row.measured == "7" and "carried from aaaaaaaaa to bbbbbbbbb" in row.evidence
    assert refresh.plan(root=tmp_path, goals=[_goal()])[0] == []
    (tmp_path / "bench/results/carry-20260103-000000.json").write_text(json.dumps({
        "result": "bench/results/probe-20260101-000000.json", "carried": True, "then": "b" * 40, "today": "c" * 40,
        "files": files, "code_hash": "sha256:not-today"}))
    gt._carry_cache.clear()
    assert gt.resolve(_goal(), tmp_path).status == "stale"  # the newest carry's code has changed since
    gt._carry_cache.clear()


def test_a_part_smoke_carries_only_its_part():
    """`deadline sim` has a smoke, `deadline wan` none: a WAN result is never carried by the simulator's smoke."""
    from fstream_bench.refresh import Step
    from fstream_bench.smokes import smoke_for

    sim = {"provenance": {"bench": "deadline"}, "part": "sim"}
    wan = {"provenance": {"bench": "deadline"}, "part": "wan"}
    assert smoke_for(sim) is SMOKES["deadline sim"] and smoke_for(wan) is None
    assert smoke_for({"provenance": {"bench": "loopback"}}) is SMOKES["loopback"]
    assert Step("fstream bench deadline sim").smoke == "deadline sim"
    assert Step("fstream bench deadline wan").smoke is None
    assert Step("fstream bench loopback --repeat 5").smoke == "loopback"


def test_the_carry_refuses_a_result_of_another_part(tmp_path):
    doc = {"provenance": {"bench": "deadline", "commit": "0" * 40}, "part": "wan"}
    wan = tmp_path / "deadline-wan.json"
    wan.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="is a `deadline wan` result; this smoke runs `deadline sim`"):
        C.carry(wan, SMOKES["deadline sim"], results=tmp_path)


def test_the_refresh_writes_the_table_with_the_carries_it_made(tmp_path):
    """The refresh read the carries once when it planned; the table it wrote at the end ignored the ones it made
    since, and counted 35 of 59 rows current where the committed results gave 49 (2026-11-29): it forgets first."""
    bench_md = tmp_path / "BENCHMARKS.md"
    bench_md.write_text((gt.REPO / "BENCHMARKS.md").read_text())
    gt.forget()
    rows = gt.rows_of(refresh.GOALS)
    current = sum(r.status == "current" for r in rows)
    carried = [r for r in rows if "carried from" in r.evidence]
    if not carried:
        pytest.skip("no committed result is carried to today's code here")
    results = gt.REPO / "bench" / "results"
    gt._carry_cache[results] = {}  # what a refresh that started before its carries remembered
    assert refresh.main(["--only", "no row is named this", "--results", str(tmp_path),
                         "--benchmarks", str(bench_md)]) == 0
    gt.forget()
    assert sum(r.status == "current" for r in gt.rows_of(refresh.GOALS)) == current
    assert all(r.evidence in bench_md.read_text() for r in carried)


def test_a_row_measured_over_several_runs_is_run_that_many_times(tmp_path, monkeypatch):
    """`deadline wan (3 times)` reached the shell as `deadline wan (3 times)`: argparse refused it (exit 2) and the
    refresh re-measured nothing. The note is the number of runs, not words of the command."""
    from fstream_bench.refresh import Step

    step = Step("fstream bench deadline wan (3 times)", as_root=True)
    assert step.times == 3 and step.argv == ["bench", "deadline", "wan"] and step.smoke is None
    assert Step("fstream bench gil --repeat 5").times == 1 and Step("fstream bench gil --repeat 5").argv == [
        "bench", "gil", "--repeat", "5"]
    ran: list[list[str]] = []
    monkeypatch.setattr(refresh, "_run", lambda argv, log: ran.append(argv[1:]) or 0)
    monkeypatch.setattr(refresh, "plan", lambda only=None: ([step], []))
    monkeypatch.setattr(refresh.os, "geteuid", lambda: 0)
    monkeypatch.setattr(refresh.goals_table, "write", lambda *a, **k: [types.SimpleNamespace(status="current")])
    assert refresh.main(["--results", str(tmp_path), "--benchmarks", str(tmp_path / "B.md")]) == 0
    assert ran == [["bench", "deadline", "wan"]] * 3
