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

``HarpVariant`` does the same for HARP (Arslan & Kosar, SC'16): ``paper`` is §III as written, the
default adds the departures ``harp_similarity`` and ``harp_model`` state, each a named switch.
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
    "tail-floor": "a cluster keeps a channel per file in flight plus enough for its queued files to start while "
                  "they can finish in the time left (tuning.tails; issue 44: a large file queued behind many small "
                  "ones otherwise ends alone on one channel)",
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
        return _name(self.switches, "thesis", DEFAULT_SWITCHES)

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
        on = parse_switches("fstream", text, BASES, SWITCHES)
        return cls(on, utilisation, THESIS_BAND if band is None else band, interval_s)


def parse_switches(kind: str, text: str | None, bases: dict[str, frozenset[str]], switches: dict[str, str]) -> frozenset[str]:
    """The switches a variant text turns on: a base (``bases``' first key is the paper's, the last the
    default) then ``+switch`` / ``-switch``. Switch names contain ``-``: after each sign the longest
    known name is taken. A bad text raises ``ValueError`` naming it, the bad part and what is accepted."""
    names = list(bases)
    text = (text or names[-1]).strip().lower()
    base = next((b for b in bases if text.startswith(b)), None)
    rest = text[len(base):] if base else text
    if base is None or (rest and rest[0] not in "+-"):
        raise ValueError(f"{kind} variant {text!r}: expected {' or '.join(repr(b) for b in names)} followed by "
                         f"+switch or -switch, e.g. '{names[0]}+{next(iter(switches))}'; "
                         f"switches: {', '.join(switches)}")
    on = set(bases[base])
    while rest:
        sign, rest = rest[0], rest[1:]
        sw = max((s for s in switches if rest.startswith(s) and rest[len(s):len(s) + 1] in ("", "+", "-")),
                 key=len, default=None)
        if sw is None:
            bad = _TOKEN.match(sign + rest)
            raise ValueError(f"{kind} variant {text!r}: unknown switch {bad.group(2) if bad else rest!r}; "
                             f"known: {', '.join(switches)}")
        (on.add if sign == "+" else on.discard)(sw)
        rest = rest[len(sw):]
    return frozenset(on)


def _name(on: frozenset[str], paper: str, default: frozenset[str]) -> str:
    """Canonical text: the base it is closest to, then the switches added (+) and removed (-)."""
    added, removed = on - default, default - on
    base, plus, minus = "default", added, removed
    if len(on) < len(added) + len(removed):
        base, plus, minus = paper, on, frozenset()
    return base + "".join(f"+{s}" for s in sorted(plus)) + "".join(f"-{s}" for s in sorted(minus))


THESIS = FStreamVariant(frozenset())
DEFAULT = FStreamVariant()


#: HARP's departures from the paper (Arslan & Kosar, SC'16), each stated where it is made.
HARP_SWITCHES: dict[str, str] = {
    "log-features": "similarity (Eq. 1) scales file size and count on a log scale: linear max-scaling makes "
                    "every file below a tenth of the largest look alike (harp_similarity)",
    "observed-grid": "each group's maximum (Eq. 4) is searched only within the settings the group observed: a "
                     "cubic extrapolates wildly outside its data (harp_model)",
    "sample-pays": "a chunk is sampled only when the sample can pay for itself: not when no model fits or one "
                   "group is all the history holds, not when the groups agree on the path (validation error <= 10 "
                   "%), and cut to the size whose cost is at most half its expected gain (harp_sample_cost)",
    "sample-rate": "the throughput estimate is scaled by the sample's rate over the models' estimate at the "
                   "sample's settings: the models locate the optimum, the sample says how fast the path is today",
    "unit-floor": "one channel's throughput (Algorithm 1's UT) is at least a tenth of one channel's share at the "
                  "relaxed point: a cubic dipping to ~0 at the edge of its data would give one chunk every channel",
}
HARP_DEFAULT_SWITCHES = frozenset(HARP_SWITCHES)
HARP_BASES = {"paper": frozenset(), "default": HARP_DEFAULT_SWITCHES}


@dataclass(frozen=True)
class HarpVariant:
    """Which of HARP's departures from the paper are on (``paper``: none; ``default``: all).

    :param switches: names from ``HARP_SWITCHES`` that are on.
    """

    switches: frozenset[str] = HARP_DEFAULT_SWITCHES

    def __post_init__(self) -> None:
        unknown = sorted(set(self.switches) - set(HARP_SWITCHES))
        if unknown:
            raise ValueError(f"harp variant: unknown switch(es) {', '.join(unknown)}; "
                             f"known: {', '.join(HARP_SWITCHES)}")

    def on(self, switch: str) -> bool:
        if switch not in HARP_SWITCHES:
            raise KeyError(f"no harp switch {switch!r}")
        return switch in self.switches

    @property
    def name(self) -> str:
        return _name(self.switches, "paper", HARP_DEFAULT_SWITCHES)

    def describe(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text: str | None = None) -> "HarpVariant":
        """``"paper"``, ``"default"``, ``"paper+observed-grid"``, ``"default-sample-rate"`` (None: ``default``)."""
        return cls(parse_switches("harp", text, HARP_BASES, HARP_SWITCHES))


HARP_PAPER = HarpVariant(frozenset())
