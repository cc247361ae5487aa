"""Turn a job's event stream into task-log lines operators can read: per interval, a summary table, warnings, a plot.

Pure formatting (no Redis, no Airflow); the PNG uses matplotlib's Agg backend when it is installed.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

from fstream_provider.model.units import format_bytes, format_rate


def _num(v: Any, default: float = 0.0) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def format_clusters(rec: dict[str, Any]) -> str:
    """``small 4/1/8 · large 2/4/1`` from an interval's clusters, else its overall cc/p/pp."""
    clusters = rec.get("clusters") or []
    if isinstance(clusters, dict):
        clusters = [dict(v, name=k) if isinstance(v, dict) else {"name": k} for k, v in clusters.items()]
    parts = []
    for i, c in enumerate(clusters):
        if not isinstance(c, dict):
            continue
        name = c.get("name") or c.get("cluster") or f"c{i}"
        parts.append(f"{name} {c.get('cc', '?')}/{c.get('p', '?')}/{c.get('pp', '?')}")
    if parts:
        return " · ".join(parts)
    return f"{rec.get('cc', '?')}/{rec.get('p', '?')}/{rec.get('pp', '?')}"


def format_interval(rec: dict[str, Any], target_bps: float | None = None, prev: dict[str, Any] | None = None) -> str:
    """One log line for an interval record.

    Example: ``t=  12.0s  812.40 Mbit/s (target 800.00 Mbit/s, 102%)  cc/p/pp small 4/1/8  files 120 done, 30 pending``
    followed by ``  tuner: <reason>`` when the tuner changed something (or gave a reason).
    """
    t = _num(rec.get("t"))
    bps = _num(rec.get("throughput_bps"))
    target = rec.get("target_bps") or target_bps
    line = f"t={t:7.1f}s  {format_rate(bps):>13}"
    if target:
        line += f" (target {format_rate(float(target))}, {100.0 * bps / float(target):.0f}%)"
    line += f"  cc/p/pp {format_clusters(rec)}"
    done, pending = rec.get("files_done"), rec.get("files_pending")
    if done is not None or pending is not None:
        line += f"  files {int(_num(done))} done, {int(_num(pending))} pending"
    reason = rec.get("reason")
    changed = prev is not None and format_clusters(prev) != format_clusters(rec)
    if reason and (changed or prev is None or reason != (prev or {}).get("reason")):
        line += f"  tuner: {reason}"
    elif changed:
        line += "  tuner: settings changed"
    return line


