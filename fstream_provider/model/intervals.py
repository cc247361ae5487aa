"""Interval records as every view shows them: a sliver (an interval much shorter than the job's) folded into the last.

The agent records one interval every ``sample_interval_s`` and a last one when the transfer ends, however
little time has passed since the one before: a 0.08 s sliver whose rate (a few blocks over a few
milliseconds) says nothing, yet showed as a dip in the charts, a second log line and the timeline's
minimum (issue 41). :func:`fold_slivers` is the one place that decides it, used by the task log, the summary
table, the XCom report, the plot and the live views: a record whose ``dt`` is under ``SLIVER_FRACTION`` of the
job's interval is added to the record before it (bytes and time summed, the rate recomputed from the sums,
the rest taken from the later record, which ends the merged interval).

Pure functions on plain dicts (no Redis, no Airflow).
"""

from __future__ import annotations

from statistics import median_high
from typing import Any

SLIVER_FRACTION = 0.1


def _num(v: Any) -> float | None:
    try:
        return float(v) if v not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _bytes(rec: dict[str, Any]) -> float | None:
    """The record's bytes, or its rate times its length when an older record lacks them."""
    b = _num(rec.get("bytes"))
    if b is not None:
        return b
    bps, dt = _num(rec.get("throughput_bps")), _num(rec.get("dt"))
    return bps * dt / 8 if bps is not None and dt is not None else None


def job_interval(intervals: list[dict[str, Any]]) -> float | None:
    """The job's interval: the upper median of its records' ``dt`` (a sliver or two cannot pull it down)."""
    dts = [d for d in (_num(r.get("dt")) for r in intervals) if d is not None and d > 0]
    return median_high(dts) if dts else None


def is_sliver(rec: dict[str, Any], interval_s: Any) -> bool:
    """``rec`` lasted less than ``SLIVER_FRACTION`` of ``interval_s`` (False when either length is unknown)."""
    dt, ref = _num(rec.get("dt")), _num(interval_s)
    return dt is not None and ref is not None and ref > 0 and dt < SLIVER_FRACTION * ref


def fold(prev: dict[str, Any], sliver: dict[str, Any]) -> dict[str, Any]:
    """``prev`` and the ``sliver`` after it as one interval (a new dict; ``folded`` counts the records added).

    Time and bytes add up and the rate is recomputed from the sums, overall and per cluster; everything else
    (``t``, ``ts``, files, layout, ETA, lag, deadline) is the sliver's, the newer state. The tuner's reason
    is the sliver's when it gave one, else the earlier record's.
    """
    dt = (_num(prev.get("dt")) or 0.0) + (_num(sliver.get("dt")) or 0.0)
    nbytes = (_bytes(prev) or 0.0) + (_bytes(sliver) or 0.0)
    out = {**sliver, "dt": round(dt, 6), "bytes": int(nbytes) if float(nbytes).is_integer() else nbytes,
           "throughput_bps": nbytes * 8 / dt if dt > 0 else 0.0,
           "folded": int(prev.get("folded") or 0) + 1 + int(sliver.get("folded") or 0)}
    if not sliver.get("reason"):
        out["reason"] = prev.get("reason", sliver.get("reason"))
        if prev.get("tuning_event"):
            out["tuning_event"] = True
        else:
            out.pop("tuning_event", None)
    pc, sc = prev.get("clusters"), sliver.get("clusters")
    if isinstance(pc, dict) and isinstance(sc, dict) and dt > 0:
        pdt, sdt = _num(prev.get("dt")) or 0.0, _num(sliver.get("dt")) or 0.0
        out["clusters"] = {
            name: {**c, "throughput_bps": ((_num((pc.get(name) or {}).get("throughput_bps")) or 0.0) * pdt
                                           + (_num(c.get("throughput_bps")) or 0.0) * sdt) / dt}
            if isinstance(c, dict) else c for name, c in sc.items()}
    return out


def fold_slivers(intervals: list[dict[str, Any]], interval_s: float | None = None) -> list[dict[str, Any]]:
    """``intervals`` with each sliver folded into the record before it (a new list; the input is unchanged).

    ``interval_s`` is the job's interval (default :func:`job_interval` of the records). A first record has
    nothing before it and stays; records without ``dt`` (an older agent's) are never slivers. Folding a folded
    list changes nothing.
    """
    if any(r.get("folded") for r in intervals):  # folded already (the reference would move: fold once only)
        return list(intervals)
    ref = interval_s if interval_s else job_interval(intervals)
    out: list[dict[str, Any]] = []
    for rec in intervals:
        if out and is_sliver(rec, ref):
            out[-1] = fold(out[-1], rec)
        else:
            out.append(rec)
    return out


class LiveFold:
    """Folds slivers as interval events arrive one by one (a live view's stream; the job's interval: the last
    record's ``dt``, the only one known then).

    :param last: the last interval record already shown (a snapshot's), if any.
    """

    def __init__(self, last: dict[str, Any] | None = None) -> None:
        self.last = last

    def add(self, rec: dict[str, Any]) -> dict[str, Any] | None:
        """The record that replaces the last one shown when ``rec`` is a sliver of it (``fold``), else None
        (``rec`` is shown as a new interval). Either way it is the last record from now on."""
        if self.last is not None and is_sliver(rec, self.last.get("dt")):
            self.last = fold(self.last, rec)
            return self.last
        self.last = rec
        return None
