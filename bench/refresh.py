"""``fstream bench refresh``: re-measure every goal row that is not current, alone, in order, unattended (issue 42).

The goals table (``fstream_bench.goals``) says which rows are stale (their code changed since) or
unrecorded (measured before provenance). ``refresh`` collects the commands that re-measure them (one run
per distinct command, however many rows it feeds), and runs them one after another, each alone on the
machine, the WAN ones as root. With ``--carry`` it first tries ``fstream bench carry`` on a row's result
when its benchmark has a smoke (minutes instead of the full run); a carry that is refused falls back to
re-measuring. ``--budget`` bounds the whole run: a command whose last run took longer than the time left
is skipped and named. Every step (command, start, end, exit status, load average before and after) is
written to ``bench/results/refresh-<stamp>.json``; at the end the goals table in BENCHMARKS.md is
rewritten from the results. It can be left running overnight; ``--dry-run`` prints the plan.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fstream_bench.core import goals_table
from fstream_bench.core.carry import carry
from fstream_bench.core.saved import RESULTS_DIR
from fstream_bench.goals import GOALS
from fstream_bench.smokes import SMOKES
from fstream_provider.model.units import parse_duration

ROOT_PREFIX = "(as root) "
TIMES = re.compile(r"\s*\((\d+) times\)\s*$")  # a row measured over several runs: "fstream bench X (3 times)"
#: how long a command whose benchmark has never recorded its own duration is assumed to take
UNKNOWN_S = 1800.0


@dataclass
class Step:
    """One command to run and the rows it re-measures."""

    command: str
    rows: list[str] = field(default_factory=list)
    results: list[Path] = field(default_factory=list)  #: the rows' current result files (carry candidates)
    as_root: bool = False
    estimate_s: float = UNKNOWN_S

    @property
    def times(self) -> int:
        """How many runs the row asks for: ``... (3 times)`` (a goal over ≥ 3 runs of the same code), else 1."""
        m = TIMES.search(self.command)
        return int(m.group(1)) if m else 1

    @property
    def argv(self) -> list[str]:
        """The command's words after ``fstream``, without the ``(N times)`` note."""
        return shlex.split(TIMES.sub("", self.command))[1:]

    @property
    def bench(self) -> str:
        return shlex.split(self.command)[2]

    @property
    def smoke(self) -> str | None:
        """The key of the smoke that carries this step's results (``bench part`` before ``bench``), or None."""
        words = shlex.split(self.command)
        part = f"{words[2]} {words[3]}" if len(words) > 3 else ""
        if part in SMOKES:
            return part
        return self.bench if self.bench in SMOKES and not SMOKES[self.bench].part else None


def _row_name(r: goals_table.Row) -> str:
    return f"issue {r.goal.issue}: {r.goal.goal}"


def _duration(path: Path, doc: str) -> float | None:
    try:
        data = goals_table._load(path, doc)
    except (OSError, ValueError):
        return None
    prov = data.get("provenance") if isinstance(data, dict) else None
    if prov and prov.get("finished_unix") and prov.get("started_unix"):
        return float(prov["finished_unix"]) - float(prov["started_unix"])
    return None


def plan(only: list[str] | None = None, root: Path = goals_table.REPO,
         goals: list[goals_table.Goal] | None = None) -> tuple[list[Step], list[str]]:
    """The steps that make every re-measurable row current (shortest first), and the rows left out, each with why."""
    steps: dict[str, Step] = {}
    left: list[str] = []
    for goal in GOALS if goals is None else goals:
        row = goals_table.resolve(goal, root)
        name = _row_name(row)
        if only and not any(o.lower() in name.lower() or o.lower() in goal.rerun.lower() for o in only):
            continue
        if row.status == "current":
            continue
        if row.status == "not-here":
            left.append(f"{name}: cannot be measured here ({goal.not_here})")
            continue
        command = goal.rerun.removeprefix(ROOT_PREFIX)
        step = steps.setdefault(command, Step(command, as_root=goal.rerun.startswith(ROOT_PREFIX)))
        step.rows.append(name)
        path = goals_table._newest(root, goal)
        if path is not None:
            step.results.append(path)
            took = _duration(path, goal.doc)
            if took is not None:
                step.estimate_s = took if step.estimate_s == UNKNOWN_S else max(step.estimate_s, took)
    return sorted(steps.values(), key=lambda s: s.estimate_s), left


