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
