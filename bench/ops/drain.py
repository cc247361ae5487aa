"""``fstream bench drain``: issue 30's drain goal on the emulated WAN (SIGTERM an agent mid-job, a second finishes it).

    fstream bench drain                          # (root) 1000 x 4 MiB, grace 30s; cut case 64 x 64 MiB, grace 2s
    fstream bench drain --loopback --files 300 --size 256KiB --cut-files 4 --cut-size 32MiB --pace 200Mbit \
        --repeats 1                              # a seconds-long smoke (not a measurement)

Per run: a receiver at the destination, one Redis over a unix socket, agent A (``fstream agent --drain-grace G
--claim-idle 2s``) at the source; one signed job (tuner ``fstream``, the path's rate and RTT). When
``--signal-at`` (40 %) of the files have landed (``file`` events), A gets SIGTERM; we time its exit and take its
exit code, check the job is ``queued`` with a ``released`` event, count the ``.part`` files A left, start agent B
and wait for ``succeeded``. Measured from the job's events and the trees: files lost (missing or different at the
destination), files duplicated (committed by both attempts), files A had open at the signal (committed by A after
it), bytes re-sent (A's ``drained.bytes_sent`` + B's ``bytes_sent`` - the dataset; bound: one block per part A
left, so 0 when every open file finished), whether the grace cut A (its log) and the parts B resumed.

Two cases, each ``--repeats`` times: ``drain`` (the 1,000-file job, ``--grace``) and ``cut`` (a grace too short
for the open files: ``--cut-grace`` 2s, with larger files, ``--cut-size``, so that files are still open when it
ends: 4 MiB files finish within about a second of the signal). Writes ``summary.json`` (every run raw, median and
range per case) and ``report.md`` into ``drain-<stamp>/``; ``drain_goal`` reads it for the goals table.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from fstream_bench.core import provenance
from fstream_bench.core.children import end
from fstream_bench.core.runstats import med_range, series

MODULES = (*provenance.AGENT, "fstream_bench.ops.drain", "fstream_bench.scheduling.wan",
           "fstream_bench.tuning.pools_wan", "fstream_bench.wan.rig", "fstream_bench.wan", "fstream_bench.peers",
           "fstream_bench.core.workload_gen", "fstream_bench.core.children", "fstream_bench.core.unix_redis")
UNIQUE = 64  #: distinct contents a dataset hard-links its names to (neighbouring names differ)
EXIT_MARGIN_S = 60.0  #: how long past the grace we wait for A before killing it (a run that then fails the goal)
#: the per-case numbers the report gives as median and range
METRICS = (("exit_s", "s"), ("exit_code", ""), ("lost", "files"), ("duplicated", "files"),
           ("open_at_signal", "files"), ("bytes_resent", "bytes"), ("resend_bound", "bytes"),
           ("parts_left", "files"), ("parts_resumed", "files"), ("resumed_bytes", "bytes"), ("cut", "runs"),
           ("b_seconds", "s"))


# -- pure: what the events and the trees say ---------------------------------------------------------------------
def files_by_attempt(events: list[dict]) -> dict[int, list[dict]]:
    """The ``file`` events of each attempt (an attempt starts at its ``claimed`` event)."""
    out: dict[int, list[dict]] = {}
    attempt = 0
    for e in events:
        if e["kind"] == "claimed":
            attempt = int(e.get("attempt", attempt + 1))
        elif e["kind"] == "file":
            out.setdefault(attempt, []).append(e)
    return out


def score_events(events: list[dict], *, t_signal: float, dataset_bytes: int, block_size: int, parts_left: int,
                 result: dict | None) -> dict:
    """One run's numbers from its job's events: A is the first attempt, B every later one; ``result`` is the job's
    final result (B's), ``parts_left`` the ``.part`` files at the destination when A had exited."""
    claims = [int(e.get("attempt", 0)) for e in events if e["kind"] == "claimed"]
    first = claims[0] if claims else 1
    by = files_by_attempt(events)
    a_done = [f for f in by.get(first, []) if f.get("status") == "committed"]
    later = [f for att, fs in by.items() if att != first for f in fs]
    committed = Counter(f["path"] for fs in by.values() for f in fs if f.get("status") == "committed")
    a_paths = {f["path"] for f in a_done}
    start = next((i for i, e in enumerate(events) if e["kind"] == "claimed"), 0)
    drained = next((e for e in events[start:] if e["kind"] == "drained"), None)
    released = any(e["kind"] == "released" and int(e.get("attempt", first)) == first for e in events)
    a_sent = drained.get("bytes_sent") if drained else None
    b_sent = (result or {}).get("bytes_sent")
    resent = a_sent + b_sent - dataset_bytes if a_sent is not None and b_sent is not None else None
    return {
        "attempts": sorted(set(claims)), "released": released,
        "files_a": len(a_done), "open_at_signal": sum(f["ts"] >= t_signal for f in a_done),
        "files_b_committed": sum(f.get("status") == "committed" for f in later),
        "files_b_skipped": sum(f.get("status") == "skipped" for f in later),
        "skipped_not_from_a": sorted({f["path"] for f in later if f.get("status") == "skipped"} - a_paths)[:10],
        "files_failed": sum(f.get("status") == "failed" for fs in by.values() for f in fs),
        "duplicated": sum(n > 1 for n in committed.values()),
        "duplicated_paths": sorted(p for p, n in committed.items() if n > 1)[:10],
        "parts_left": parts_left,
        "parts_resumed": sum(f.get("status") == "committed" and int(f.get("resumed") or 0) > 0 for f in later),
        "resumed_bytes": int((result or {}).get("resumed_bytes") or 0),
        "a_drained": {k: v for k, v in (drained or {}).items() if k not in ("kind", "ts")} or None,
        "bytes_resent": resent, "resend_bound": block_size * parts_left,
    }


def run_met(r: dict) -> bool:
    """The goal for one run: exit within the grace with code 0, released and finished by B, nothing lost or
    duplicated, re-sent at most one block per part A left."""
    return (not r.get("error") and r.get("exit_code") == 0 and r.get("exit_s") is not None
            and r["exit_s"] <= r["grace_s"] and r.get("released") is True and r.get("final_state") == "succeeded"
            and r.get("lost") == 0 and r.get("duplicated") == 0 and r.get("bytes_resent") is not None
            and r["bytes_resent"] <= r["resend_bound"])


def summarize_case(runs: list[dict]) -> dict:
    """Median and range of every number over the runs that measured it, and how many runs met the goal."""
    ok = [r for r in runs if not r.get("error")]
    stats = {m: series([float(r[m]) for r in ok if r.get(m) is not None], unit) for m, unit in METRICS}
    return {"runs": len(runs), "met": sum(run_met(r) for r in runs), "errors": [r["error"] for r in runs
                                                                            if r.get("error")], "stats": stats}


def compare_trees(src: Path, dst: Path) -> tuple[list[str], list[str]]:
    """``(lost, extra)``: source files missing at ``dst`` or with other bytes; files at ``dst`` not in ``src``."""
    names = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
    lost = [n for n in names if not (dst / n).is_file() or not filecmp.cmp(src / n, dst / n, shallow=False)]
    have = set(names)
    extra = sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file() and str(p.relative_to(dst))
                   not in have) if dst.exists() else []
    return lost, extra


