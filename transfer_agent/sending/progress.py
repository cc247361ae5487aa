"""What a running transfer adds to its interval records for people watching it (issue 27): bytes known and
done, the ETA with its error bar (``tuning.eta``), the streaming lag, and where it stands against its deadline.

- ``bytes_total`` / ``bytes_done``: bytes of the files listed so far (a stream's grow as files arrive)
  and bytes landed (committed or already there); ``bytes_left`` is what is known to be left: the total less
  the bytes sent (those of files still in flight too) and those skipped as already there. Counting only
  landed files as done made the ETA of large files wait for their commits: on the emulated WAN it was
  20-50 % long at 75 % of ``sra`` (``bench deadline wan``, issue 27).
- ``eta``: seconds until what is known lands, ``{"s", "lo", "hi", "rate_bps", "basis", "per_file_s"}``
  from a rolling window of busy intervals (None until two busy intervals moved bytes).
- ``lag`` (watching sources or a feed): ``oldest_s``, the age of the oldest file found but not yet
  landed, measured from its last modification (for an instrument, when it closed it): how far the
  copy is behind the instrument; ``p50_s``/``p99_s``, file-closed -> landed latency over the last
  ``LAG_WINDOW`` landed files; ``landed``, how many that window holds.
- ``deadline`` (with ``spec.deadline``): the ``tuning.deadline.Deadline`` status as a dict with ``at``
  (UNIX seconds) added.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from fstream_provider.tuning.eta import EtaEstimator, record_streams
from transfer_agent.errors import FStreamError

LAG_WINDOW = 512


def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile of an already sorted list."""
    i = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[i]


class LiveProgress:
    """Counts for the interval records; thread-safe (files land on the control session's thread).

    :param streaming: the transfer watches its sources (or takes a feed): report lag.
    :param deadline_at: the spec's deadline (UNIX seconds) or None.
    :param link_bps: the path rate the user stated (``--bandwidth``), a floor on the ETA; None: not known.
    """

    def __init__(self, *, streaming: bool, deadline_at: float | None = None, link_bps: float | None = None) -> None:
        self.streaming, self.deadline_at = streaming, deadline_at
        self.eta = EtaEstimator(link_bps=link_bps)  # the path rate the user stated: the ETA's floor
        self.bytes_total = 0
        self.bytes_done = 0
        self.bytes_moved = 0  # sent by the channels (the interval records' bytes, summed)
        self.bytes_skipped = 0  # landed without being sent (already at the destination)
        self._files_done = 0
        self._files_seen = 0  # files done at the last record: the next record's ETA row counts the difference
        self._waiting: dict[str, float] = {}  # source path -> its close time (mtime), until it lands
        self._latency: deque[float] = deque(maxlen=LAG_WINDOW)
        self._lock = threading.Lock()

    @classmethod
    def of(cls, spec: Any, *, fed: bool = False) -> "LiveProgress":
        """A transfer's progress: streaming when it watches its sources or takes a feed (``fed``), with the spec's
        deadline and its stated path rate (``bandwidth_bps``) as the ETA's floor."""
        return cls(streaming=bool(spec.watch) or fed, deadline_at=spec.deadline, link_bps=spec.bandwidth_bps)

    def added(self, files: list[Any]) -> None:
        """Files listed (``SrcFile``: ``src``, ``size``, ``mtime_ns``)."""
        with self._lock:
            for sf in files:
                if sf.src not in self._waiting:
                    self.bytes_total += sf.size
                    self._waiting[sf.src] = sf.mtime_ns / 1e9

    def landed(self, sf: Any, *, ok: bool, sent: bool = True, now: float | None = None) -> None:
        """A file ended: committed or skipped (``ok``; ``sent`` False: skipped, already there), or failed (no
        longer waited for, not counted done)."""
        now = time.time() if now is None else now
        with self._lock:
            closed = self._waiting.pop(sf.src, None)
            if not ok:
                self.bytes_total -= sf.size if closed is not None else 0
                return
            self.bytes_done += sf.size
            self.bytes_skipped += 0 if sent else sf.size
            self._files_done += 1
            if closed is not None:
                self._latency.append(max(0.0, now - closed))

    def fields(self, rec: dict, *, busy: bool, deadline: Any = None, now: float | None = None) -> dict:
        """The live fields for interval record ``rec`` (``t``, ``dt``, ``bytes``, ``files_pending``,
        ``active_files``); ``busy``: work was outstanding; ``deadline``: the tuner's ``DeadlineStatus``."""
        now = time.time() if now is None else now
        with self._lock:
            self.bytes_moved += rec["bytes"]
            done, total, files_done = self.bytes_done, self.bytes_total, self._files_done
            covered = max(done, self.bytes_moved + self.bytes_skipped)
            oldest = min(self._waiting.values(), default=None)
            lat = sorted(self._latency)
        self.eta.add(rec["t"], rec["dt"], rec["bytes"], files=files_done - self._files_seen, busy=busy,
                     streams=record_streams(rec))  # a new layout restarts the window
        self._files_seen = files_done
        left = max(0, total - covered)
        files_left = int(rec.get("files_pending") or 0) + int(rec.get("active_files") or 0)
        eta = self.eta.estimate(left, files_left)
        out: dict[str, Any] = {"bytes_total": total, "bytes_done": done, "bytes_left": left,
                               "eta": eta.as_dict() if eta is not None else None}
        if self.streaming:
            out["lag"] = {"oldest_s": round(max(0.0, now - oldest), 3) if oldest is not None else 0.0,
                          "p50_s": round(_quantile(lat, 0.5), 3) if lat else None,
                          "p99_s": round(_quantile(lat, 0.99), 3) if lat else None,
                          "landed": len(lat)}
        if self.deadline_at is not None:
            d = deadline.as_dict() if deadline is not None else {"state": "probing", "target_bps": None,
                                                                 "message": "waiting for the first measurement"}
            if not busy and left == 0 and total > 0:  # everything known landed: the verdict, not the last plan
                late = now - self.deadline_at
                d = {**d, "state": "met" if late <= 0 else "missed", "target_bps": None,
                     "message": f"everything landed {abs(late):.1f} s {'before' if late <= 0 else 'after'} the deadline"}
            out["deadline"] = {"at": self.deadline_at, **d}
        return out


class DeadlineNews:
    """Says once per change where a transfer stands against its deadline: a ``deadline`` event, a log line (a
    WARNING when at risk or infeasible, naming the shortfall) and, with ``on_risk="fail"``, the error that stops
    an infeasible transfer."""

    def __init__(self, on_risk: str, log: Any, on_event: Any) -> None:
        self.on_risk, self.log, self.on_event = on_risk, log, on_event
        self._state = ""

    def __call__(self, status: Any, deadline_at: float | None) -> None:
        if status is None or status.state == self._state:
            return
        self._state = status.state
        data = {"at": deadline_at, **status.as_dict()}
        self.on_event("deadline", data)
        risky = status.state in ("at-risk", "infeasible", "missed")
        self.log.log(30 if risky else 20, "deadline %s: %s", status.state, status.message)
        if status.state == "infeasible" and self.on_risk == "fail":
            raise FStreamError(f"deadline cannot be met ({status.message}); on_deadline_risk=fail stops the "
                               "transfer (files already landed stay)", retryable=False)
