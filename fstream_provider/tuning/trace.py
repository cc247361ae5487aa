"""Transfer traces for scheduling (SEAL/STEAL, Kettimuthu et al., §6.2 and Table 2): a CSV format and a generator.

A trace is one row per transfer task: ``arrival_s, source, destination, size_bytes, class`` (``class``
is ``interactive`` or ``batch``). ``read_trace`` refuses a bad row naming its line and the reason, and
keeps each task's line (``TraceTask.line``) so that a later refusal (an endpoint with no capacity,
``sched_sim.check_endpoints``) can name it too. Any endpoint names may appear: the replay learns their
capacities from the trace or takes them from an endpoints file (``sched_sim.endpoints_for``).

``generate`` writes GridFTP-like traces. The paper replays 15-minute windows of one busy Globus server's
log (one source, five destinations); its Table 2 gives the task counts per size category for the 25 %,
45 % and 60 % traces, "load" being the trace's volume over what the source can move in 15 minutes.
The logs themselves are not public, so we generate traces with those counts and volumes:

- **arrivals** are bursty: a two-state (burst / calm) modulated Poisson process, bursts carrying most
  tasks (Figure 1's 0 to 100+ concurrent transfers). ``60%-hv`` uses longer, denser bursts (the paper's
  60 %-HV trace has 2.8x the standard deviation of concurrent transfers of the 60 % one);
- **sizes** are log-uniform inside each Table 2 category, then every size is scaled by one factor (kept
  inside its category) until the volume is the load's share of ``capacity x duration``;
- **destinations** are drawn weighted by their capacity (§6.2: "randomly split ... with weighted
  probability based on their capacities");
- **batch** tasks for STEAL (§6.4): 50 GB each, present at t = 0, enough to fill the capacity the
  interactive load leaves (17, 13, 10 and 10 tasks for 25 %, 45 %, 60 % and 60 %-HV at the paper's scale).
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

MB = 1_000_000
GB = 1_000_000_000
CLASSES = ("interactive", "batch")

#: Table 2: size categories (upper bound inclusive) and task counts per trace.
CATEGORIES = (("0-1M", 0, 1 * MB), ("1-10M", 1 * MB, 10 * MB), ("10-100M", 10 * MB, 100 * MB),
              ("100M-1G", 100 * MB, 1 * GB), ("1-10G", 1 * GB, 10 * GB))
TABLE2 = {"25%": (247, 40, 72, 46, 117), "45%": (907, 168, 334, 209, 232), "60%": (728, 11, 34, 318, 290),
          "60%-hv": (728, 11, 34, 318, 290)}
LOADS = {"25%": 0.25, "45%": 0.45, "60%": 0.60, "60%-hv": 0.60}

#: §6.1: one source (>9 Gbit/s disk to disk) and five destinations (8, 7, 4, 2.5, 2 Gbit/s).
SOURCE = "stampede"
DESTINATIONS = {"yellowstone": 8e9, "gordon": 7e9, "blacklight": 4e9, "mason": 2.5e9, "darter": 2e9}
SOURCE_BPS = 9.2e9


@dataclass(frozen=True)
class TraceTask:
    """One transfer request of a trace.

    :param arrival_s: seconds from the trace's start.
    :param source: source endpoint name.
    :param destination: destination endpoint name.
    :param size: bytes.
    :param klass: ``interactive`` or ``batch`` (STEAL §5.1).
    :param line: its line in the trace file it was read from (None if built in code); not compared.
    """

    arrival_s: float
    source: str
    destination: str
    size: int
    klass: str = "interactive"
    line: int | None = field(default=None, compare=False)

    def category(self) -> str:
        return category_of(self.size)


def category_of(size: float) -> str:
    """Table 2's size category of ``size`` bytes (the last one holds everything above 1 GB)."""
    for name, _lo, hi in CATEGORIES:
        if size <= hi:
            return name
    return CATEGORIES[-1][0]


def write_trace(tasks: list[TraceTask], path: str | Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["arrival_s", "source", "destination", "size_bytes", "class"])
        for t in sorted(tasks, key=lambda t: t.arrival_s):
            w.writerow([f"{t.arrival_s:.3f}", t.source, t.destination, t.size, t.klass])


