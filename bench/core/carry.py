"""``fstream bench carry RESULT``: carry a result forward to today's code with evidence, not by assertion (issue 42).

A result is stale when the code its processes ran has changed since (``provenance``). A refactor that
changes nothing a user can measure should not cost hours of re-measuring, and must not be waved through
either. ``carry`` runs the benchmark's short smoke variant (``Smoke``: the same subcommand, smaller) on the
result's code (a git worktree at the commit it was measured or last carried at) and on today's, ABBA, in one
run on this machine, and compares each metric:

- the pairs' ratios today / then, their median and range;
- the noise the same code shows against itself in the same run (consecutive runs of one side);
- today is *within the noise* when, for every metric, the median ratio is no further from 1 than the
  largest same-side deviation. A deterministic smoke (``Smoke.exact``: the simulators) must be equal, to
  rounding (``EXACT_REL``: a refactor may sum the same terms in another order).

Every attempt writes ``bench/results/carry-<stamp>.json``: the result it is about, both commits, every
pair's metrics, each metric's ratio, range and noise, and the verdict. Within the noise, the record also
holds today's ``files`` and ``code_hash`` (those today's smoke runs recorded): it re-stamps the result,
which itself stays as it was measured. The goals table shows the row as current, "carried from" the
commit, for as long as that hash holds (``carried_stamp``). Otherwise the command says "re-measure",
naming the metric that moved.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fstream_bench.core import provenance
from fstream_bench.core.saved import RESULTS_DIR

REPO = provenance.REPO
SO_GLOB = "_blake3tree*.so"  # the native module, built from native/ (not in git)
EXACT_REL = 1e-12  # an exact smoke's numbers equal to this relative difference: rounding, not a changed result


@dataclass(frozen=True)
class Smoke:
    """A benchmark's short variant: ``fstream bench <bench> <args> --results DIR``, and its metrics."""

    bench: str
    args: tuple[str, ...]  #: after ``fstream bench <bench>``; a ``part`` smoke's start with the part (``sim``)
    #: the smoke's result document -> {metric: value}; values compared as ratios today / then
    metrics: Callable[[dict], dict[str, float]]
    exact: bool = False  #: deterministic (a simulator): every metric must be equal, not within noise
    doc: str = ""  #: the JSON inside a result directory ("summary.json"); "" for a JSON result file
    timeout_s: float = 900.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    part: str = ""  #: the result's ``part`` it carries ("sim" of ``deadline``); "" for every result of ``bench``

    @property
    def key(self) -> str:
        """``bench`` or ``bench part``: how ``smokes.SMOKES`` and a refresh step name it."""
        return f"{self.bench} {self.part}" if self.part else self.bench


def result_doc(path: Path, doc: str = "") -> tuple[Path, dict]:
    """The JSON file of a result (a file, or ``doc`` inside a run directory) and its content."""
    f = path / (doc or "summary.json") if path.is_dir() else path
    return f, json.loads(f.read_text())


def carries(results: Path = RESULTS_DIR) -> dict[str, list[dict]]:
    """Every successful carry record, by the result it re-stamps (oldest first)."""
    out: dict[str, list[dict]] = {}
    for f in sorted(results.glob("carry-*.json")):
        try:
            body = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if body.get("carried") and body.get("files"):
            out.setdefault(body["result"], []).append({**body, "file": f.name})
    return out


def carried_stamp(rel: str, results: Path = RESULTS_DIR) -> dict | None:
    """The newest successful carry of result ``rel`` (repository-relative), or None."""
    return (carries(results).get(rel) or [None])[-1]


def base_commit(prov: dict, rel: str, results: Path = RESULTS_DIR) -> str:
    """The code the result is vouched for: the commit it was last carried to, else the one it was measured at."""
    last = carried_stamp(rel, results)
    return last["today"] if last else prov["commit"]


def _git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def worktree(commit: str, into: Path) -> Path:
    """A detached worktree of ``commit`` that runs as its own ``fstream`` (``PYTHONPATH=WT:WT/.pyroot``),
    with the native module built from that commit's crate (today's, when the crate is the same)."""
    wt = into / f"wt-{commit[:12]}"
    _git("worktree", "add", "--detach", "--force", str(wt), commit)
    link = wt / ".pyroot" / "fstream_bench"  # the checkout's own (committed), or made for an older one
    if not link.exists():
        link.parent.mkdir(exist_ok=True)
        link.symlink_to("../bench")
    so = sorted((REPO / "transfer_agent" / "storage").glob(SO_GLOB))
    if so and (wt / "native" / "Cargo.toml").exists():  # before issue 29 there was no native module to build
        same = subprocess.run(["git", "-C", str(REPO), "diff", "--quiet", commit, "HEAD", "--", "native"]).returncode == 0
        if same:
            shutil.copy2(so[0], wt / "transfer_agent" / "storage" / so[0].name)
        else:
            _build_native(wt, so[0].name)
    return wt


def _build_native(wt: Path, name: str) -> None:
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    env = {**os.environ, "PYO3_PYTHON": sys.executable, "CARGO_TARGET_DIR": str(wt / "native" / "target")}
    subprocess.run([cargo, "build", "--release", "--quiet", "--manifest-path", str(wt / "native" / "Cargo.toml")],
                   check=True, env=env, timeout=900)
    built = next((wt / "native" / "target" / "release").glob("lib*.so"))
    shutil.copy2(built, wt / "transfer_agent" / "storage" / name)


