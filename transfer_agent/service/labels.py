"""Label values the daemons' metrics may take, each from a bounded set (issue 30, "Prometheus metrics").

A label value that grows with the data (a file, a job, a reason's free text) would make a time series per
value; every label here is a fixed set (outcomes, reason kinds, clusters, tuners) or capped (destination
paths: the first ``PATH_CAP`` seen keep their own value, the rest fold into ``"other"``). No metric carries a
per-file or per-job label. Pure functions and one small class: no ``prometheus_client`` here.
"""

from __future__ import annotations

import re
import threading
from typing import Any

OTHER = "other"
PATH_CAP = 32  # destinations (host:port) an agent labels on its own; more fold into "other"

#: the outcome of a file at the receiver (``files_<outcome>`` in ``Receiver.stats``; ``ok``: committed)
RECEIVER_OUTCOMES = {"ok": "files_committed", "checksum_mismatch": "files_checksum_mismatch",
                     "aborted": "files_aborted", "skipped": "files_skipped", "refused": "files_refused",
                     "stale": "files_stale", "write_failed": "files_write_failed",
                     "commit_failed": "files_commit_failed"}
#: why a connection was refused before it authenticated, by the error's kind (``preauth_<kind>``)
PREAUTH_KINDS = {"auth": "auth_failed", "protocol": "protocol_error", "network": "disconnected"}
PREAUTH_REASONS = ("auth_failed", "disconnected", "protocol_error", "handshake_failed", "handshake_timeout",
                   "too_many_unauthenticated", "evicted")
#: the outcome of a file at the agent (the transfer's ``file`` events)
AGENT_OUTCOMES = ("committed", "skipped", "failed")
CLUSTERS = ("small", "large", "all")
JOB_OUTCOMES = ("succeeded", "failed", "cancelled", "refused", "preempted")

#: a tuner's decision, by the first word of its reason (after the ``tuner:`` prefix), folded into these kinds
REASON_KINDS = ("start", "heuristic", "history", "measuring", "profiling", "qos", "waiting", "kept", "fixed",
                "preset", "model", "error", OTHER)
_FIRST_WORD = {"start": "start", "total": "start", "heuristic": "heuristic", "new": "heuristic",
               "history": "history", "measuring": "measuring", "profiling": "profiling", "plateau": "profiling",
               "utility": "profiling", "qos": "qos", "rate": "qos", "waiting": "waiting", "no": "waiting",
               "channels": "waiting", "kept": "kept", "cc": "kept", "fixed": "fixed", "settings": "fixed",
               "preset": "preset", "algorithm": "model", "shared": "model", "tuner": "error"}
_WORD = re.compile(r"[a-z]+")


def reason_kind(reason: str) -> str:
    """The kind of a tuner's reason text: ``"fstream: heuristic small: cc=2 ..."`` → ``heuristic``; unknown → other."""
    text = (reason or "").strip().lower()
    head, sep, rest = text.partition(":")
    if sep and head and " " not in head.strip():  # "fstream: ...", "adaptivecc: ...": the tuner's name
        text = rest.strip()
    m = _WORD.match(text)
    return _FIRST_WORD.get(m.group(0), OTHER) if m else OTHER


def one_of(value: Any, allowed: tuple[str, ...]) -> str:
    """``value`` if it is one of ``allowed``, else ``"other"``."""
    return value if value in allowed else OTHER


def destination(spec: Any) -> str:
    """A job's destination as ``host:port`` (``[v6]:port``) from its ``TransferSpec``; ``other`` if unreadable."""
    try:
        dest = spec.dest
        host = f"[{dest.host}]" if ":" in dest.host else dest.host
        return f"{host}:{int(dest.port)}"
    except (AttributeError, TypeError, ValueError):
        return OTHER


class CappedLabel:
    """The first ``cap`` distinct values keep their own label value; every later one is ``"other"``.

    Remembers only the values it kept (at most ``cap``), so neither the series nor this set grow past it.
    """

    def __init__(self, cap: int = PATH_CAP) -> None:
        if cap < 1:
            raise ValueError(f"label cap {cap}: must be at least 1")
        self.cap = cap
        self._kept: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._kept:
            return value
        with self._lock:
            if value in self._kept or len(self._kept) < self.cap:
                self._kept.add(value)
                return value
        return OTHER