def part_files(root: Path) -> list[Path]:
    return list(root.rglob("*.part")) if root.exists() else []


def drain_goal(doc: dict, _: Path) -> tuple[str, str]:
    """The goals table's reader (issue 30): per case, exit time against the grace, exit codes, files lost and
    duplicated, bytes re-sent against one block per part left; met when every run of every case met it."""
    cells, runs = [], []
    for name, case in doc["cases"].items():
        rs = case["runs"]
        if not rs:
            continue
        runs += rs
        ok = [r for r in rs if not r.get("error")]
        exits = [r["exit_s"] for r in ok if r.get("exit_s") is not None]
        resent = [r["bytes_resent"] / 2**20 for r in ok if r.get("bytes_resent") is not None]
        cells.append(f"{name} (grace {case['grace_s']:g} s, {case['files']:,} × {case['size'] / 2**20:g} MiB): exit "
                     f"{med_range(exits, '{:.1f}')} s, code 0 in {sum(r.get('exit_code') == 0 for r in rs)}/{len(rs)}, "
                     f"lost {sum(r.get('lost') or 0 for r in ok)}, duplicated "
                     f"{sum(r.get('duplicated') or 0 for r in ok)}, "
                     f"re-sent {med_range(resent, '{:.1f}')} MiB (bound: one block per part left, "
                     f"{max((r['parts_left'] for r in ok), default=0)} parts at most), cut in "
                     f"{sum(bool(r.get('cut')) for r in ok)}/{len(rs)}"
                     + (f", {len(rs) - len(ok)} run(s) failed" if len(ok) < len(rs) else ""))
    if not runs:
        raise ValueError("the result holds no runs")
    return "; ".join(cells), "yes" if all(run_met(r) for r in runs) else "no"


