"""``fstream bench drain`` (issue 30's drain goal): a run's numbers from hand-made job events, the tree comparison
and dataset on real files, the goals-table row reading a summary, and bad options refused before anything starts."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from fstream_bench.core import goals_table as gt, provenance
from fstream_bench.cli import main as bench_main
from fstream_bench.ops.drain import build_files, compare_trees, drain_goal, run_met, score_events, summarize_case
from fstream_bench.goals import GOALS

MiB = 2**20
T_SIG = 1000.0


def _file(path: str, ts: float, status: str = "committed", resumed: int = 0) -> dict:
    return {"kind": "file", "ts": ts, "path": path, "size": 4 * MiB, "status": status, "resumed": resumed}


def _events(dup: str | None = None) -> list[dict]:
    """A 6-file job: A commits f0-f1 before the signal and f2-f3 after, is cut with f4 and f5 open (drained event),
    releases; B skips f0-f3 and commits f4-f5 (f4 resumed from its part)."""
    ev = [{"kind": "claimed", "ts": 990.0, "attempt": 1},
          _file("f0", 995.0), _file("f1", 999.0), _file("f2", 1000.5), _file("f3", 1001.0),
          _file("f4", 1002.0, "failed"),
          {"kind": "drained", "ts": 1002.1, "verified_files": 4, "skipped_files": 0, "bytes_sent": 18 * MiB,
           "resumed_bytes": 0, "error": "transfer cancelled"},
          {"kind": "released", "ts": 1002.2, "attempt": 1, "reason": "agent a stopping"},
          {"kind": "claimed", "ts": 1005.0, "attempt": 2}]
    ev += [_file(f"f{i}", 1005.5, "committed" if f"f{i}" == dup else "skipped") for i in range(4)]
    ev += [_file("f4", 1006.0, resumed=2 * MiB), _file("f5", 1006.5), {"kind": "done", "ts": 1007.0}]
    return ev


def _run(**over) -> dict:
    r = {"case": "drain", "run": 0, "grace_s": 30.0, "exit_code": 0, "exit_s": 4.2, "final_state": "succeeded",
         "lost": 0, "cut": False}
    r.update(score_events(_events(), t_signal=T_SIG, dataset_bytes=24 * MiB, block_size=4 * MiB, parts_left=2,
                          result={"bytes_sent": 6 * MiB, "resumed_bytes": 2 * MiB}))
    r.update(over)
    return r


def test_a_run_is_scored_from_its_job_events():
    s = score_events(_events(), t_signal=T_SIG, dataset_bytes=24 * MiB, block_size=4 * MiB, parts_left=2,
                     result={"bytes_sent": 6 * MiB, "resumed_bytes": 2 * MiB})
    assert s["attempts"] == [1, 2] and s["released"] is True
    assert s["files_a"] == 4 and s["open_at_signal"] == 2  # f2 and f3 committed after the signal
    assert s["files_b_committed"] == 2 and s["files_b_skipped"] == 4 and s["skipped_not_from_a"] == []
    assert s["duplicated"] == 0 and s["files_failed"] == 1
    assert s["parts_resumed"] == 1 and s["resumed_bytes"] == 2 * MiB
    assert s["bytes_resent"] == 18 * MiB + 6 * MiB - 24 * MiB == 0 and s["resend_bound"] == 8 * MiB
    assert s["a_drained"]["bytes_sent"] == 18 * MiB and "kind" not in s["a_drained"]
    assert run_met(_run())


def test_a_file_committed_by_both_attempts_is_a_duplicate_and_fails_the_goal():
    ev = _events(dup="f1")
    s = score_events(ev, t_signal=T_SIG, dataset_bytes=24 * MiB, block_size=4 * MiB, parts_left=2,
                     result={"bytes_sent": 10 * MiB})
    assert s["duplicated"] == 1 and s["duplicated_paths"] == ["f1"]
    assert s["bytes_resent"] == 4 * MiB  # f1 sent twice
    assert not run_met(_run(**s))


@pytest.mark.parametrize("over, why", [
    ({"exit_s": 31.0}, "exit after the grace"), ({"exit_code": 1}, "exit code"), ({"exit_s": None}, "never exited"),
    ({"lost": 1}, "a file lost"), ({"released": False}, "not handed back"), ({"final_state": "failed"}, "unfinished"),
    ({"bytes_resent": 8 * MiB + 1}, "over the bound"), ({"bytes_resent": None}, "no drained event"),
    ({"error": "agent A ended the job"}, "a run that failed")])
def test_each_part_of_the_goal_is_checked(over, why):
    assert run_met(_run()) and not run_met(_run(**over)), why


def _doc(runs_drain: list[dict], runs_cut: list[dict]) -> dict:
    return {"loopback": False, "cases": {
        "drain": {"files": 1000, "size": 4 * MiB, "grace_s": 30.0, "signal_at": 0.4, "runs": runs_drain},
        "cut": {"files": 64, "size": 64 * MiB, "grace_s": 2.0, "signal_at": 0.4, "runs": runs_cut}}}


def test_the_goal_reader_gives_each_case_and_is_met_only_when_every_run_is():
    cut = _run(case="cut", grace_s=2.0, exit_s=1.9, cut=True)
    doc = _doc([_run(exit_s=3.0), _run(exit_s=5.0), _run(exit_s=4.0)], [cut])
    measured, met = drain_goal(doc, Path("."))
    assert met == "yes"
    assert "drain (grace 30 s, 1,000 × 4 MiB): exit 4.0 (3.0–5.0, 3 runs) s, code 0 in 3/3, lost 0, duplicated 0" \
        in measured
    assert "cut (grace 2 s, 64 × 64 MiB): exit 1.9 (1 run) s" in measured and "cut in 1/1" in measured
    slow = copy.deepcopy(doc)
    slow["cases"]["cut"]["runs"][0]["exit_s"] = 2.6  # the cut run took longer than its grace
    assert drain_goal(slow, Path("."))[1] == "no"
    broken = copy.deepcopy(doc)
    broken["cases"]["drain"]["runs"][1] = {"case": "drain", "run": 1, "grace_s": 30.0, "error": "RuntimeError: x"}
    text, met = drain_goal(broken, Path("."))
    assert met == "no" and "1 run(s) failed" in text
    with pytest.raises(ValueError, match="no runs"):
        drain_goal(_doc([], []), Path("."))


def test_case_summary_gives_median_and_range_of_every_number():
    s = summarize_case([_run(exit_s=3.0), _run(exit_s=5.0), _run(exit_s=40.0), {"error": "x", "grace_s": 30.0}])
    assert s["runs"] == 4 and s["met"] == 2 and s["errors"] == ["x"]
    assert s["stats"]["exit_s"]["median"] == 5.0 and s["stats"]["exit_s"]["max"] == 40.0
    assert s["stats"]["bytes_resent"]["values"] == [0.0, 0.0, 0.0]


def test_the_goals_row_reads_the_newest_wan_result_and_skips_loopback_smokes(tmp_path):
    row = next(g for g in GOALS if g.issue == "30")
    prov = provenance.finish(provenance.start("drain", [], ["fstream_bench.ops.drain"]))
    wan = tmp_path / "bench" / "results" / "drain-20260101-000000"
    smoke = tmp_path / "bench" / "results" / "drain-20260301-000000"
    for d, loop, exit_s in ((wan, False, 4.0), (smoke, True, 99.0)):
        d.mkdir(parents=True)
        doc = {**_doc([_run(exit_s=exit_s)], [_run(case="cut", grace_s=2.0, exit_s=1.5, cut=True)]),
               "loopback": loop, "provenance": prov}
        (d / "summary.json").write_text(json.dumps(doc))
    gt._hash_cache.clear()
    try:
        r = gt.resolve(row, tmp_path)
    finally:
        gt._hash_cache.clear()
    assert r.status == "current" and r.met == "yes", r.problem
    assert "exit 4.0 (1 run) s" in r.measured and "drain-20260101-000000" in r.evidence


def test_trees_compare_missing_changed_and_extra_files(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    n = build_files(src, 70, 4096, tmp_path / "uniq")
    names = sorted(p.name for p in src.iterdir())
    assert n == 70 * 4096 and len(names) == 70 and all((src / x).stat().st_size == 4096 for x in names)
    assert (src / names[0]).read_bytes() != (src / names[1]).read_bytes()  # neighbours differ
    assert os.path.samefile(src / names[0], src / names[64])  # 64 contents, hard-linked
    dst.mkdir()
    for x in names:
        (dst / x).write_bytes((src / x).read_bytes())
    assert compare_trees(src, dst) == ([], [])
    (dst / names[3]).unlink()
    body = bytearray((dst / names[5]).read_bytes())
    body[100] ^= 1
    (dst / names[5]).write_bytes(bytes(body))
    (dst / ".f00009.dat.job.1.part").write_bytes(b"x")
    lost, extra = compare_trees(src, dst)
    assert lost == [names[3], names[5]] and extra == [".f00009.dat.job.1.part"]


@pytest.mark.parametrize("args, says", [
    (["--signal-at", "1.5"], "--signal-at 1.5: must be between 0 and 1"),
    (["--size", "4XB"], "size '4XB'"),
    (["--cases", "drain,sever"], "--cases 'drain,sever': each must be drain or cut"),
    (["--repeats", "0"], "--repeats 0: must be at least 1")])
def test_bad_options_are_refused_naming_the_option(tmp_path, capsys, args, says):
    with pytest.raises(SystemExit) as exc:
        bench_main(["drain", "--loopback", "--results", str(tmp_path), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "fstream bench drain: error:" in err and says in err
    assert not list(tmp_path.iterdir())  # refused before anything started or was written


def test_the_drain_datasets_hard_links_are_allowed_by_the_benchs_policy(tmp_path: Path) -> None:
    """Regression: since issue 40 an agent refuses files with several hard links unless its policy allows them, and
    the drain bench's datasets are hard links to a few contents (``build_files``): every run failed before it sent a
    byte ("it has 17 hard links ... terminal: source refused", drain-20261129-100517 and -20261130-205918). Its
    policy now allows them; the same policy without the switch still refuses them (the agent's own ``Guard``)."""
    from fstream_bench.scheduling.wan import _policy
    from transfer_agent.daemon.authorize import AgentPolicy
    from transfer_agent.errors import FStreamError
    from transfer_agent.storage.contain import Guard

    src = tmp_path / "src"
    build_files(src, 80, 4096, tmp_path / "uniq")
    f = src / "f00070.dat"
    assert os.stat(f).st_nlink > 1
    secret = tmp_path / "secret"
    secret.write_text("x" * 64)
    for allow in (True, False):
        logdir = tmp_path / f"policy-{allow}"
        logdir.mkdir()
        policy, _key = _policy(logdir, secret, [src], "fstream://127.0.0.1:9/", allow_hardlinks=allow)
        guard = Guard(AgentPolicy.from_file(str(policy)).roots)
        try:
            if allow:
                fd, st = guard.open(str(f))
                os.close(fd)
                assert st.st_size == 4096
            else:
                with pytest.raises(FStreamError, match="hard links"):
                    guard.open(str(f))
        finally:
            guard.close()