def read_trace(path: str | Path) -> list[TraceTask]:
    """Read a trace CSV; a bad row raises ``ValueError`` naming the file, the line and what is wrong."""
    out = []
    with open(path, newline="") as fh:
        rows = csv.DictReader(fh)
        need = {"arrival_s", "source", "destination", "size_bytes", "class"}
        missing = need - set(rows.fieldnames or ())
        if missing:
            raise ValueError(f"trace {path}: header lacks column(s) {', '.join(sorted(missing))} "
                             f"(expected arrival_s,source,destination,size_bytes,class)")
        for n, row in enumerate(rows, start=2):
            where = f"trace {path} line {n}"
            try:
                arrival, size = float(row["arrival_s"]), int(float(row["size_bytes"]))
            except (TypeError, ValueError):
                raise ValueError(f"{where}: arrival_s and size_bytes must be numbers, got "
                                 f"{row['arrival_s']!r} and {row['size_bytes']!r}") from None
            if not math.isfinite(arrival) or arrival < 0:
                raise ValueError(f"{where}: arrival_s must be >= 0, got {row['arrival_s']!r}")
            if size <= 0:
                raise ValueError(f"{where}: size_bytes must be > 0, got {row['size_bytes']!r}")
            if row["class"] not in CLASSES:
                raise ValueError(f"{where}: class must be interactive or batch, got {row['class']!r}")
            if not row["source"] or not row["destination"]:
                raise ValueError(f"{where}: source and destination must be named")
            out.append(TraceTask(arrival, row["source"], row["destination"], size, row["class"], n))
    return sorted(out, key=lambda t: t.arrival_s)


def _arrivals(n: int, duration_s: float, rng: random.Random, *, high_variation: bool) -> list[float]:
    """``n`` arrival times in [0, duration): a burst/calm modulated Poisson process."""
    burst_share, burst_len, calm_len = (0.85, 90.0, 150.0) if high_variation else (0.7, 45.0, 60.0)
    spans, t, burst = [], 0.0, rng.random() < 0.5
    while t < duration_s:
        length = rng.expovariate(1.0 / (burst_len if burst else calm_len))
        spans.append((t, min(duration_s, t + length), burst))
        t += length
        burst = not burst
    burst_time = sum(b - a for a, b, on in spans if on) or 1.0
    calm_time = sum(b - a for a, b, on in spans if not on) or 1.0
    weight = [(b - a) * ((burst_share / burst_time) if on else ((1 - burst_share) / calm_time)) for a, b, on in spans]
    out = []
    for _ in range(n):
        a, b, _on = rng.choices(spans, weights=weight)[0]
        out.append(rng.uniform(a, b))
    return sorted(out)


def generate(trace: str = "45%", *, duration_s: float = 900.0, seed: int = 0, batch: bool = False,
             source_bps: float = SOURCE_BPS, destinations: dict[str, float] | None = None,
             scale: float = 1.0) -> list[TraceTask]:
    """A Table 2-like trace: ``trace`` is ``25%``, ``45%``, ``60%`` or ``60%-hv``.

    :param scale: multiplies the task counts, the volume and the duration alike, so the load stays
        (e.g. 0.2: a 3-minute trace with a fifth of the tasks).
    :param batch: add STEAL's 50 GB batch tasks at t = 0 (sized to the capacity the load leaves).
    """
    if trace not in TABLE2:
        raise ValueError(f"trace {trace!r}: expected one of {', '.join(TABLE2)}")
    if not 0 < scale <= 1:
        raise ValueError(f"trace scale {scale!r}: expected 0 < scale <= 1")
    rng = random.Random(f"{trace}:{seed}")
    dests = destinations or DESTINATIONS
    names, caps = list(dests), list(dests.values())
    duration_s *= scale
    volume = LOADS[trace] * source_bps / 8 * duration_s
    sizes: list[tuple[float, float, float]] = []  # (size, lo, hi)
    for (_name, lo, hi), count in zip(CATEGORIES, TABLE2[trace]):
        for _ in range(max(1, round(count * scale))):
            low = max(lo + 1, 64 * 1024)  # categories hold (lo, hi]
            sizes.append((math.exp(rng.uniform(math.log(low), math.log(hi))), low, hi))
    factor = 1.0
    for _ in range(60):  # one factor for every size, each kept inside its category, until the volume fits
        got = sum(min(hi, max(lo, s * factor)) for s, lo, hi in sizes)
        if abs(got - volume) < 0.001 * volume:
            break
        factor *= volume / got
    rng.shuffle(sizes)
    times = _arrivals(len(sizes), duration_s, rng, high_variation=trace.endswith("hv"))
    tasks = [TraceTask(round(t, 3), SOURCE, rng.choices(names, weights=caps)[0],
                       int(min(hi, max(lo, s * factor))), "interactive") for t, (s, lo, hi) in zip(times, sizes)]
    if batch:
        spare = source_bps / 8 * duration_s - volume
        for i in range(max(1, round(spare / (50 * GB)))):
            tasks.append(TraceTask(0.0, SOURCE, rng.choices(names, weights=caps)[0], 50 * GB, "batch"))
    return sorted(tasks, key=lambda t: t.arrival_s)
