"""Readers of the ops room's results for the goals table (``fstream_bench.ops.goals``): metrics' CPU cost, a key
rotation under load, `fstream doctor` on deliberately broken paths, and the cost of each auth mode. Each turns one
result document into (measured, met); the drain's reader sits beside its bench
(``fstream_bench.ops.drain.drain_goal``)."""

from __future__ import annotations

from pathlib import Path

from fstream_bench.core.readers import yes

from fstream_bench.core.runstats import med_range


def metrics_overhead(doc: dict, _: Path) -> tuple[str, str]:
    """CPU-seconds per GB of both daemons with metrics on and scraped every second over metrics off, as the ratio of
    the medians, with each ABBA pair's ratio; met at ≤ the bench's goal ratio (1.02)."""
    off, on = doc["cpu_s_per_gb"]["off"]["values"], doc["cpu_s_per_gb"]["on"]["values"]
    if not off or not on or doc.get("ratio") is None:
        raise ValueError("the result holds no pair of runs")
    pairs = doc.get("pair_ratios") or []
    s = doc["setup"]
    text = (f"on/off {doc['ratio']:.3f}× CPU-s per GB (pairs {med_range(pairs, '{:.3f}')}, {len(pairs)} ABBA pairs); "
            f"off {med_range(off, '{:.2f}')}, on {med_range(on, '{:.2f}')} s/GB; {s['total'] / 2**30:.0f} GiB, "
            f"scrape every {s['scrape_interval']:g} s, {'pinned' if s.get('pinned') else 'unpinned'}")
    return text, yes(doc["ratio"] <= doc.get("goal_ratio_max", 1.02))


def rotation_goal(doc: dict, _: Path) -> tuple[str, str]:
    """Files and jobs failed while a rotation ran in the middle of continuous transfers, and which generations
    the sessions used; met with 0 failed files, the rotation's exit 0, and only the new generation after it."""
    rot = doc["rotation"]
    after = doc.get("sessions_of_jobs_submitted_after_the_rotation") or {}
    gens = sorted(doc.get("sessions_per_generation") or {})
    new_only = len(after) == 1 and bool(after)
    text = (f"{doc['files_failed']} failed of {doc['files_sent'] + doc['files_failed']:,} files in {doc['jobs']} jobs "
            f"over {doc['params']['seconds']:g} s ({doc['jobs_failed']} failed jobs); rotation exit "
            f"{rot.get('exit_code')} in {rot.get('seconds', 0):.1f} s; sessions per generation "
            f"{dict(sorted((doc.get('sessions_per_generation') or {}).items()))}; jobs after it used "
            f"{', '.join(sorted(after)) or 'none'} (generations seen: {', '.join(gens)})")
    met = doc["files_failed"] == 0 and doc["jobs_failed"] == 0 and rot.get("exit_code") == 0 and new_only
    return text, yes(met)


def doctor_goal(doc: dict, _: Path) -> tuple[str, str]:
    """How many broken paths' verdicts named the cause, each case's verdict against the expected one."""
    s = doc["summary"]
    cases = [c for c in doc["cases"] if c.get("expected") and c["case"] != "baseline"]
    shown = "; ".join(f"{c['case']}: {c['verdict']!r}" + ("" if c["named"] else f" (expected {c['expected']!r})")
                      for c in cases)
    text = f"named {s['named']} of {s['broken_paths']} ({shown}); healthy baseline: {s.get('baseline')!r}"
    return text, yes(s.get("met"))


def trust_modes(doc: dict, _: Path) -> tuple[str, str]:
    """Each mode against ``hmac`` in the same round: both sides' CPU per GB and Gbit/s, loopback and WAN."""
    def mr(st: dict) -> str:
        return f"{st['median']:.2f} ({st['min']:.2f}–{st['max']:.2f})"
    parts = []
    for where in ("loopback", "wan"):
        cells = []
        for c in doc["summary"]:
            vs = c.get("vs_hmac")
            if c["where"] == where and vs and c["mode"] in ("hmac+encrypt", "tls"):
                cells.append(f"{c['mode']} on {c['case'].split(',')[0]}: CPU {mr(vs['cpu_per_gb'])}×, "
                             f"Gbit/s {mr(vs['bps'])}×")
        if cells:
            parts.append(f"{where}: " + "; ".join(cells))
    wan = doc.get("sites", {}).get("wan") or {}
    if wan.get("single_stream_of_path") is not None:
        parts.append(f"WAN buffer {wan['buffer_bytes'] / 2**20:.0f} MiB, one stream at "
                     f"{wan['single_stream_of_path']:.2f} of the path")
    n = {c["runs"] for c in doc["summary"]}
    return "; ".join(parts) + f" (against `hmac` per round; {min(n)}–{max(n)} rounds)", "measured"
