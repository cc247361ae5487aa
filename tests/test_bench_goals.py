"""``fstream bench report --goals / --check``: the goals table is what its results and today's code say.

Each case builds a tiny results tree and BENCHMARKS.md in a temp dir, with a result whose
provenance hashes a module of a temp package on sys.path, and changes one thing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fstream_bench.core import goals_table as gt, provenance
from fstream_bench.core.runstats import med_range
from fstream_bench.goals import GOALS

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def world(tmp_path, monkeypatch):
    pkg = tmp_path / "pkgs" / "goalmod_probe"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Probe."""\n\ndef rate():\n    return 1  # one\n')
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    gt._hash_cache.clear()
    root = tmp_path / "repo"
    (root / "bench" / "results").mkdir(parents=True)
    md = root / "BENCHMARKS.md"
    md.write_text(f"# B\n\n## Goals at a glance\n\n{gt.BEGIN}\n{gt.END}\n\n## More\n")

    def result(name: str, runs: list[float], modules=("goalmod_probe",)) -> Path:
        prov = provenance.finish(provenance.start("probe", ["--x", "1"], list(modules)))
        # what the probe's run executed: the probe package (outside the repository, hashed by its path)
        prov["files"] = [str(pkg / "__init__.py")]
        prov["code_hash"] = provenance.files_hash(prov["files"])
        p = root / "bench" / "results" / name
        p.write_text(json.dumps({"provenance": prov, "runs": runs}))
        return p

    goal = gt.Goal("99", "probe ≥ 2", "bench/results/probe-*.json", "fstream bench probe",
                   measure=lambda doc, _: (med_range(doc["runs"]),
                                           "yes" if sorted(doc["runs"])[len(doc["runs"]) // 2] >= 2 else "no"))
    yield {"root": root, "md": md, "pkg": pkg, "result": result, "goal": goal}
    gt._hash_cache.clear()


def test_current_row_shows_median_and_range_of_every_run(world):
    world["result"]("probe-20260101-000000.json", [1.0, 3.0, 2.5])
    rows = gt.write(world["md"], [world["goal"]], world["root"])
    assert rows[0].status == "current"
    text = world["md"].read_text()
    assert "| 99 | probe ≥ 2 | 2.50 (1.00–3.00, 3 runs) | yes | `bench/results/probe-20260101-000000.json` at " in text
    assert text.startswith("# B\n") and text.endswith("## More\n")
    assert gt.check(world["md"], [world["goal"]], world["root"]) == []


def test_newest_result_by_stamp_is_the_evidence(world):
    world["result"]("probe-20260101-000000.json", [5.0])
    world["result"]("probe-20260301-000000.json", [1.0])
    rows = gt.rows_of([world["goal"]], world["root"])
    assert rows[0].measured == "1.00 (1 run)" and rows[0].met == "no"


def test_changed_code_makes_the_committed_row_fail_until_shown_stale(world):
    world["result"]("probe-20260101-000000.json", [3.0])
    gt.write(world["md"], [world["goal"]], world["root"])
    # a comment or a docstring is not a code change
    (world["pkg"] / "__init__.py").write_text('"""Reworded."""\n\ndef rate():\n    return 1\n')
    gt._hash_cache.clear()
    assert gt.check(world["md"], [world["goal"]], world["root"]) == []
    # a change to what runs is
    (world["pkg"] / "__init__.py").write_text('"""Probe."""\n\ndef rate():\n    return 2\n')
    gt._hash_cache.clear()
    failures = gt.check(world["md"], [world["goal"]], world["root"])
    assert len(failures) == 1 and "issue 99, “probe ≥ 2”" in failures[0] and "code changed" in failures[0]
    rows = gt.write(world["md"], [world["goal"]], world["root"])
    assert rows[0].status == "stale"
    assert "| was: 3.00 (1 run) | stale (was “yes”) |" in world["md"].read_text()
    assert gt.check(world["md"], [world["goal"]], world["root"]) == []
    strict = gt.check(world["md"], [world["goal"]], world["root"], strict=True)
    assert len(strict) == 1 and "stale" in strict[0]


def test_missing_result_fails_naming_the_row(world):
    failures = gt.check(world["md"], [world["goal"]], world["root"])
    assert len(failures) == 1
    assert "issue 99, “probe ≥ 2”: its result is missing: nothing matches bench/results/probe-*.json" == failures[0]


def test_hand_edited_number_fails(world):
    world["result"]("probe-20260101-000000.json", [3.0])
    gt.write(world["md"], [world["goal"]], world["root"])
    world["md"].write_text(world["md"].read_text().replace("3.00 (1 run)", "9.00 (1 run)"))
    failures = gt.check(world["md"], [world["goal"]], world["root"])
    assert len(failures) == 1 and "differs from what its result says" in failures[0]


def test_row_no_goal_produces_fails(world):
    world["result"]("probe-20260101-000000.json", [3.0])
    gt.write(world["md"], [world["goal"]], world["root"])
    world["md"].write_text(world["md"].read_text().replace(gt.END, "| 1 | invented | 2× | yes | – |\n" + gt.END))
    failures = gt.check(world["md"], [world["goal"]], world["root"])
    assert failures == ["BENCHMARKS.md's goals table has a row no goal in bench/goals.py produces: "
                        "| 1 | invented | 2× | yes | – |"]


def test_result_without_provenance_is_history_never_met(world):
    (world["root"] / "bench" / "results" / "probe-20250101-000000.json").write_text(json.dumps({"runs": [3.0]}))
    old = gt.Goal("99", "probe ≥ 2", "bench/results/probe-*.json", "fstream bench probe", was=("3.0", "yes"))
    row = gt.resolve(old, world["root"])
    assert row.status == "unrecorded" and row.measured == "was: 3.0" and row.met == "unverified (was “yes”)"
    assert "re-measure: `fstream bench probe`" in row.evidence
    bare = gt.Goal("99", "probe ≥ 2", "bench/results/probe-*.json", "fstream bench probe")
    assert "no provenance" in gt.resolve(bare, world["root"]).problem


def test_result_that_lacks_what_the_goal_reads_fails(world):
    world["result"]("probe-20260101-000000.json", [3.0])
    p = world["root"] / "bench" / "results" / "probe-20260101-000000.json"
    doc = json.loads(p.read_text())
    del doc["runs"]
    p.write_text(json.dumps(doc))
    row = gt.resolve(world["goal"], world["root"])
    assert row.status == "broken" and "does not hold what the goal reads (KeyError" in row.problem


@pytest.mark.slow
def test_repository_goals_table_matches_its_results():
    """What CI checks (``make test`` runs the command too): the committed table is what the results say."""
    out = subprocess.run([sys.executable, "-m", "fstream_bench.cli", "report", "--check",
                          "--benchmarks", str(REPO / "BENCHMARKS.md")], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"matches its {len(GOALS)} results" in out.stdout


def test_select_takes_the_newest_result_of_the_right_kind(world):
    """One bench writing two kinds of result (e.g. scheduling with and without --batch): each row reads its own."""
    world["result"]("probe-20260101-000000.json", [7.0])
    p = world["result"]("probe-20260301-000000.json", [1.0])
    doc = json.loads(p.read_text())
    doc["batch"] = True
    p.write_text(json.dumps(doc))
    g = world["goal"]
    plain = gt.Goal(g.issue, g.goal, g.source, g.rerun, measure=g.measure, select=lambda d: not d.get("batch"))
    batch = gt.Goal(g.issue, g.goal, g.source, g.rerun, measure=g.measure, select=lambda d: bool(d.get("batch")))
    assert gt.resolve(plain, world["root"]).measured == "7.00 (1 run)"
    assert gt.resolve(batch, world["root"]).measured == "1.00 (1 run)"
    none = gt.Goal(g.issue, g.goal, g.source, g.rerun, measure=g.measure, select=lambda d: False)
    assert "nothing matches" in gt.resolve(none, world["root"]).problem


def test_a_pending_row_says_why_it_was_not_re_measured(world):
    (world["root"] / "bench" / "results" / "probe-20250101-000000.json").write_text(json.dumps({"runs": [3.0]}))
    g = gt.Goal("99", "probe ≥ 2", "bench/results/probe-*.json", "fstream bench probe", was=("3.0", "yes"),
                pending="30 minutes of exclusive WAN time")
    row = gt.resolve(g, world["root"])
    assert row.status == "unrecorded" and row.met == "unverified (was “yes”)"
    assert "(not re-run yet: 30 minutes of exclusive WAN time); re-measure: `fstream bench probe`" in row.evidence


def test_every_re_measurable_goal_finds_a_result_stamped_later_than_today():
    """Regression: five rows globbed ``qos-2026112[5-9]-*`` and ``tuning-wan-2026112[5-9]-*``, so a re-measure in
    December was never read and the rows stayed stale whatever ran. A row whose command writes a new result must
    find one stamped years from now (rows that name one result file only are history and are left out)."""
    import fnmatch
    import re

    pinned = []
    for goal in GOALS:
        pats = (goal.source,) if isinstance(goal.source, str) else goal.source
        globs = [Path(p).name for p in pats if "*" in p or "[" in p]
        if not globs:
            continue
        found = False
        for pat in globs:
            bench = re.split(r"-(?=[\d*\[])", pat, maxsplit=1)[0]
            future = f"{bench}-20991231-235959" + (".json" if pat.endswith(".json") else "")
            found = found or fnmatch.fnmatch(future, pat)
        if not found:
            pinned.append(f"issue {goal.issue}: {goal.goal[:50]} ({', '.join(globs)})")
    assert not pinned, "goals that can never read a new result:\n" + "\n".join(pinned)