def drop_worktree(wt: Path) -> None:
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(wt)], capture_output=True)
    shutil.rmtree(wt, ignore_errors=True)


def run_smoke(smoke: Smoke, out: Path, wt: Path | None, log: Path) -> dict:
    """One run of the smoke, by ``wt``'s code (None: today's); its result document."""
    out.mkdir(parents=True)
    env = dict(os.environ)
    env.pop(provenance.RECORD_ENV, None)
    if wt is not None:
        env["PYTHONPATH"] = f"{wt}:{wt / '.pyroot'}"
    else:
        env.pop("PYTHONPATH", None)
    argv = [str(Path(sys.executable).with_name("fstream")), "bench", smoke.bench, *smoke.args, "--results", str(out)]
    with open(log, "a") as f:
        f.write(f"\n$ {'PYTHONPATH=' + env['PYTHONPATH'] + ' ' if wt else ''}{' '.join(argv)}\n")
        f.flush()
        done = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=smoke.timeout_s,
                              cwd=str(wt or REPO))
    if done.returncode != 0:
        raise RuntimeError(f"the smoke `{' '.join(argv[1:])}` failed ({done.returncode}) on "
                           f"{'the result' + chr(39) + 's code' if wt else 'today' + chr(39) + 's code'}; see {log}")
    found = sorted(p for p in out.iterdir() if p.suffix == ".json" or p.is_dir())
    if not found:
        raise RuntimeError(f"the smoke `{' '.join(argv[1:])}` wrote no result into {out}")
    return result_doc(found[-1], smoke.doc)[1]


def verdict(pairs: list[dict], exact: bool) -> dict:
    """Per metric: ratios today/then, their median and range, the same-side noise, and within-or-not."""
    out: dict[str, dict] = {}
    for m in pairs[0]["then"]:
        ratios = [p["today"][m] / p["then"][m] if p["then"][m] else float("inf") for p in pairs]
        same = [b[m] / a[m] for side in ("then", "today") for a, b in
                zip([p[side] for p in pairs], [p[side] for p in pairs][1:]) if a[m]]
        noise = max((abs(s - 1) for s in same), default=0.0)
        med = statistics.median(ratios)
        ok = all(math.isclose(p["today"][m], p["then"][m], rel_tol=EXACT_REL) for p in pairs) if exact \
            else abs(med - 1) <= noise
        out[m] = {"ratios": ratios, "median": med, "range": [min(ratios), max(ratios)], "same_side": same,
                  "noise": noise, "within": ok}
    return out


def carry(result: Path, smoke: Smoke, pairs: int = 3, results: Path = RESULTS_DIR,
          log=print) -> tuple[bool, Path]:
    """Carry ``result`` to today's code if the smoke's ABBA pairs show no change beyond their noise.

    Returns (carried, the carry's own result file: written either way)."""
    f, doc = result_doc(result, smoke.doc)
    prov = doc.get("provenance") or {}
    if not prov.get("commit") or prov["commit"] == "unknown":
        raise ValueError(f"{result}: the result records no commit, so there is no code to compare today's with")
    if prov.get("bench") != smoke.bench or (smoke.part and doc.get("part") != smoke.part):
        what = " ".join(str(x) for x in (prov.get("bench"), doc.get("part")) if x)
        raise ValueError(f"{result} is a `{what}` result; this smoke runs `{smoke.key}`")
    rel = f.relative_to(REPO).as_posix() if f.is_relative_to(REPO) else str(f)
    then, today = base_commit(prov, rel, results), _git("rev-parse", "HEAD")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    record = results / f"carry-{stamp}.json"
    work = Path(tempfile.mkdtemp(prefix="fstream-carry-"))
    runs: list[dict] = []
    try:
        wt = worktree(then, work)
        seen_files: set[str] = set()
        for i in range(pairs):
            order = ("then", "today") if i % 2 == 0 else ("today", "then")
            pair: dict = {"order": "".join("A" if s == "then" else "B" for s in order)}
            for side in order:
                d = run_smoke(smoke, work / f"{i}-{side}", wt if side == "then" else None, work / "smoke.log")
                pair[side] = smoke.metrics(d)
                if side == "today":
                    seen_files.update((d.get("provenance") or {}).get("files") or ())
                log(f"carry: pair {i + 1}/{pairs} {side:5s} " + ", ".join(f"{k} {v:.4g}" for k, v in pair[side].items()))
            runs.append(pair)
        v = verdict(runs, smoke.exact)
        ok = all(x["within"] for x in v.values()) and bool(seen_files)
        body = {"bench": "carry", "result": rel,
                "smoke": {"bench": smoke.bench, "args": list(smoke.args), "exact": smoke.exact},
                "then": then, "today": today, "pairs": runs, "metrics": v, "carried": ok,
                "machine": provenance.machine_info(), "load": list(os.getloadavg()),
                "dirty": bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                             capture_output=True, text=True).stdout.strip())}
        if ok:
            body["files"] = sorted(seen_files)
            body["code_hash"] = provenance.files_hash(body["files"])
        results.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(body, indent=1) + "\n")
        return ok, record
    finally:
        for wt_dir in work.glob("wt-*"):
            drop_worktree(wt_dir)
        shutil.rmtree(work, ignore_errors=True)