# -- one run on the rig ------------------------------------------------------------------------------------------
def build_files(root: Path, n: int, size: int, uniq: Path, seed: int = 30) -> int:
    """``n`` files of ``size`` bytes under ``root`` (hard links to ``UNIQUE`` distinct contents); their bytes."""
    from fstream_bench.core.workload_gen import content_block, write_file

    block = content_block(seed)
    pool = []
    for j in range(min(n, UNIQUE)):
        p = uniq / f"u{size}-{j:03d}.dat"
        if not (p.is_file() and p.stat().st_size == size):
            write_file(p, size, block, key=f"drain:{size}:{j}")
        pool.append(p)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for i in range(n):
        os.link(pool[i % len(pool)], root / f"f{i:05d}.dat")
    return n * size


@dataclass
class Rig:
    """What every run shares: the path, the bus, the receiver, the agents' policy and the bench's signing key."""

    bench: object
    url: str
    rx: object
    policy: Path
    signer: object
    logdir: Path
    claim_idle: str
    timeout: float
    pace: float | None = None  #: a QoS target for the job (bits/s): a loopback smoke lasts seconds


def _agent(rig: Rig, ns: str, name: str, grace: float) -> subprocess.Popen:
    from fstream_bench.peers import fstream as fs_peer

    argv = fs_peer.fstream_argv() + ["agent", "--redis", rig.url, "--namespace", ns, "--name", name, "--policy",
                                     str(rig.policy), "--no-history", "--drain-grace", f"{grace:g}s",
                                     "--claim-idle", rig.claim_idle]
    log = open(rig.logdir / f"agent-{name}.log", "w")
    env = {**os.environ, "FSTREAM_STATE_DIR": str(rig.logdir / f"state-{name}")}
    try:
        return subprocess.Popen(rig.bench.sites.argv("src", argv), stdout=log, stderr=subprocess.STDOUT, env=env)
    finally:
        log.close()  # the child holds its own copy


def _wait_landed(store, job_id: str, want: int, timeout: float) -> int:
    """Follow the job's events until ``want`` files were committed; the count seen."""
    after, n = "0-0", 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for eid, e in store.events(job_id, after=after, block_ms=100, count=1000):
            after = eid
            if e["kind"] == "file" and e.get("status") == "committed":
                n += 1
            elif e["kind"] == "done":
                raise RuntimeError(f"job {job_id} finished before {want} files had landed ({n} seen)")
        if n >= want:
            return n
    raise RuntimeError(f"only {n} of {want} files landed within {timeout:.0f} s")


