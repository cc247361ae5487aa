"""A/B of two checkouts of the agent on loopback, interleaved in one run: wall time and CPU-seconds per side.

For refactors that must not cost speed (issue #15): the same workloads are sent by checkout A and
checkout B alternately (A B, then B A, ...), each side pinned (sender on CPU 0, receiver on CPU 1),
destination on tmpfs, receiver without fsync, so the comparison is the agent's own code path.
Reports medians, the spread (min-max) and B/A ratios, and writes every pair's raw numbers with the
run's provenance to ``bench/results/ab-<stamp>.json`` (and a short ``.md`` table). Usage::

    fstream bench ab --a-cmd '/tmp/old/fstream' --a-path /work/wt/base --b-cmd .venv/bin/fstream --repeat 5
    python -m fstream_bench.datapath.ab ...        # the same

A checkout from before issue 15 has its CLI at ``transfer_agent.cli`` (not ``.cli.main``); run it as
``--a-cmd ".venv/bin/python -c 'import sys; from transfer_agent.cli import main; sys.exit(main())'"``
with ``--a-path`` the worktree (``PYTHONPATH`` wins over the venv's editable install), after
``.venv/bin/python -m compileall -q WT/transfer_agent WT/fstream_provider`` so neither side compiles
its modules from source in every run (this machine sets ``PYTHONDONTWRITEBYTECODE``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from fstream_bench.core import provenance

from fstream_bench.core import runstats
from fstream_bench.core.children import end
from fstream_bench.core.cpu_meter import reap
from fstream_bench.core import RESULTS_DIR
from fstream_bench.core.workload_gen import write_repeated

CASES = {  # name: (file count, file size, send options)
    "1 x 1 GiB, p=4": (1, 1 << 30, ["--tuner", "fixed", "--cc", "1", "--p", "4", "--pp", "0"]),
    "2000 x 256 KiB, cc=4 pp=16": (2000, 256 << 10, ["--tuner", "fixed", "--cc", "4", "--p", "1", "--pp", "16"]),
    # opt-in (--case): the per-file cost without data, and each run's fixed cost (start-up, connect, auth)
    "2000 x 1 B, cc=4 pp=16": (2000, 1, ["--tuner", "fixed", "--cc", "4", "--p", "1", "--pp", "16"]),
    "1 x 1 B": (1, 1, ["--tuner", "fixed", "--cc", "1", "--p", "1", "--pp", "1"]),
}
DEFAULT_CASES = ("1 x 1 GiB, p=4", "2000 x 256 KiB, cc=4 pp=16")
METRICS = {"wall": "wall s", "tx_cpu": "sender CPU s", "rx_cpu": "receiver CPU s"}
#: what an A/B exercises in this checkout (side B, when B is this checkout)
MODULES = (*provenance.AGENT, "fstream_bench.datapath.ab", "fstream_bench.core.runstats")


def _make(root: Path, count: int, size: int) -> Path:
    d = root / f"src-{count}x{size}"
    d.mkdir(parents=True)
    block = os.urandom(min(size, 1 << 20))
    for i in range(count):
        write_repeated(d / f"f{i:05d}.dat", size, block)
    return d


def _can_pin() -> bool:
    """``taskset`` is there and the machine has a CPU 1 for the receiver."""
    return shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2


class Side:
    """One checkout: its ``fstream`` command and PYTHONPATH, a pinned receiver on tmpfs."""

    def __init__(self, name: str, cmd: str, path: str | None, secret: Path, dst: Path, *, pin: bool = True) -> None:
        self.name, self.cmd, self.dst, self.secret = name, shlex.split(cmd), dst, secret
        self.env = dict(os.environ)
        if path:  # another checkout: not this one's code, so not recorded in this result's provenance
            self.env["PYTHONPATH"] = f"{path}:{path}/.pyroot"
            self.env.pop(provenance.RECORD_ENV, None)
        else:  # this checkout (the venv's install), its processes recorded (provenance.record_imports)
            self.env["PYTHONPATH"] = str(provenance.SITE_DIR)
        self.pinned = pin and _can_pin()
        self._rx_pin = ["taskset", "-c", "1"] if self.pinned else []
        self._tx_pin = ["taskset", "-c", "0"] if self.pinned else []
        dst.mkdir(parents=True)
        self.rx = subprocess.Popen([*self._rx_pin, *self.cmd, "receive", "--listen", "127.0.0.1:0",
                                    "--root", str(dst), "--secret-file", str(secret), "--no-fsync"],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=self.env)
        line = self.rx.stdout.readline()
        if not line.startswith("listening on "):
            self.close()
            raise RuntimeError(f"{name}: receiver did not start: {line!r}")
        self.port = int(line.rsplit(":", 1)[1])
        self.proc = psutil.Process(self.rx.pid)

    def _rx_cpu(self) -> float:
        t = self.proc.cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def send(self, src: Path, opts: list[str]) -> dict:
        """One ``send`` of ``src``: wall s, the sender's CPU-s (``wait4``), the receiver's CPU-s meanwhile,
        and what the agent itself reported (``--json``: its own seconds, bytes, files)."""
        from fstream_bench.peers.fstream import _last_json

        shutil.rmtree(self.dst / "out", ignore_errors=True)
        with tempfile.TemporaryFile() as err:  # a file, not a pipe: a chatty sender never blocks on it
            rx0, t0 = self._rx_cpu(), time.monotonic()
            p = subprocess.Popen([*self._tx_pin, *self.cmd, "send", str(src), "--to",
                                  f"fstream://127.0.0.1:{self.port}/out", "--secret-file", str(self.secret),
                                  "--json", *opts], stdout=subprocess.PIPE, stderr=err, env=self.env)
            out = p.stdout.read()  # the JSON summary, at the end; read before reaping so the pipe never fills
            tx_cpu = reap(p)
            wall = time.monotonic() - t0
            p.stdout.close()
            if p.returncode != 0:
                err.seek(0)
                raise RuntimeError(f"{self.name}: send failed ({p.returncode}): {out[-300:]!r} {err.read()[-500:]!r}")
        doc = _last_json(out.decode(errors="replace")) or {}
        return {"wall": wall, "tx_cpu": tx_cpu, "rx_cpu": self._rx_cpu() - rx0,
                "agent_seconds": doc.get("seconds"), "bytes": doc.get("bytes"), "files": doc.get("files")}

    def close(self) -> None:
        end(self.rx, 15, 5)
        self.rx.stdout.close()


def interleave(sides: list, rounds: int, cases: dict, srcs: dict, log=print,
               into: dict[str, list[dict]] | None = None) -> dict[str, list[dict]]:
    """Run ``rounds`` rounds; in each, every case once per side, A B in even rounds and B A in odd ones
    (whichever side runs second pays for the first one's page cache and tmpfs writes: seen up to 2x
    receiver CPU). Returns, per case, one pair per round: ``{"round", "order", "A": run, "B": run}``
    (appended to ``into`` as they complete, so a failed run keeps the pairs before it)."""
    pairs: dict[str, list[dict]] = into if into is not None else {}
    for case in cases:
        pairs.setdefault(case, [])
    for r in range(rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        for case, (_n, _s, opts) in cases.items():
            pair = {"round": r, "order": "".join(s.name for s in order)}
            for side in order:
                pair[side.name] = side.send(srcs[case], opts)
            pairs[case].append(pair)
            log(f"ab: round {r + 1}/{rounds} {case}: " + ", ".join(
                f"{s} wall {pair[s]['wall']:.2f} tx {pair[s]['tx_cpu']:.2f} rx {pair[s]['rx_cpu']:.2f}"
                for s in ("A", "B")))
    return pairs


def summarize_pairs(pairs: dict[str, list[dict]], metrics=tuple(METRICS)) -> dict:
    """Per case and metric: A's and B's runs (``runstats.series``), B/A of the medians, and B/A of each pair."""
    out: dict = {}
    for case, rows in pairs.items():
        for metric in metrics:
            va = [p["A"][metric] for p in rows]
            vb = [p["B"][metric] for p in rows]
            sa, sb = runstats.series(va, "s"), runstats.series(vb, "s")
            out.setdefault(case, {})[metric] = {
                "A": sa, "B": sb,
                "B/A of medians": sb["median"] / sa["median"] if sa["median"] else None,
                "B/A per pair": runstats.series(runstats.pair_ratios(va, vb), "ratio")}
    return out


def markdown(doc: dict) -> str:
    """The table BENCHMARKS.md quotes: per case and metric, A and B as median (min-max), and B/A."""
    prov = doc["provenance"]
    sides = doc["sides"]
    lines = [f"Command: `{prov['command']}`  ",
             runstats.provenance_line(prov) + "  ",
             f"A: `{sides['A']['cmd']}`" + (f" with PYTHONPATH `{sides['A']['path']}`" if sides["A"]["path"] else "")
             + f" (commit `{(sides['A'].get('commit') or '?')[:12]}`); B: `{sides['B']['cmd']}`"
             + (f" with PYTHONPATH `{sides['B']['path']}`" if sides["B"]["path"] else "")
             + f" (commit `{(sides['B'].get('commit') or '?')[:12]}`).  ",
             f"{doc['repeat']} rounds, {doc['order']}; pinned: {doc['pinned']}; "
             "raw pairs in the JSON beside this file.",
             "",
             "| case | metric | A median (min-max) | B median (min-max) | B/A (of medians) "
             "| B/A per pair, median (min-max) |",
             "|---|---|---|---|---|---|"]

    def mm(s: dict) -> str:
        return "-" if s["median"] is None else f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"

    for case, metrics in doc["summary"].items():
        for metric, c in metrics.items():
            ratio = "-" if c["B/A of medians"] is None else f"{c['B/A of medians']:.2f}"
            lines.append(f"| {case} | {METRICS.get(metric, metric)} | {mm(c['A'])} | {mm(c['B'])} | {ratio} "
                         f"| {mm(c['B/A per pair'])} |")
    if doc.get("error"):
        lines.append(f"\nStopped early: {doc['error']}")
    return "\n".join(lines) + "\n"


def _checkout(path: str | None) -> dict:
    root = Path(path) if path else Path(__file__).resolve().parents[2]

    def git(*a: str) -> str:
        try:
            r = subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return r.stdout.strip() if r.returncode == 0 else ""
    return {"commit": git("rev-parse", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="fstream bench ab", description=__doc__.splitlines()[0])
    ap.add_argument("--a-cmd", required=True, help="checkout A's fstream command")
    ap.add_argument("--a-path", default=None, help="checkout A's source tree (PYTHONPATH)")
    ap.add_argument("--b-cmd", required=True)
    ap.add_argument("--b-path", default=None)
    ap.add_argument("--repeat", type=int, default=5, help="rounds (pairs per case)")
    ap.add_argument("--src-dir", default=None, help="where the datasets are written (default: a temp dir)")
    ap.add_argument("--case", action="append", choices=sorted(CASES),
                    help=f"run only these cases (repeatable; default: {', '.join(DEFAULT_CASES)})")
    ap.add_argument("--results", default=str(RESULTS_DIR), help="where ab-<stamp>.json/.md go")
    a = ap.parse_args(argv)
    prov = provenance.start("ab", argv, MODULES)
    cases = {k: CASES[k] for k in (a.case or DEFAULT_CASES)}
    work = Path(tempfile.mkdtemp(prefix="fstream-ab-", dir=a.src_dir))
    tmpfs = Path(tempfile.mkdtemp(prefix="fstream-ab-dst-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    secret = work / "secret"
    secret.write_text(os.urandom(24).hex())
    secret.chmod(0o600)
    sides: list[Side] = []
    pairs: dict[str, list[dict]] = {}
    error = None
    try:
        srcs = {name: _make(work, n, size) for name, (n, size, _o) in cases.items()}
        for name, cmd, path in (("A", a.a_cmd, a.a_path), ("B", a.b_cmd, a.b_path)):
            sides.append(Side(name, cmd, path, secret, tmpfs / name.lower()))  # one by one: a failed B still closes A
        print(f"load average at start: {os.getloadavg()}", flush=True)
        try:
            interleave(sides, a.repeat, cases, srcs, log=lambda s: print(s, flush=True), into=pairs)
        except (RuntimeError, OSError) as e:  # keep what was measured; the file says where it stopped
            error = str(e)
        print(f"load average at end: {os.getloadavg()}")
    finally:
        pinned = all(s.pinned for s in sides) if sides else False
        for s in sides:
            s.close()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(tmpfs, ignore_errors=True)
    doc = {"provenance": provenance.finish(prov), "bench": "ab", "repeat": a.repeat, "pinned": pinned,
           "order": "ABBA (A B in even rounds, B A in odd ones)",
           "setup": "sender on CPU 0, receiver on CPU 1 (taskset), destination on tmpfs, receiver --no-fsync; "
                    "CPU-s: the sender's from wait4, the receiver's as the difference of its process's CPU",
           "sides": {"A": {"cmd": a.a_cmd, "path": a.a_path, **_checkout(a.a_path)},
                     "B": {"cmd": a.b_cmd, "path": a.b_path, **_checkout(a.b_path)}},
           "cases": {k: {"files": n, "file_bytes": s, "send_options": o} for k, (n, s, o) in cases.items()},
           "pairs": pairs, "summary": summarize_pairs({k: v for k, v in pairs.items() if v}), "error": error}
    md = markdown(doc)
    jp, mp = runstats.write_result(a.results, "ab", doc, md)
    print(md)
    print(f"results: {jp}, {mp}")
    return 1 if error else 0


if __name__ == "__main__":
    raise SystemExit(main())
