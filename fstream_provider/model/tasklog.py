"""Turn a job's event stream into task-log lines operators can read: per interval, a summary table, warnings, a plot.

Pure formatting (no Redis, no Airflow); the PNG uses matplotlib's Agg backend when it is installed.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable
from urllib.parse import urlsplit

from fstream_provider.model.intervals import fold_slivers, is_sliver
from fstream_provider.model.live_text import deadline_text, live_text
from fstream_provider.model.plot import decisions, layout_key, save_plot  # noqa: F401 - save_plot re-exported
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

    Example: ``t=  12.0s  812.40 Mbit/s (target 800.00 Mbit/s, 102%)  cc/p/pp small 4/1/8  files 120 done, 32 in
    flight, 30 pending``
    followed by ``  tuner: <reason>`` when the tuner changed something (or gave a reason). A reason that a
    ``tuning`` event already carried (the record says ``tuning_event``) is not repeated: its ``tuning:`` line
    is just above; a reason no such event carried (the tuner failed and the layout was kept) stays here.
    """
    t = _num(rec.get("t"))
    bps = _num(rec.get("throughput_bps"))
    target = rec.get("target_bps") or target_bps
    line = f"t={t:7.1f}s  {format_rate(bps):>13}"
    if target:
        line += f" (target {format_rate(float(target))}, {100.0 * bps / float(target):.0f}%)"
    line += f"  cc/p/pp {format_clusters(rec)}"
    done, pending, active = rec.get("files_done"), rec.get("files_pending"), rec.get("active_files")
    if done is not None or pending is not None:
        # in flight: handed to a channel, not committed yet (all of a small transfer from its first second on)
        flight = f"{int(_num(active))} in flight, " if active is not None else ""
        line += f"  files {int(_num(done))} done, {flight}{int(_num(pending))} pending"
    live = live_text(rec)  # ETA, lag and deadline (issue 27) when the agent reports them
    if live:
        line += f"  {live}"
    if rec.get("tuning_event"):
        return line  # the `tuning:` line just above gave the reason; this line shows the new layout
    reason = rec.get("reason")
    changed = prev is not None and layout_key(prev) != layout_key(rec)
    if reason and (changed or prev is None or reason != (prev or {}).get("reason")):
        line += f"  tuner: {reason}"
    elif changed:
        line += "  tuner: settings changed"
    return line


