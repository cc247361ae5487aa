"""FStream's variants: the thesis' Alg. 1-3 exactly as written, and each of our departures as a named switch.

``thesis`` is ch. 3 as the text reads (``../shared/seeds/fstream-thesis.txt``): Alg. 2 aims at
p = 0.8 of the bandwidth with a 15 % band every 10 s, consults the profiling history only when
the throughput leaves the band (once per dataset, §3.5: by similar average size, then by the
small/large class), extrapolates per channel at most doubling, raises the bandwidth when it is
exceeded; Alg. 3 is the plain ladder. Where the text is silent we read it as follows (stated,
not invented): above the band Alg. 2 lowers cc straight to ``ceil(desired / per-channel)`` (line
10 limits only increases); every interval is profiled, whatever its cause.

``default`` (what ``fstream`` runs unless told otherwise) is the thesis plus every switch below
but ``history-ftype``. A variant is written as a base and switches added or removed, e.g.
``thesis+jump+pacing`` or ``default-pacing``; p, the band and the interval can be set on top
(``--utilisation``, ``--band``, ``--profile-interval``), which overrides what the switches imply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fstream_provider.tuning.profiler import recommended_interval

THESIS_UTILISATION = 0.8
THESIS_BAND = 0.15
THESIS_INTERVAL_S = 10.0

#: Each departure from the thesis, and why we made it.
SWITCHES: dict[str, str] = {
    "start-history": "consult the profiling history at t = 0 too, not only once the throughput has left the "
                     "band (saves the first interval when a similar dataset was profiled before)",
    "short-intervals": "decide every max(2 s, 50 RTT) instead of every 10 s (new channels' slow start is still "
                       "a small part of the window; the thesis' 10 s was chosen at 38 ms)",
    "p90": "aim for 0.9 of the bandwidth instead of 0.8 (the band's upper edge then sits at the link)",
    "plateau-guard": "undo an increase that bought < 5 % and keep below that ceiling for 10 intervals "
                     "(storage- or path-limited transfers otherwise double into contention)",
    "bounded-decrease": "above the band lower cc at most by half per interval (a short burst of background "
                        "traffic otherwise collapses the layout)",
    "skip-starved": "do not profile intervals in which channels ran out of files (an arrival-bound interval "
                    "says nothing about what more channels could do)",
    "jump": "QoS: jump to the channel count the per-channel rate says is needed before walking the ladder",
    "pacing": "QoS: cap each cluster's rate at its share of the target (integer streams otherwise bound the "
              "error: one stream is ~20 % of a 1 Gbit/s, 40 ms path with 1 MiB buffers)",
    "history-ftype": "look the profiling history up by file extension between the size and the class level "
                     "(off in default: it did not measurably help, BENCHMARKS.md)",
}
DEFAULT_SWITCHES = frozenset(SWITCHES) - {"history-ftype"}
BASES = {"thesis": frozenset(), "default": DEFAULT_SWITCHES}
_TOKEN = re.compile(r"([+-])([a-z0-9]+)")


@dataclass(frozen=True)
class FStreamVariant:
    """Which of FStream's departures from the thesis are on, and p / band / interval if given explicitly.

    :param switches: names from ``SWITCHES`` that are on.
    :param utilisation: the share of the bandwidth Alg. 2 aims for (None: 0.9 with ``p90``, else 0.8).
    :param band: accepted relative distance from the profiling target (thesis 15 %).
    :param interval_s: decision interval (None: ``recommended_interval(rtt)`` with ``short-intervals``, else 10 s).
    """

    switches: frozenset[str] = DEFAULT_SWITCHES
    utilisation: float | None = None
    band: float = THESIS_BAND
    interval_s: float | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.switches) - set(SWITCHES))
        if unknown:
            raise ValueError(f"fstream variant: unknown switch(es) {', '.join(unknown)}; "
                             f"known: {', '.join(SWITCHES)}")
        if self.utilisation is not None and not 0.05 <= self.utilisation <= 1.0:
            raise ValueError(f"utilisation {self.utilisation!r}: must be between 0.05 and 1 "
                             "(the share of the bandwidth online profiling aims for; thesis 0.8)")
        if not 0.01 <= self.band <= 0.5:
            raise ValueError(f"band {self.band!r}: must be between 0.01 and 0.5 "
                             "(accepted distance from the profiling target; thesis 0.15)")
        if self.interval_s is not None and not 0.1 <= self.interval_s <= 3600:
            raise ValueError(f"profiling interval {self.interval_s!r} s: must be between 0.1 s and 1 h")

    def on(self, switch: str) -> bool:
        if switch not in SWITCHES:  # a typo in the code must not read as "off"
            raise KeyError(f"no switch {switch!r}")
        return switch in self.switches

    @property
    def p(self) -> float:
        """The share of the bandwidth Alg. 2 aims for."""
        if self.utilisation is not None:
            return self.utilisation
        return 0.9 if self.on("p90") else THESIS_UTILISATION

    def interval_for(self, rtt_s: float) -> float:
        """Decision interval on a path with this RTT."""
        if self.interval_s is not None:
            return self.interval_s
        return recommended_interval(rtt_s) if self.on("short-intervals") else THESIS_INTERVAL_S

    @property
    def name(self) -> str:
        """Canonical text: the base it is closest to, then the switches added (+) and removed (-)."""
        added, removed = self.switches - DEFAULT_SWITCHES, DEFAULT_SWITCHES - self.switches
        base, plus, minus = "default", added, removed
        if len(self.switches) < len(added) + len(removed):
            base, plus, minus = "thesis", self.switches, frozenset()
        return base + "".join(f"+{s}" for s in sorted(plus)) + "".join(f"-{s}" for s in sorted(minus))

    def describe(self) -> str:
        """The name plus p, band and interval, for logs (``thesis, p=0.8 band=15% interval=10s``)."""
        interval = f"{self.interval_s:g}s" if self.interval_s is not None else (
            "max(2s, 50 RTT)" if self.on("short-intervals") else f"{THESIS_INTERVAL_S:g}s")
        return f"{self.name}, p={self.p:g} band={self.band:.0%} interval={interval}"

    @classmethod
    def parse(cls, text: str | None = None, *, utilisation: float | None = None, band: float | None = None,
              interval_s: float | None = None) -> "FStreamVariant":
        """``"thesis"``, ``"default"``, ``"thesis+jump+pacing"``, ``"default-pacing"`` (None: ``default``).

        A bad text raises ``ValueError`` naming it, the bad part and what is accepted.
        """
        text = (text or "default").strip().lower()
        base = next((b for b in BASES if text.startswith(b)), None)
        rest = text[len(base):] if base else text
        if base is None or (rest and rest[0] not in "+-"):
            raise ValueError(f"fstream variant {text!r}: expected 'thesis' or 'default' followed by +switch or "
                             f"-switch, e.g. 'thesis+jump' or 'default-pacing'; switches: {', '.join(SWITCHES)}")
        on = set(BASES[base])
        while rest:  # switch names contain '-': take the longest known name after each sign
            sign, rest = rest[0], rest[1:]
            sw = max((s for s in SWITCHES if rest.startswith(s) and rest[len(s):len(s) + 1] in ("", "+", "-")),
                     key=len, default=None)
            if sw is None:
                bad = _TOKEN.match(sign + rest)
                raise ValueError(f"fstream variant {text!r}: unknown switch {bad.group(2) if bad else rest!r}; "
                                 f"known: {', '.join(SWITCHES)}")
            (on.add if sign == "+" else on.discard)(sw)
            rest = rest[len(sw):]
        return cls(frozenset(on), utilisation, THESIS_BAND if band is None else band, interval_s)


THESIS = FStreamVariant(frozenset())
DEFAULT = FStreamVariant()