def _run(argv: list[str], log: Path) -> int:
    with open(log, "a") as f:
        f.write(f"\n$ {shlex.join(argv)}\n")
        f.flush()
        return subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, cwd=str(goals_table.REPO)).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fstream bench refresh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma list: rows whose issue/goal text or command contains one")
    ap.add_argument("--budget", default="3h", help="stop starting commands after this long (default 3h)")
    ap.add_argument("--carry", action="store_true", help="try `fstream bench carry` first where a smoke exists")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    ap.add_argument("--results", default=str(RESULTS_DIR))
    ap.add_argument("--benchmarks", default=str(goals_table.REPO / "BENCHMARKS.md"))
    a = ap.parse_args(argv)
    try:
        budget = parse_duration(a.budget)
    except ValueError as e:
        ap.error(f"--budget: {e}")
    steps, left = plan([o for o in a.only.split(",") if o.strip()] or None)
    for s in steps:
        print(f"{'[root] ' if s.as_root else ''}{s.command}  (~{s.estimate_s / 60:.0f} min; "
              f"{len(s.rows)} row(s): {'; '.join(s.rows)})")
    for why in left:
        print(f"left out: {why}")
    if a.dry_run:
        return 0
    results = Path(a.results)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    record, log = results / f"refresh-{stamp}.json", results / f"refresh-{stamp}.log"
    done: list[dict] = []
    t0 = time.monotonic()
    fstream = str(Path(sys.executable).with_name("fstream"))
    for s in steps:
        entry = {"command": s.command, "rows": s.rows, "estimate_s": s.estimate_s, "load_before": os.getloadavg()}
        left_s = budget - (time.monotonic() - t0)
        if s.as_root and os.geteuid() != 0:
            entry["skipped"] = "needs root (the emulated WAN)"
        elif s.estimate_s > left_s:
            entry["skipped"] = f"its last run took {s.estimate_s / 60:.0f} min, {left_s / 60:.0f} min of the budget left"
        else:
            entry["started_unix"] = time.time()
            if a.carry and s.smoke and s.results:
                entry["carried"] = _carry_all(s, results)
            if not entry.get("carried"):
                exits = [_run([fstream, *s.argv], log) for _ in range(s.times)]
                entry["exit"] = next((e for e in exits if e), 0)
            entry["finished_unix"], entry["load_after"] = time.time(), os.getloadavg()
        done.append(entry)
        print(f"refresh: {s.command}: " + (entry.get("skipped") or ("carried" if entry.get("carried") else
                                                                    f"exit {entry.get('exit')}")), flush=True)
        record.write_text(json.dumps({"bench": "refresh", "steps": done, "left_out": left}, indent=1) + "\n")
    goals_table.forget()  # the carries this run made count (its first reading of them, for the plan, had none)
    rows = goals_table.write(Path(a.benchmarks), GOALS)
    current = sum(r.status == "current" for r in rows)
    print(f"refresh: {current} of {len(rows)} goal rows current ({100 * current / len(rows):.0f} %); {record}")
    return 0 if all(e.get("exit", 0) == 0 for e in done) else 1


def _carry_all(step: Step, results: Path) -> bool:
    """Carry every result of ``step`` (True only when each was carried)."""
    for path in dict.fromkeys(step.results):
        try:
            ok, rec = carry(path, SMOKES[step.smoke], results=results)
        except (RuntimeError, ValueError, subprocess.CalledProcessError) as e:
            print(f"refresh: carry of {path} failed: {e}", flush=True)
            return False
        print(f"refresh: carry of {path}: {'carried' if ok else 're-measure'} ({rec.name})", flush=True)
        if not ok:
            return False
    return True