def intervals_from_events(events: Iterable[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The interval records of a job, in order."""
    out = []
    for _id, ev in events:
        if ev.get("kind") == "interval":
            rec = ev.get("interval") if isinstance(ev.get("interval"), dict) else ev
            out.append({k: v for k, v in rec.items() if k not in ("kind", "ts")})
    return out


def done_event(events: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, Any] | None:
    for _id, ev in events:
        if ev.get("kind") == "done":
            return ev
    return None


def other_event_lines(events: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    """Readable lines for the non-interval events worth showing (tuning, errors, retries, failed files)."""
    lines = []
    for _id, ev in events:
        kind = ev.get("kind")
        if kind == "tuning":
            lines.append(f"tuning: {ev.get('reason', '')}".rstrip())
        elif kind == "error":
            lines.append(f"error: {ev.get('message') or ev.get('error') or ev}")
        elif kind == "retry":
            lines.append(f"retry: {ev.get('reason') or ev.get('message') or ev.get('error') or ''}".rstrip())
        elif kind == "file" and ev.get("status") == "failed":
            lines.append(f"file {ev.get('path')}: {ev.get('status')} ({ev.get('reason', '')})")
        elif kind == "claimed":
            lines.append(f"claimed by agent {ev.get('worker') or ev.get('agent') or '?'}")
    return lines


def target_warnings(result: dict[str, Any], intervals: list[dict[str, Any]], target_bps: float | None) -> list[str]:
    """Warnings when a throughput target was missed, with the likely reason.

    Intervals below target with no file waiting are *source-limited* (the instrument or the directory
    produced data slower than the target), which is not something the tuner or the network can fix.
    """
    if not target_bps:
        return []
    achieved = _num(result.get("throughput_bps"))
    if achieved >= 0.95 * target_bps:
        return []
    below = [r for r in intervals if _num(r.get("throughput_bps")) < 0.95 * target_bps]
    starved = [r for r in below if r.get("files_pending") is not None and int(_num(r.get("files_pending"))) == 0]
    msg = (f"throughput target missed: {format_rate(achieved)} achieved vs {format_rate(target_bps)} asked "
           f"({100.0 * achieved / target_bps:.0f}%); {len(below)} of {len(intervals)} interval(s) below target")
    why = []
    if starved:
        why.append(f"{len(starved)} of them had no file waiting (source-limited: data arrived slower than the "
                   "target, not a network or tuning problem)")
    if len(below) > len(starved):
        reasons = [str(r.get("reason")) for r in intervals if r.get("reason")]
        if reasons:
            why.append(f"last tuner reason: {reasons[-1]}")
        if any("max" in str(r.get("reason", "")).lower() for r in intervals):
            why.append("the tuner hit its channel limit (raise max_cc or check the path)")
    secs = _num(result.get("seconds"))
    first_t = _num(intervals[0].get("t"), 1.0) if intervals else 1.0
    if secs and secs < 3 * max(1.0, first_t):
        why.append("the transfer was too short for the tuner to converge")
    if _num(result.get("failed_files")):
        why.append(f"{int(_num(result.get('failed_files')))} file(s) failed")
    if why:
        msg += " — " + "; ".join(why)
    return [msg]


def summary_table(result: dict[str, Any], intervals: list[dict[str, Any]], target_bps: float | None = None,
                  job_id: str | None = None) -> str:
    """A fixed-width table summarising the transfer and its parameter timeline."""
    rows = []
    if job_id:
        rows.append(("job", job_id))
    rows += [
        ("files", f"{int(_num(result.get('files')))} "
                  f"(verified {int(_num(result.get('verified_files')))}, skipped {int(_num(result.get('skipped_files')))}, "
                  f"failed {int(_num(result.get('failed_files')))})"),
        ("bytes", format_bytes(_num(result.get("bytes")))),
        ("seconds", f"{_num(result.get('seconds')):.2f}"),
        ("throughput", format_rate(_num(result.get("throughput_bps")))),
    ]
    if target_bps:
        rows.append(("target", f"{format_rate(target_bps)} "
                               f"({100.0 * _num(result.get('throughput_bps')) / target_bps:.0f}% reached)"))
    if intervals:
        tp = [_num(r.get("throughput_bps")) for r in intervals]
        rows.append(("intervals", f"{len(intervals)} (min {format_rate(min(tp))}, max {format_rate(max(tp))})"))
        rows.append(("final cc/p/pp", format_clusters(intervals[-1])))
        changes = sum(1 for a, b in zip(intervals, intervals[1:]) if format_clusters(a) != format_clusters(b))
        rows.append(("parameter changes", str(changes)))
    width = max(len(k) for k, _ in rows)
    vwidth = max(len(v) for _, v in rows)
    sep = f"+-{'-' * width}-+-{'-' * vwidth}-+"
    lines = [sep] + [f"| {k:<{width}} | {v:<{vwidth}} |" for k, v in rows] + [sep]
    failures = result.get("failures") or []
    for f in failures[:20]:
        if isinstance(f, dict):
            lines.append(f"failed: {f.get('path', '?')}: {f.get('reason') or f.get('error') or f}")
        else:
            lines.append(f"failed: {f}")
    if len(failures) > 20:
        lines.append(f"... and {len(failures) - 20} more failed file(s)")
    return "\n".join(lines)


def save_plot(intervals: list[dict[str, Any]], path: str, target_bps: float | None = None,
              title: str = "FStream transfer") -> str | None:
    """Write a PNG of throughput and channels over time; return its path, or ``None`` without matplotlib/data."""
    if not intervals:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        from matplotlib.figure import Figure
    except ImportError:
        return None
    t = [_num(r.get("t")) for r in intervals]
    mbps = [_num(r.get("throughput_bps")) / 1e6 for r in intervals]
    cc = [_num(r.get("cc")) for r in intervals]
    par = [_num(r.get("cc")) * max(1.0, _num(r.get("p"), 1.0)) for r in intervals]
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(t, mbps, color="tab:blue", marker=".", label="throughput")
    if target_bps:
        ax.axhline(target_bps / 1e6, color="tab:red", linestyle="--", label="target")
    ax.set_xlabel("elapsed (s)")
    ax.set_ylabel("Mbit/s")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.step(t, cc, where="post", color="tab:green", label="cc (channels)")
    ax2.step(t, par, where="post", color="tab:orange", linestyle=":", label="cc×p (TCP streams)")
    ax2.set_ylabel("channels / streams")
    ax2.set_ylim(bottom=0)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="lower right", fontsize="small")
    ax.set_title(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def build_report(job_id: str, events: list[tuple[str, dict[str, Any]]], target_bps: float | None) -> dict[str, Any]:
    """The XCom report: the agent's result plus the job id, state and parameter timeline."""
    done = done_event(events) or {}
    result = dict(done.get("result") or {})
    intervals = result.get("intervals") or intervals_from_events(events)
    report = {
        "job_id": job_id,
        "state": done.get("state"),
        "error": done.get("error"),
        "files": int(_num(result.get("files"))),
        "bytes": int(_num(result.get("bytes"))),
        "seconds": _num(result.get("seconds")),
        "throughput_bps": _num(result.get("throughput_bps")),
        "verified_files": int(_num(result.get("verified_files"))),
        "skipped_files": int(_num(result.get("skipped_files"))),
        "failed_files": int(_num(result.get("failed_files"))),
        "failures": result.get("failures") or [],
        "target_throughput_bps": target_bps,
        "intervals": [
            {k: r.get(k) for k in ("t", "throughput_bps", "cc", "p", "pp", "reason", "files_done", "files_pending")}
            for r in intervals
        ],
    }
    return report