def intervals_from_events(events: Iterable[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The interval records of a job, in order, a last sliver folded into the one before (``model.intervals``)."""
    out = []
    for _id, ev in events:
        if ev.get("kind") == "interval":
            rec = ev.get("interval") if isinstance(ev.get("interval"), dict) else ev
            out.append({k: v for k, v in rec.items() if k not in ("kind", "ts")})
    return fold_slivers(out)


def done_event(events: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, Any] | None:
    for _id, ev in events:
        if ev.get("kind") == "done":
            return ev
    return None


def live_event_line(ev: dict[str, Any], target_bps: float | None = None,
                    prev: dict[str, Any] | None = None) -> tuple[int, str] | None:
    """``(logging level, line)`` for one event as it arrives, or ``None`` for events not worth a line.

    Intervals and tuning decisions at INFO; a retry or an error of the job at WARNING (the job may still
    succeed: the task fails, if it does, with the error as its message); a file that failed for good at
    ERROR; the agent's ``log`` events (a session reconnecting) at the level the agent gave them. The trigger
    (deferred) and the operator's poll loop (not deferred) log these live; the summary written when the task
    resumes does not repeat them.

    An interval shorter than a tenth of ``prev``'s (the sliver the agent records when a transfer ends) gets no
    line of its own: ``prev``'s line is already written, and the summary's timeline folds the sliver into it
    (``model.intervals.fold_slivers``), so the log's lines are the summary's intervals. A reason it alone
    carries (no ``tuning:`` line gave it) is still logged.
    """
    kind = ev.get("kind")
    if kind == "interval":
        rec = ev.get("interval") if isinstance(ev.get("interval"), dict) else ev
        if prev is not None:
            before = prev.get("interval") if isinstance(prev.get("interval"), dict) else prev
            if is_sliver(rec, before.get("dt")):
                reason = rec.get("reason")
                if reason and not rec.get("tuning_event") and reason != before.get("reason"):
                    return logging.INFO, f"tuner: {reason}"
                return None
        return logging.INFO, format_interval(rec, target_bps, prev)
    if kind == "tuning":
        return logging.INFO, f"tuning: {ev.get('reason', '')}".rstrip()
    if kind == "retry":
        what = ev.get("message") or ev.get("reason") or ev.get("error") or ""
        delay = f" (try {ev['try']}, in {_num(ev.get('delay')):.1f} s)" if ev.get("try") is not None else ""
        return logging.WARNING, f"retry{delay}: {what}".rstrip()
    if kind == "error":
        return logging.WARNING, f"error: {ev.get('message') or ev.get('error') or ev}"
    if kind == "file" and ev.get("status") == "failed":
        return logging.ERROR, f"file {ev.get('path')} failed: {ev.get('reason', '')}"
    if kind == "log":  # the agent's own notes (a session reconnecting, a file that vanished), at its level
        level = logging.getLevelName(str(ev.get("level") or "info").upper())
        return (level if isinstance(level, int) else logging.INFO), f"agent: {ev.get('message', '')}"
    if kind == "claimed":
        return logging.INFO, f"claimed by agent {ev.get('worker') or ev.get('agent') or '?'}"
    if kind == "preempted":  # the agents' scheduler stopped it at its checkpoint; it resumes from there
        moved = ev.get("committed_bytes")
        kept = f"; {format_bytes(_num(moved))} committed stay and are not sent again" if moved is not None else ""
        return logging.WARNING, f"preempted: {ev.get('reason', '')}{kept}"
    if kind == "scheduled":
        return logging.INFO, f"scheduler: {ev.get('reason', '')}"
    if kind == "deadline":  # at risk, infeasible or missed: a WARNING naming the shortfall, as soon as it is known
        state = ev.get("state", "?")
        level = logging.WARNING if state in ("at-risk", "infeasible", "missed") else logging.INFO
        return level, f"deadline {state}: {ev.get('message', '')}"
    return None


def target_warnings(result: dict[str, Any], intervals: list[dict[str, Any]], target_bps: float | None) -> list[str]:
    """Warnings when a throughput target was missed, with the likely reason.

    Intervals below target with no file waiting are *source-limited* (the instrument or the directory
    produced data slower than the target), which is not something the tuner or the network can fix.
    """
    if not target_bps:
        return []
    intervals = fold_slivers(intervals)
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


def live_summary(intervals: list[dict[str, Any]]) -> dict[str, Any]:
    """The last lag and deadline the agent reported (issue 27), for the XCom report and the summary table."""
    out: dict[str, Any] = {}
    for name in ("lag", "deadline"):
        last = next((r[name] for r in reversed(intervals) if isinstance(r.get(name), dict)), None)
        if last is not None:
            out[name] = last
    return out


def interval_stats(intervals: list[dict[str, Any]]) -> dict[str, Any]:
    """What the summary says about the timeline, from the per-cluster layouts of the interval events.

    ``final_layout`` is the last interval's per-cluster cc/p/pp (``small 4/1/8 · large 2/4/1``) and
    ``parameter_changes`` counts the intervals whose per-cluster layout differs from the one before:
    exactly the changes the interval lines show (a report stripped of ``clusters`` undercounted them).
    """
    if not intervals:
        return {"intervals": 0}
    intervals = fold_slivers(intervals)  # (a no-op on records already folded)
    tp = [_num(r.get("throughput_bps")) for r in intervals]
    return {
        "intervals": len(intervals),
        "min_throughput_bps": min(tp),
        "max_throughput_bps": max(tp),
        "mean_throughput_bps": sum(tp) / len(tp),
        "final_layout": format_clusters(intervals[-1]),
        "parameter_changes": len(decisions(intervals)),
        "last_reason": next((str(r["reason"]) for r in reversed(intervals) if r.get("reason")), None),
    }


def summary_table(result: dict[str, Any], intervals: list[dict[str, Any]], target_bps: float | None = None,
                  job_id: str | None = None) -> str:
    """A fixed-width table summarising the transfer and its parameter timeline (per cluster)."""
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
    live = live_summary(intervals)
    if live.get("lag"):
        lag = live["lag"]
        rows.append(("lag (closed -> landed)", f"p50 {_num(lag.get('p50_s')):.1f} s, p99 {_num(lag.get('p99_s')):.1f} s "
                                               f"over the last {lag.get('landed', 0)} file(s)"))
    if live.get("deadline"):
        d = live["deadline"]
        rows.append(("deadline", f"{deadline_text(d)}: {d.get('message', '')}"))
    if intervals:
        st = interval_stats(intervals)
        rows.append(("intervals", f"{st['intervals']} (min {format_rate(st['min_throughput_bps'])}, "
                                  f"max {format_rate(st['max_throughput_bps'])})"))
        rows.append(("final cc/p/pp", st["final_layout"]))
        rows.append(("parameter changes", str(st["parameter_changes"])))
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

def landed_files(events: Iterable[tuple[str, dict[str, Any]]], destination: str | None = None) -> list[dict[str, Any]]:
    """The files at the destination, from the job's ``file`` events (``committed``, or ``skipped``: already there).

    Each is ``{"path", "destination", "source", "size", "status"}`` plus ``checksum`` when the agent sent one;
    ``destination`` is the file's URL at the receiver: the event's ``path`` is already relative to the
    receiver's root (it includes the ``/dir`` of ``fstream://host:port/dir``), so only scheme and host:port
    are taken from ``destination``. The last event of a path wins (a file retried later is listed once).
    """
    parts = urlsplit(destination or "")
    base = f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""
    out: dict[str, dict[str, Any]] = {}
    for _id, ev in events:
        if ev.get("kind") != "file" or ev.get("status") not in ("committed", "skipped"):
            continue
        rel = str(ev.get("path") or "").lstrip("/")
        rec = {"path": rel, "destination": f"{base}/{rel}" if base else rel, "source": ev.get("source"),
               "size": int(_num(ev.get("size"))), "status": ev.get("status")}
        for k in ("checksum", "digest", "algo"):
            if ev.get(k):
                rec[k] = ev[k]
        out[rel] = rec
    return list(out.values())


def build_report(job_id: str, events: list[tuple[str, dict[str, Any]]], target_bps: float | None,
                 destination: str | None = None, *, max_files: int = 10_000,
                 outcome: dict[str, Any] | None = None) -> dict[str, Any]:
    """The XCom report: the agent's result, the landed files and timeline statistics, bounded in size.

    The full interval timeline is *not* in it (a 12-hour stream sampled every second would put megabytes
    into Airflow's metadata database): it stays in the job's event stream on Redis and in the plot.
    ``landed_files`` is capped at ``max_files`` (``landed_files_truncated`` says when).

    ``outcome`` (``{"state", "error", "result"}``: the job's state as a trusted agent signed it, ``authz.outcome``)
    replaces the stream's ``done`` event, and the landed files are then the signed result's ``landed`` records
    only (issue 40: ``file`` events are not signed; anyone who may write the stream could add some).
    """
    done = outcome if outcome is not None else (done_event(events) or {})
    result = dict(done.get("result") or {})
    intervals = intervals_from_events(events) or fold_slivers(list(result.get("intervals") or []))
    if outcome is not None:
        landed = landed_files([("", {**rec, "kind": "file"}) for rec in result.get("landed") or []
                               if isinstance(rec, dict)], destination)
    else:
        landed = landed_files(events, destination)
    return {
        "job_id": job_id,
        "state": done.get("state"),
        "error": done.get("error"),
        "destination": destination,
        "files": int(_num(result.get("files"))),
        "bytes": int(_num(result.get("bytes"))),
        "seconds": _num(result.get("seconds")),
        "throughput_bps": _num(result.get("throughput_bps")),
        "verified_files": int(_num(result.get("verified_files"))),
        "skipped_files": int(_num(result.get("skipped_files"))),
        "failed_files": int(_num(result.get("failed_files"))),
        "failures": (result.get("failures") or [])[:100],
        "target_throughput_bps": target_bps,
        "timeline": interval_stats(intervals),
        **live_summary(intervals),
        "landed_files": landed[:max_files],
        "landed_files_truncated": len(landed) > max_files,
    }