def run_one(rig: Rig, case: str, i: int, src: Path, files: int, dataset_bytes: int, grace: float,
            signal_at: float) -> dict:
    """One run: A takes the job, SIGTERM at ``signal_at`` of the files, B finishes it; its raw numbers."""
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.jobs import JobStore
    from fstream_provider.bus.keys import Keys
    from fstream_provider.model.spec import TransferSpec

    label = f"{case}-{i}"
    bench, rx = rig.bench, rig.rx
    store = JobStore(connect(rig.url), keys=Keys(f"drain-{label}"), signer=rig.signer)
    dst_root = rx.root / label
    spec = TransferSpec.from_options([str(src)], rx.url(label), tuner="fstream", label=label,
                                     bandwidth=bench.bandwidth_bps, rtt=bench.rtt_s,
                                     **({"target_throughput": rig.pace} if rig.pace else {}))
    row: dict = {"case": case, "run": i, "grace_s": grace, "files": files, "dataset_bytes": dataset_bytes,
                 "block_size": spec.block_size}
    a = b = None
    try:
        a = _agent(rig, store.keys.namespace, f"{label}-a", grace)
        job_id, _ = store.submit(spec)
        row["job_id"] = job_id
        row["landed_at_signal"] = _wait_landed(store, job_id, math.ceil(signal_at * files), rig.timeout)
        t_signal = time.time()
        a.send_signal(signal.SIGTERM)
        try:
            row["exit_code"] = a.wait(grace + EXIT_MARGIN_S)
            row["exit_s"] = time.time() - t_signal
        except subprocess.TimeoutExpired:
            a.kill()
            a.wait(10)
            row.update(exit_code=None, exit_s=None, error=f"agent A still running {grace + EXIT_MARGIN_S:.0f} s "
                                                          "after SIGTERM (killed)")
        row["state_after_a"] = store.get(job_id).state
        if row["state_after_a"] in ("succeeded", "failed", "cancelled"):
            row["error"] = (f"agent A ended the job ({row['state_after_a']}) before SIGTERM took effect: nothing "
                            "was drained (more or larger files, or --pace)")
        parts = len(part_files(dst_root))
        t_b = time.monotonic()
        b = _agent(rig, store.keys.namespace, f"{label}-b", grace)
        final = store.wait(job_id, rig.timeout)
        row["b_seconds"] = time.monotonic() - t_b
        row["final_state"] = final.state
        events = [e for _, e in store.all_events(job_id)]
        row.update(score_events(events, t_signal=t_signal, dataset_bytes=dataset_bytes, block_size=spec.block_size,
                                parts_left=parts, result=final.result))
        b_res = final.result or {}
        row["b_result"] = {k: b_res.get(k) for k in ("bytes_sent", "resumed_bytes", "verified_files",
                                                     "skipped_files", "failed_files", "seconds", "error")}
    except Exception as exc:  # noqa: BLE001 - a run that could not be measured is recorded, and fails the goal
        row["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        end(a)  # an agent this bench started: SIGTERM, then SIGKILL after 30 s
        end(b)
        store.client.close()
    alog = rig.logdir / f"agent-{label}-a.log"
    row["cut"] = alog.exists() and "drain grace over" in alog.read_text(errors="replace")
    lost, extra = compare_trees(src, dst_root)
    row.update(lost=len(lost), lost_paths=lost[:10], extra=extra[:10])
    shutil.rmtree(dst_root, ignore_errors=True)
    return row


# -- the report --------------------------------------------------------------------------------------------------
def _mib(st: dict) -> str:
    if not st["n"]:
        return "—"
    return med_range([v / 2**20 for v in st["values"]], "{:.1f}")


def report(summary: dict) -> str:
    lines = ["# Drain: SIGTERM an agent mid-job, a second agent finishes it (issue 30)\n", summary["machine_line"], "",
             summary["selfcheck_line"], "", f"`{summary['provenance']['command']}`", ""]
    for name, c in summary["cases"].items():
        s = c["summary"]["stats"]
        lines += [f"## {name}: {c['files']:,} × {c['size'] / 2**20:g} MiB, grace {c['grace_s']:g} s, SIGTERM at "
                  f"{c['signal_at']:.0%} of the files landed\n",
                  f"Goal met in {c['summary']['met']} of {c['summary']['runs']} runs "
                  "(exit within the grace, code 0, released, 0 lost, 0 duplicated, "
                  "re-sent ≤ one block per part left).",
                  "", "| measure | median (range, runs) |", "|---|---|",
                  f"| exit after SIGTERM | {med_range(s['exit_s']['values'], '{:.1f}')} s |",
                  f"| exit code | {med_range(s['exit_code']['values'], '{:.0f}')} |",
                  f"| files lost / duplicated | {med_range(s['lost']['values'], '{:.0f}')} / "
                  f"{med_range(s['duplicated']['values'], '{:.0f}')} |",
                  f"| files A committed after SIGTERM (open then, or opened before A saw it) | "
                  f"{med_range(s['open_at_signal']['values'], '{:.0f}')} |",
                  f"| bytes re-sent (MiB) | {_mib(s['bytes_resent'])} |",
                  f"| bound: one block per part left (MiB) | {_mib(s['resend_bound'])} |",
                  f"| parts left by A / resumed by B | {med_range(s['parts_left']['values'], '{:.0f}')} / "
                  f"{med_range(s['parts_resumed']['values'], '{:.0f}')} |",
                  f"| B's resumed bytes (MiB) | {_mib(s['resumed_bytes'])} |",
                  f"| grace cut A (runs) | {int(sum(s['cut']['values']))} of {s['cut']['n']} |",
                  f"| B's time to finish | {med_range(s['b_seconds']['values'], '{:.1f}')} s |", "",
                  "| run | landed at SIGTERM | exit s | code | open | A sent MiB | B sent MiB | re-sent MiB | parts | "
                  "cut | lost | dup | error |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in c["runs"]:
            a_sent = ((r.get("a_drained") or {}).get("bytes_sent") or 0) / 2**20
            b_sent = ((r.get("b_result") or {}).get("bytes_sent") or 0) / 2**20
            resent = "—" if r.get("bytes_resent") is None else f"{r['bytes_resent'] / 2**20:.1f}"
            exit_s = "—" if r.get("exit_s") is None else f"{r['exit_s']:.1f}"
            lines.append(f"| {r['run']} | {r.get('landed_at_signal', '—')} | {exit_s} "
                         f"| {r.get('exit_code', '—')} | {r.get('open_at_signal', '—')} "
                         f"| {a_sent:.1f} | {b_sent:.1f} | {resent} | {r.get('parts_left', '—')} | {r.get('cut')} "
                         f"| {r.get('lost')} | {r.get('duplicated', '—')} | {r.get('error') or ''} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from fstream_bench.tuning.pools_wan import _redis
    from fstream_bench.scheduling.wan import _policy
    from fstream_bench.wan.rig import add_path_args, machine_line, open_bench, selfcheck_line
    from fstream_provider.model.units import parse_duration, parse_rate, parse_size

    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="fstream bench drain", description=__doc__.splitlines()[0])
    add_path_args(ap, "tb30d")
    ap.add_argument("--files", type=int, default=1000, help="files in the drain case's job (default 1000)")
    ap.add_argument("--size", default="4MiB", help="each file (default 4MiB: ~40 s for the job at 1 Gbit/s)")
    ap.add_argument("--grace", default="30s", help="the agent's --drain-grace in the drain case (default 30s)")
    ap.add_argument("--cut-files", type=int, default=64, help="files in the cut case's job (default 64)")
    ap.add_argument("--cut-size", default="64MiB", help="each file of the cut case (default 64MiB)")
    ap.add_argument("--cut-grace", default="2s", help="the cut case's --drain-grace (default 2s)")
    ap.add_argument("--cases", default="drain,cut", help="which cases to run (default drain,cut)")
    ap.add_argument("--signal-at", type=float, default=0.4, help="SIGTERM when this fraction of files landed")
    ap.add_argument("--claim-idle", default="2s", help="the agents' --claim-idle (default 2s)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each case (default 3)")
    ap.add_argument("--pace", default=None, help="a QoS target rate for the job, e.g. 200Mbit (for a loopback smoke: "
                    "without it the job ends before SIGTERM; default none)")
    ap.add_argument("--timeout", default="15min", help="the longest wait for a job step (default 15min)")
    args = ap.parse_args(argv)
    try:
        sizes = {"drain": parse_size(args.size), "cut": parse_size(args.cut_size)}
        graces = {"drain": parse_duration(args.grace), "cut": parse_duration(args.cut_grace)}
        parse_duration(args.claim_idle)
        timeout = parse_duration(args.timeout)
        pace = parse_rate(args.pace) if args.pace else None
    except ValueError as exc:
        ap.error(str(exc))
    counts = {"drain": args.files, "cut": args.cut_files}
    cases = [c for c in args.cases.split(",") if c]
    for what, bad in ((f"--cases {args.cases!r}: each must be drain or cut", not cases or set(cases) - set(counts)),
                      (f"--files/--cut-files: at least 2 files, got {counts}", min(counts.values()) < 2),
                      (f"--signal-at {args.signal_at}: must be between 0 and 1", not 0 < args.signal_at < 1),
                      (f"--repeats {args.repeats}: must be at least 1", args.repeats < 1),
                      (f"--grace/--cut-grace: must be positive, got {graces}", min(graces.values()) <= 0)):
        if bad:
            ap.error(what)
    prov = provenance.start("drain", argv, MODULES)
    out = Path(args.results) / f"drain-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fstream-drain-", dir="/dev/shm"))
    bench = open_bench(args)
    summary: dict = {"machine_line": machine_line(), "selfcheck_line": selfcheck_line(bench.selfcheck),
                     "loopback": bool(args.loopback), "cases": {}}
    print(summary["machine_line"], flush=True)
    print(summary["selfcheck_line"], flush=True)
    redis_proc = None
    try:
        from fstream_bench.peers import fstream as fs_peer
        from fstream_provider.authz.signing import Signer

        redis_proc, url = _redis(work)
        srcs = {c: (work / "src" / c, build_files(work / "src" / c, counts[c], sizes[c], work / "uniq"))
                for c in cases}
        with fs_peer.FStreamReceiver(sites=bench.sites, workdir=work / "rx", root=work / "dst") as rx:
            # the datasets' names are hard links to UNIQUE contents (make_dataset): the policy allows them
            policy, key = _policy(work, rx.secret, [p for p, _ in srcs.values()], rx.url(""), allow_hardlinks=True)
            rig = Rig(bench, url, rx, policy, Signer.from_file("bench", str(key)), work, args.claim_idle, timeout,
                      pace)
            for c in cases:
                summary["cases"][c] = {"files": counts[c], "size": sizes[c], "grace_s": graces[c],
                                       "signal_at": args.signal_at, "runs": []}
            for i in range(args.repeats):
                for c in cases:
                    r = run_one(rig, c, i, srcs[c][0], counts[c], srcs[c][1], graces[c], args.signal_at)
                    summary["cases"][c]["runs"].append(r)
                    print(f"{c} {i}: exit {r.get('exit_s') or float('nan'):.1f} s (code {r.get('exit_code')}), "
                          f"open at SIGTERM {r.get('open_at_signal')}, re-sent {r.get('bytes_resent')} B "
                          f"(bound {r.get('resend_bound')}), parts {r.get('parts_left')}, cut {r.get('cut')}, "
                          f"lost {r.get('lost')}, duplicated {r.get('duplicated')}; goal "
                          f"{'met' if run_met(r) else 'NOT met'}{'; ' + r['error'] if r.get('error') else ''}",
                          flush=True)
    finally:
        for log in work.glob("agent-*.log"):  # the agents' own account of the drain
            shutil.copy(log, out / log.name)
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(10)
        bench.close()
        shutil.rmtree(work, ignore_errors=True)
    for c in summary["cases"].values():
        c["summary"] = summarize_case(c["runs"])
    summary["provenance"] = provenance.finish(prov)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (out / "report.md").write_text(report(summary))
    measured, met = drain_goal(summary, out)
    print(f"goal: {met}: {measured}\nresults: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
