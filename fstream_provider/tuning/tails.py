"""Straggler tails (issue 44): a cluster keeps the channels its queued large files need in the time left.

``fstream.split_cc`` shares the channels between clusters by time to drain (pending bytes over a channel's
rate), as if a cluster's bytes could spread over any number of channels. They cannot: a file runs on one
channel, so a cluster's finish is at least its longest queued file's time on one channel after that file
starts (list scheduling, Graham 1969: the makespan is bounded below by the largest job, and the
longest-first order keeps it there). When a few large files share the path with many small ones, the small
cluster's drain time outweighs the large one's, the split hands the large cluster's channels to the small
files, and a large file still queued starts late and ends alone on one channel: the last seconds run at one
channel's rate while every other channel has nothing to do (the backlogged mix of issue 44: 0.79-0.84 of
``static`` on the WAN).

The rule: estimate the time left as the bytes still queued over the rate just measured. A cluster whose
queued file would take a quarter of that time or more on one channel keeps a channel for each file it has in
flight plus enough for its queued files to start while they can still finish in time (``ceil(k / m)``, ``m``
files one after another per channel in the time left, at least one). The floor only keeps channels from
being taken away from such a cluster; ``apply_floors`` takes what it needs from the clusters that have the
most, never below one channel each, and the total stays what profiling decided.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from fstream_provider.tuning.base import ClusterStats
from fstream_provider.tuning.common import fmt_size

#: a queued file that takes this share of the time left on one channel must not wait for a free one
SHARE_OF_TIME_LEFT = 0.25


@dataclass(frozen=True)
class Floor:
    """The fewest channels a cluster keeps. :param cc: the floor. :param reason: why, for the tuner's log."""

    cc: int
    reason: str


def tail_floors(stats: Mapping[str, ClusterStats], per_channel_bps: Mapping[str, float], rate_bps: float,
                max_cc: int) -> dict[str, Floor]:
    """Each cluster's floor (only clusters whose queued files are long against the time left).

    :param stats: the last interval's per-cluster statistics (queued files and bytes, channels that carried data).
    :param per_channel_bps: each cluster's measured rate per channel.
    :param rate_bps: the aggregate rate just measured (the time left is the queued bytes over it).
    :param max_cc: the most channels a cluster can have.
    """
    queued = sum(max(st.pending_bytes, 0) for st in stats.values())
    if not rate_bps > 0 or queued <= 0:
        return {}
    left = queued * 8 / rate_bps
    if not math.isfinite(left):  # a rate too small to tell the time left (5e-324 bit/s): no floor, not a NaN
        return {}
    out = {}
    for name, st in sorted(stats.items()):
        per = per_channel_bps.get(name) or 0.0
        if st.pending_files <= 0 or per <= 0:
            continue
        one = st.pending_bytes / st.pending_files * 8 / per
        if one < SHARE_OF_TIME_LEFT * left:
            continue
        fit = max(1, math.floor(left / one))  # queued files one channel finishes in the time left
        need = math.ceil(st.pending_files / fit)
        cc = min(max_cc, st.active_channels + need)
        out[name] = Floor(cc, f"{name} keeps cc>={cc}: {st.pending_files} queued file(s) of "
                              f"{fmt_size(st.pending_bytes / st.pending_files)} take {one:.1f} s each on one channel, "
                              f"{left:.1f} s left; {st.active_channels} in flight")
    return out


def apply_floors(cc: Mapping[str, int], floors: Mapping[str, Floor]) -> dict[str, int]:
    """Raise each cluster to its floor with channels from the others (those with the most first, never below
    one); the total stays ``sum(cc)``."""
    out = dict(cc)
    for name in sorted(floors, key=lambda n: (-floors[n].cc, n)):
        if name not in out:
            continue
        while out[name] < floors[name].cc:
            donors = [n for n in out if n != name and out[n] > max(1, floors[n].cc if n in floors else 1)]
            if not donors:
                break
            donor = max(donors, key=lambda n: (out[n], n))
            out[donor] -= 1
            out[name] += 1
    return out
