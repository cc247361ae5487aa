"""The FStream heuristic (thesis ch. 2 Alg. 1 / ch. 3 "Algorithm 3" call), as DESIGN.md reads it.

``pp = min(round(BDP / avg), 100)``; ``p = max(min(ceil(BDP / buf), ceil(avg / buf)), 1)``;
``cc = min(max(round(BDP / avg), 2), file_count, max_cc)``; finally clamped to the path's
``max_p`` / ``max_pp`` and to at least one channel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fstream_provider.tuning.base import PathInfo


@dataclass(frozen=True)
class Settings:
    """One (cc, p, pp) triple.

    :param cc: channels.
    :param p: TCP streams per channel.
    :param pp: files queued ahead per channel.
    """

    cc: int
    p: int
    pp: int


@dataclass(frozen=True)
class StartLayout:
    """A user-given starting point for an adaptive tuner; a value left None comes from the heuristic.

    :param cc: channels to start with.
    :param p: TCP streams per channel to start with.
    :param pp: files queued ahead per channel to start with.
    """

    cc: int | None = None
    p: int | None = None
    pp: int | None = None

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.cc, self.p, self.pp))

    def over(self, s: Settings) -> Settings:
        """``s`` with every given value of this start put in its place."""
        return Settings(s.cc if self.cc is None else self.cc, s.p if self.p is None else self.p,
                        s.pp if self.pp is None else self.pp)

    def describe(self) -> str:
        """``"given cc=8 p=2"``, plus where the other values come from when some were left out."""
        given = " ".join(f"{k}={v}" for k, v in (("cc", self.cc), ("p", self.p), ("pp", self.pp)) if v is not None)
        rest = "" if None not in (self.cc, self.p, self.pp) else "; the rest from the heuristic"
        return f"given {given}{rest}"


def heuristic_raw(avg_file_size: float, file_count: int, bdp: float, tcp_buffer: int,
                  max_cc: int) -> Settings:
    """The three formulas exactly (no clamping beyond what they contain)."""
    if avg_file_size <= 0 or bdp <= 0 or tcp_buffer <= 0:
        raise ValueError(f"heuristic: avg_file_size ({avg_file_size}), bdp ({bdp}) and "
                         f"tcp_buffer ({tcp_buffer}) must be > 0")
    ratio = bdp / avg_file_size
    pp = min(round(ratio), 100)
    p = max(min(math.ceil(bdp / tcp_buffer), math.ceil(avg_file_size / tcp_buffer)), 1)
    cc = min(max(round(ratio), 2), file_count, max_cc)
    return Settings(cc, p, pp)


def heuristic(avg_file_size: float, file_count: int, path: PathInfo) -> Settings:
    """Heuristic settings for a cluster of ``file_count`` files, clamped to the path's bounds."""
    raw = heuristic_raw(avg_file_size, max(1, file_count), path.bdp_bytes, path.tcp_buffer, path.max_cc)
    return clamp(raw, path)


def clamp(s: Settings, path: PathInfo) -> Settings:
    """Clamp settings to 1..max_cc, 1..max_p, 0..max_pp."""
    return Settings(min(max(s.cc, 1), path.max_cc), min(max(s.p, 1), path.max_p),
                    min(max(s.pp, 0), path.max_pp))
