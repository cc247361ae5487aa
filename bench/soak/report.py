"""The soak's report: the result of a run (faults, recovery, re-sent bytes, invariants) as JSON and markdown."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from fstream_bench.soak.agents import Agents, slim

MiB = 1 << 20


def summarize(agents: Agents, fault_records: list[dict], errors: list[str], wire_counters: dict[str, int], *,
              produced: list[Path], produced_bytes: int, final_rc: int | None, final_res: dict | None, inv: dict,
              drained: bool, drain_s: float) -> dict:
    """The run's result: ``ok`` is true only if every invariant held, the final send succeeded and the harness
    itself had no trouble (``problems`` says what went wrong otherwise)."""
    faults = [{k: v for k, v in f.items() if not k.startswith("_")} for f in fault_records]
    by_kind: dict[str, int] = {}
    for f in faults:
        by_kind[f["kind"]] = by_kind.get(f["kind"], 0) + 1
    rec = [f["recovery_s"] for f in faults if f["recovery_s"] is not None]
    total = inv["source_bytes"]
    reported = [r for r in agents.sender_runs if r["result"] is not None]
    sent_reported = sum(int(r["result"].get("bytes_sent", 0)) for r in reported)
    killed = [r for r in agents.sender_runs if r["result"] is None]
    # delivered bytes of the bigger direction (packets dropped by a black-hole are not counted twice)
    wire = max(wire_counters.get("a_tx_bytes", 0), wire_counters.get("b_tx_bytes", 0)) or None
    final_ok = final_rc == 0 and bool(final_res and final_res.get("ok"))
    problems = list(inv["problems"]) + [f"soak harness: {e}" for e in errors]
    if not final_ok:
        problems.append(f"final fstream send exited {final_rc} (ok={final_res and final_res.get('ok')}): "
                        f"{(final_res or {}).get('failures')}")
    return {
        "files_produced": len(produced), "bytes_produced": produced_bytes,
        "faults": faults, "faults_by_kind": by_kind,
        "recovery_s": {"max": max(rec) if rec else None, "median": round(statistics.median(rec), 2) if rec else None,
                       "unrecovered": sum(1 for f in faults if f["recovery_s"] is None)},
        "agent_restarts_unprovoked": agents.restarts,
        "sender_runs": agents.sender_runs,
        "bytes_sent_reported": sent_reported, "runs_without_json": len(killed),
        "bytes_resent": (sent_reported - total) if not killed else None,
        "bytes_resent_lower_bound": max(0, sent_reported - total) if killed else None,
        "wire_bytes_src_to_dst": wire,
        "bytes_resent_estimate_wire": (wire - total) if wire else None,
        "peak": agents.peak, "drained": drained, "drain_s": drain_s,
        "final_send": {"rc": final_rc, "ok": final_ok, "result": slim(final_res)},
        "files_verified": inv["verified"], "corrupted_visible": inv["corrupted"],
        "partial_visible": inv["temps"], "files_lost": inv["lost"], "unexpected_visible": inv["unexpected"],
        "problems": problems, "ok": not problems,
    }


def markdown(doc: dict) -> str:
    r = doc["result"]
    mi = doc["machine"]
    la = doc["load_average_at_start"]
    gb = r["bytes_produced"] / 1e9
    rec = r["recovery_s"]
    resent = (f"{r['bytes_resent'] / 1e6:.1f} MB" if r["bytes_resent"] is not None else
              f"unknown: {r['runs_without_json']} killed sender runs printed no JSON (the runs that did sent "
              f"{r['bytes_sent_reported'] / 1e6:.1f} MB of {r['bytes_produced'] / 1e6:.1f} MB)")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["faults_by_kind"].items()))
    unprovoked = r["agent_restarts_unprovoked"]
    rx_exit, tx_exit = unprovoked["receiver_exited"], unprovoked["sender_exited"]
    wire = r["bytes_resent_estimate_wire"]
    wire_txt = (f"{wire / 1e6:.1f} MB (estimate: bytes the delay line delivered, with the few headers of its "
                "64 KiB GSO packets)"
                if wire is not None else "n/a (loopback)")
    pk_tx, pk_rx = r["peak"]["sender"], r["peak"]["receiver"]
    rows = [
        ("files / bytes produced", f"{r['files_produced']} / {gb:.2f} GB"),
        ("faults injected", f"{sum(r['faults_by_kind'].values())} ({kinds})"),
        ("recovery time max / median",
         f"{rec['max']} s / {rec['median']} s ({rec['unrecovered']} without measured recovery)"),
        ("unprovoked agent exits (restarted)", f"sender {tx_exit}, receiver {rx_exit}"),
        ("drained before the final send", f"{r['drained']} ({r['drain_s']} s)"),
        ("final send (no --watch)", f"exit {r['final_send']['rc']}, ok {r['final_send']['ok']}"),
        ("files verified at the destination", str(r["files_verified"])),
        ("bytes re-sent (sum of senders' bytes_sent − total)", resent),
        ("bytes delivered src→dst by the WAN delay line − total", wire_txt),
        ("peak sender RSS / fds", f"{pk_tx['rss'] / MiB:.0f} MiB / {pk_tx['fds']}"),
        ("peak receiver RSS / fds", f"{pk_rx['rss'] / MiB:.0f} MiB / {pk_rx['fds']}"),
        ("corrupted visible / partial (temp) files left", f"{r['corrupted_visible']} / {r['partial_visible']}"),
        ("files lost", str(r["files_lost"])),
    ]
    faults = []
    for f in r["faults"]:
        extra = (f" {f['seconds']} s" if "seconds" in f else "") + (f" {f['file']}" if "file" in f else "")
        faults.append(f"- {f['t_s']:.1f} s {f['kind']}{extra}: recovery {f['recovery_s']} s")
    lines = [
        f"# Soak: {doc['minutes']} min on {doc['where']} — {'PASS' if r['ok'] else 'FAIL'}", "",
        f"command: `{doc['command']}`", "",
        (f"machine: nproc {mi['nproc']}, {mi['cpu']}, kernel {mi['kernel']}; load average at start "
         f"{la[0]:.2f} {la[1]:.2f} {la[2]:.2f}; {doc['started_utc']}"), "",
        "| measure | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows],
        "", ("faults (t, kind, recovery: seconds from the fault's end until the destination moved again; None: "
             "it had not moved before the next fault or the end of the run):"), "", *faults,
    ]
    if r["problems"]:
        lines += ["", "**invariants violated:**", "", *[f"- {p}" for p in r["problems"]]]
    return "\n".join(lines) + "\n"


def write_report(doc: dict, results: Path, stamp: str) -> str:
    """Write ``soak-<stamp>.{json,md}`` under ``results``; return the markdown (also printed)."""
    out = Path(results)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(doc)
    (out / f"soak-{stamp}.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / f"soak-{stamp}.md").write_text(md)
    print(md)
    print(f"report: {out / f'soak-{stamp}.md'}", file=sys.stderr)
    return md
