"""A tuner bounded by a stream grant (ADAPT: "clients adapt within their allocation", report §1.2.2, Fig. 3).

``Granted(tuner, grant)`` wraps any tuner: its layouts pass through unchanged while their streams (the
sum of cc x p over clusters) fit ``grant()``, the streams the pool currently grants this agent; beyond it
the channels of each cluster are cut in proportion (at least one per cluster that has one), then, if one
channel each is still too many streams, their p. The tuner keeps profiling and deciding as before; only
what is opened is bounded, and the reason says so. ``grant()`` returning None means no pool: no bound.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from fstream_provider.tuning.base import ClusterLayout, FileInfo, Observation, Suggestion, Tuner


def fit_streams(layouts: tuple[ClusterLayout, ...], budget: int,
               what: str = "pool grant") -> tuple[tuple[ClusterLayout, ...], str]:
    """``layouts`` cut to at most ``budget`` streams in all (cc x p summed), and what was cut ("" if nothing).

    A layout keeps its other fields (a ``qos.PacedLayout``'s rate cap): only cc and p are cut."""
    streams = sum(c.cc * c.p for c in layouts)
    if streams <= budget or not layouts:
        return layouts, ""
    budget = max(budget, 1)
    scale = budget / streams
    out = [replace(c, cc=max(1, math.floor(c.cc * scale)) if c.cc else 0) for c in layouts]
    while sum(c.cc * c.p for c in out) > budget:  # one channel each may still be too much: narrow the widest
        i = max(range(len(out)), key=lambda k: (out[k].cc * out[k].p, out[k].p))
        c = out[i]
        if c.cc > 1:
            out[i] = replace(c, cc=c.cc - 1)
        elif c.p > 1:
            out[i] = replace(c, p=c.p - 1)
        else:
            break  # one stream per cluster is the least a transfer can run on
    cut = ", ".join(f"{a.cluster} cc={a.cc} p={a.p} -> cc={b.cc} p={b.p}" for a, b in zip(layouts, out) if a != b)
    return tuple(out), f"{what} {budget} stream(s): {cut}"


class Granted:
    """``tuner``, with every suggestion bounded by ``grant()`` streams.

    :param tuner: the tuner to bound.
    :param grant: the streams held now (None: no pool, no bound).
    """

    def __init__(self, tuner: Tuner, grant: Callable[[], int | None]) -> None:
        self.tuner, self.grant = tuner, grant
        self.name = getattr(tuner, "name", "tuner")
        self._last: tuple | None = None
        self.wanted = 0  # streams the tuner's last layout asked for, before the grant cut it

    def __getattr__(self, item: str):  # observe_every_s, decisions, variant...: the wrapped tuner's
        return getattr(self.tuner, item)

    def cluster_of(self, file: FileInfo) -> str:
        return self.tuner.cluster_of(file)

    def update(self, observation: Observation) -> None:
        self.tuner.update(observation)

    def suggest(self) -> Suggestion:
        s = self.tuner.suggest()
        self.wanted = sum(c.cc * c.p for c in s.layouts)
        budget = self.grant()
        if budget is None:
            return s
        layouts, note = fit_streams(s.layouts, budget)
        key = (layouts, s.held)
        changed, self._last = key != self._last, key
        reason = s.reason if not note else (f"{s.reason}; {note}" if s.reason else note)
        return Suggestion(layouts, reason, changed, held=s.held)
