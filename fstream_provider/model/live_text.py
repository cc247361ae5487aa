"""Words for the live fields of an interval record (issue 27): ETA with its interval, lag, deadline state.

One wording for the CLI's progress line, the Airflow task log and ``fstream top``; each takes the field
as the agent stores it (``transfer_agent.sending.progress``) and returns "" when there is none.
"""

from __future__ import annotations

import datetime as dt


def _secs(s: float) -> str:
    s = max(0.0, float(s))
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"


def eta_text(eta: dict | None) -> str:
    """``ETA 42s (38s-47s)``; ``done`` when nothing is left."""
    if not eta:
        return ""
    if eta.get("basis") == "done":
        return "ETA done"
    return f"ETA {_secs(eta['s'])} ({_secs(eta['lo'])}-{_secs(eta['hi'])})"


def lag_text(lag: dict | None) -> str:
    """``lag 3s (p50 2s, p99 5s)``: the oldest file not yet landed, and closed->landed latency."""
    if not lag:
        return ""
    out = f"lag {_secs(lag.get('oldest_s') or 0)}"
    if lag.get("p50_s") is not None:
        out += f" (p50 {_secs(lag['p50_s'])}, p99 {_secs(lag['p99_s'])})"
    return out


def deadline_text(d: dict | None) -> str:
    """``deadline 18:00:00Z on-track``."""
    if not d:
        return ""
    at = d.get("at")
    when = dt.datetime.fromtimestamp(at, dt.timezone.utc).strftime("%H:%M:%SZ") if at else "?"
    return f"deadline {when} {d.get('state', '?')}"


def live_text(rec: dict) -> str:
    """All three for one interval record, joined; "" when it has none."""
    return ", ".join(t for t in (eta_text(rec.get("eta")), lag_text(rec.get("lag")),
                                 deadline_text(rec.get("deadline"))) if t)
