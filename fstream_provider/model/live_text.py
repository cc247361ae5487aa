"""Words for the live fields of an interval record (issue 27): ETA with its interval, lag, deadline state.

One wording for the CLI's progress line, the Airflow task log and ``fstream top``; each takes the field
as the agent stores it (``transfer_agent.sending.progress``). The ``*_span`` forms (for a column that
names what it shows) give ``-`` when there is none; the ``*_text`` forms (for running text) give "".
"""

from __future__ import annotations

import datetime as dt
from typing import Any


def dur(seconds: Any) -> str:
    """``4.2s``, ``42s``, ``3m05s``, ``2h07m``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    s = max(0.0, float(seconds))
    if s < 60:
        return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def eta_span(eta: Any) -> str:
    """``42s (31s..1m01s)``: the estimate and its interval; ``done`` when nothing is left."""
    if not isinstance(eta, dict) or eta.get("s") is None:
        return "-"
    if eta.get("basis") == "done":
        return "done"
    lo, hi = eta.get("lo"), eta.get("hi")
    return dur(eta["s"]) + (f" ({dur(lo)}..{dur(hi)})" if lo is not None and hi is not None else "")


def lag_span(lag: Any) -> str:
    """``3.5s p50 1.2s p99 2.8s``: the oldest waiting file's age and closed->landed latencies."""
    if not isinstance(lag, dict):
        return "-"
    parts = [dur(lag["oldest_s"])] if lag.get("oldest_s") is not None else []
    parts += [f"{name} {dur(lag[key])}" for name, key in (("p50", "p50_s"), ("p99", "p99_s"))
              if lag.get(key) is not None]
    return " ".join(parts) or "-"


def eta_text(eta: Any) -> str:
    return "" if eta_span(eta) == "-" else f"ETA {eta_span(eta)}"


def lag_text(lag: Any) -> str:
    return "" if lag_span(lag) == "-" else f"lag {lag_span(lag)}"


def deadline_text(d: Any) -> str:
    """``deadline 18:00:00Z on-track``."""
    if not isinstance(d, dict):
        return ""
    at = d.get("at")
    when = dt.datetime.fromtimestamp(at, dt.timezone.utc).strftime("%H:%M:%SZ") if at else "?"
    return f"deadline {when} {d.get('state', '?')}"


def live_text(rec: dict) -> str:
    """All three for one interval record, joined; "" when it has none."""
    return ", ".join(t for t in (eta_text(rec.get("eta")), lag_text(rec.get("lag")),
                                 deadline_text(rec.get("deadline"))) if t)
