"""Time left, with an error bar, for what is known to be left (issue 27).

Remaining time is remaining bytes over a *rolling* rate (the last ``window_s`` seconds of busy
intervals, not the lifetime average), plus remaining files times the per-file cost when the window
measures one. Both come from one least-squares fit through the origin of interval length on what
the interval moved (OLS, :mod:`fstream_provider.tuning.ols`: statsmodels' numbers without its memory):

    dt_i = bytes_i / R                      (basis "rate")
    dt_i = bytes_i / R + files_i * c        (basis "rate+files", when c is measurable: > 0 and
                                             significant at 5 %, with enough intervals)

and the error bar is the fit's 90 % confidence interval of that mean prediction at
``(remaining bytes, remaining files)``: it widens when the recent rate varies and narrows as
the window fills with steady intervals. An interval in which nothing was outstanding (a stream
waiting for the instrument) is not busy and is left out: it says nothing about how fast the
backlog drains. The per-file term matters when what is left differs from the window's mix (a
tail of small files after large ones); otherwise the two bases agree.

The window restarts at a layout change (issue 44): when the streams open change by more than half
(``RESTART_CHANGE``), the rows before the change are dropped once the new layout has ``MIN_REGIME`` busy
intervals of its own (until then the whole window stands: an ETA never disappears). Without it the first
seconds' ramp-up and profiling layouts held the rate down for the whole 20 s window: replayed over the 24
backlogged WAN runs committed before the change (``fstream bench deadline replay``), the median error at
25 % fell from 9.3 % to 3.9 % (runs over 10 %: 12 to 4), at 50 % from 4.6 % to 2.1 % (2 to 0), and at 75 %
it rose from 2.5 % to 3.1 % (over 10 %: 2 to 3 runs).

A known path rate is a floor (issue 44, ``link_bps``): what is left cannot land faster than the bottleneck carries
it, so the estimate is never below ``remaining bytes / link_bps`` (basis "link"). The senders count bytes as the
channels hand them to the kernel, so right after a layout opens many streams the window's rate includes their socket
buffers filling and reads above the link (1.8 Gbit/s on a 1 Gbit/s path): the ETA was then seconds short. Only a rate
the user stated is used (``--bandwidth``), never an assumed default. Replayed over the 52 backlogged WAN runs committed
before the change (``fstream bench deadline replay``, ``deadline-replay-20261130-141900``): runs over 10 % at 25 % of
the bytes 8 -> 5 (w3's median 10.0 % -> 6.5 %), at 50 % the largest error 26 % -> 12 %, at 75 % one run more over
10 % (5 -> 6); no workload's median rose at any point.

A window is fitted once: asking again before the next interval (the deadline's ETA at its own remaining
bytes, after the live record's) predicts from the same fit. So one estimator serves a sender's live ETA and
its deadline with one fit per interval (issue 42; before, each kept an estimator and fitted every second).

This is a pure module (no I/O): the sender feeds it its interval records, the simulator its
intervals, and ``bench/eta_bench`` scores it against the time the transfer really took.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from fstream_provider.tuning import ols

DEFAULT_WINDOW_S = 20.0
LEVEL = 0.90
MIN_FILES_FIT = 8  # intervals before a per-file cost is fitted
RESTART_CHANGE = 0.5  # a change of the streams open by more than this share starts a new window
MIN_REGIME = 3  # busy intervals of the new layout before the old rows are dropped


@dataclass(frozen=True)
class Eta:
    """Seconds left: ``s`` (best estimate), ``lo``..``hi`` (90 % interval), at ``rate_bps`` (the rolling rate).

    :param basis: "rate" or "rate+files" (which fit gave it), "link" (the fit said less than the bytes left take at
        the stated path rate: that time), "done" when nothing is left.
    :param per_file_s: the fitted per-file cost (0 under "rate").
    """

    s: float
    lo: float
    hi: float
    rate_bps: float
    basis: str
    per_file_s: float = 0.0

    def as_dict(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


class EtaEstimator:
    """Rolling ETA of a transfer.

    :param window_s: length of the rolling window of busy intervals.
    :param level: confidence level of the interval.
    :param link_bps: the path's rate as the user stated it (bits/s), a floor on the time left; None: not known.
    """

    def __init__(self, window_s: float = DEFAULT_WINDOW_S, level: float = LEVEL,
                 link_bps: float | None = None) -> None:
        if window_s <= 0:
            raise ValueError(f"ETA window {window_s!r}: must be positive seconds")
        if link_bps is not None and not link_bps > 0:
            raise ValueError(f"ETA link rate {link_bps!r}: must be positive bits/s (or None: not known)")
        self.window_s, self.level = float(window_s), float(level)
        self.link_bps = link_bps
        self._rows: deque[tuple[float, float, float, float]] = deque()  # (t, dt, bytes, files)
        self._fits: dict[str, Any] = {}  # "rate" / "files" -> the window's fit (None: no per-file cost); per window
        self._streams: float | None = None  # the streams of the layout the window holds
        self._regime = 0  # busy intervals since that layout started (MIN_REGIME: the older rows are dropped)

    def add(self, t: float, dt: float, nbytes: float, files: float = 0.0, busy: bool = True,
            streams: float | None = None) -> None:
        """One interval ending at ``t`` (seconds), ``dt`` long, that moved ``nbytes`` and finished ``files`` on
        ``streams`` TCP streams (None: not known, no restart)."""
        if dt <= 0 or not busy:
            return
        if streams is not None and streams > 0:
            if self._streams is None or abs(streams - self._streams) > RESTART_CHANGE * self._streams:
                self._streams, self._regime = float(streams), 0
            self._regime += 1
        self._rows.append((float(t), float(dt), float(nbytes), float(files)))
        if self._regime == MIN_REGIME:  # the new layout has its own rows: the ones before it are another rate
            while len(self._rows) > MIN_REGIME:
                self._rows.popleft()
        while self._rows and self._rows[0][0] <= t - self.window_s:
            self._rows.popleft()
        self._fits.clear()  # a new window: fitted again when next asked

    def rate_bps(self) -> float:
        """The rolling rate (bits/s) over the window; 0 before any busy interval."""
        dt = sum(r[1] for r in self._rows)
        return sum(r[2] for r in self._rows) * 8 / dt if dt > 0 else 0.0

    def estimate(self, remaining_bytes: float, remaining_files: float = 0.0) -> Eta | None:
        """Time left for ``remaining_bytes`` in ``remaining_files``; None until two busy intervals moved bytes."""
        rate = self.rate_bps()
        if remaining_bytes <= 0 and remaining_files <= 0:
            return Eta(0.0, 0.0, 0.0, rate, "done")
        if len(self._rows) < 2 or rate <= 0:
            return None
        alpha = 1 - self.level
        fit = self._fit("files") if len(self._rows) >= MIN_FILES_FIT and remaining_files > 0 else None
        if fit is not None:
            res, basis, x = fit, "rate+files", (remaining_bytes, remaining_files)
        else:
            res, basis, x = self._fit("rate"), "rate", (remaining_bytes,)
        mean, lo, hi = res.predict(x, alpha)
        if not math.isfinite(mean) or mean <= 0:
            return None
        per_file = float(res.params[1]) if basis == "rate+files" else 0.0
        slope = float(res.params[0])
        fitted_bps = 8 / slope if slope > 0 else rate
        floor = remaining_bytes * 8 / self.link_bps if self.link_bps else 0.0
        if mean < floor:  # faster than the path can carry it: the bytes left at the path's rate
            return Eta(floor, floor, max(hi, floor), min(fitted_bps, float(self.link_bps)), "link", per_file)
        return Eta(mean, max(0.0, min(lo, mean), floor), max(hi, mean), fitted_bps, basis, per_file)

    def _fit(self, kind: str) -> Any:
        """The window's ``kind`` fit, computed once per window: "rate" (bytes only) or "files" (bytes + files,
        None unless it measures a per-file cost: both coefficients > 0, files significant at 5 %)."""
        if kind not in self._fits:
            _, y, xb, xf = (list(column) for column in zip(*self._rows))
            if kind == "rate":
                self._fits[kind] = ols.fit(y, xb)
            elif max(xf) <= min(xf) or len({b / max(f, 1.0) for b, f in zip(xb, xf)}) <= 1:
                self._fits[kind] = None
            else:
                res = ols.fit(y, list(zip(xb, xf)))
                self._fits[kind] = None if not res.params[0] > 0 or not res.params[1] > 0 \
                    or not res.pvalues[1] < 0.05 else res
        return self._fits[kind]


def record_streams(rec: dict) -> float | None:
    """The TCP streams an interval record ran on: every cluster's cc x p, or the record's cc x p when it keeps
    no clusters (a benchmark's trimmed record); None when it says neither."""
    clusters = rec.get("clusters")
    if clusters:
        return float(sum(int(c.get("cc") or 0) * int(c.get("p") or 0) for c in clusters.values()))
    if rec.get("cc") is None or rec.get("p") is None:
        return None
    return float(rec["cc"] * rec["p"])
