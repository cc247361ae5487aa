"""Seeded synthetic workloads #1-#4 (thesis Table 4.1) and SRA/LCLS-like mixes (Table 4.2), pure.

Reference scale (``scale=1.0``) is the thesis' first testbed: 10 Gbit/s with ~40 ms RTT
(Stampede-Comet, 38 ms), so the bandwidth-delay product is 50 MB and the clustering rule
(small if ``size * 8 / bandwidth < 0.4 s``) puts the small/large border at 500 MB. Every
workload at ``scale=1.0`` is 75-150 GB, i.e. roughly 1-2 minutes at 10 Gbit/s.

``scale`` multiplies file sizes only. Because the border between small and large and the
BDP both grow linearly with bandwidth, ``default_scale(bandwidth, rtt)`` = BDP / 50 MB keeps
every file's size/BDP ratio (and so its cluster and the heuristic's answer) *and* keeps the
run time at line rate: at 1 Gbit/s / 40 ms the scale is 0.1 and a workload is 7.5-15 GB,
again 1-2 minutes. ``count_factor`` additionally thins file counts (at least one file per
group) for quick smoke runs.

Readings of the thesis (documented choices, the text gives classes but not counts):

- Size classes (Table 4.1): extra small 1-10 MB, small 10-100 MB, large 600 MB-2 GB (the
  table says 100 MB-2 GB; we keep the part that is "large" under the 0.4 s rule at the
  reference bandwidth), extra large 2-6 GB; sizes log-uniform inside the class.
- Counts per batch (not given): extra small 2000, small 600, large 20, extra large 6
  (about 8, 23, 23 and 22 GB); workload #4 batches are half small and half large
  (300 small + 10 large).
- SRA and LCLS (Table 4.2): per interval a "small" and a "large" group with the printed
  average size and count; counts are divided by 4 (the thesis' 511 GB SRA set would take
  7 minutes at 10 Gbit/s). Sizes are log-normal (sigma 0.6) rescaled so each group's mean is
  exactly the printed average. LCLS interval 4 is garbled in the seed: its large group reads
  1.22 GB x 69; its small group's size is lost, we use 39 MB (the mean of the other small
  groups) x 91 (so the interval has 160 files like the others).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from fstream_provider.tuning.base import FileInfo

MB = 1_000_000
GB = 1_000_000_000

#: The path the ``scale=1.0`` workloads are sized for: 10 Gbit/s, 40 ms RTT.
REFERENCE_BANDWIDTH_BPS = 10e9
REFERENCE_RTT_S = 0.040

WORKLOADS = ("w1", "w2", "w3", "w4", "sra", "lcls")
#: A workload whose mix changes mid-run (issue #16): large -> many extra small -> large files.
MIX = "mix"
_MIX_PHASES = ("large", "xsmall", "large")
#: A backlog of a few large files among many small ones (issue 44's straggler tails); its shape is drawn from the
#: seed: 2-6 large files of 0.8-2 GB and 600-2000 small ones of 1.5-8 MB on average (reference scale), all at once.
TAILS = "tails"
#: Held-out transfers for HARP (issue 44): 1-3 groups of files whose average sizes are drawn log-uniformly from
#: 2.5 MB to 1 GB (BDP/20 to 20 BDP at reference scale), 5-10 GB in total, all at once; a shape HARP never saw.
HELDOUT = "heldout"

# (low, high) bytes, count per batch, file type
_CLASSES: dict[str, tuple[int, int, int]] = {
    "xsmall": (1 * MB, 10 * MB, 2000),
    "small": (10 * MB, 100 * MB, 600),
    "large": (600 * MB, 2 * GB, 20),
    "xlarge": (2 * GB, 6 * GB, 6),
}

# Table 4.1: arrival order of classes per interval.
_SYNTHETIC: dict[str, tuple[tuple[tuple[str, float], ...], ...]] = {
    "w1": ((("small", 1.0),), (("large", 1.0),), (("small", 1.0),), (("large", 1.0),)),
    "w2": ((("large", 1.0),), (("small", 1.0),), (("large", 1.0),), (("small", 1.0),)),
    "w3": ((("xsmall", 1.0),), (("xlarge", 1.0),), (("large", 1.0),), (("large", 1.0),)),
    "w4": tuple(((("small", 0.5), ("large", 0.5))) for _ in range(4)),
}

# Table 4.2: per interval ((small avg bytes, count), (large avg bytes, count)).
_REAL: dict[str, tuple[tuple[tuple[float, int], tuple[float, int]], ...]] = {
    "sra": (
        ((10.79 * MB, 135), (642.5 * MB, 265)),
        ((47.32 * MB, 153), (394.34 * MB, 247)),
        ((17.54 * MB, 169), (833.35 * MB, 231)),
        ((26.76 * MB, 51), (917.34 * MB, 49)),
    ),
    "lcls": (
        ((40.92 * MB, 62), (1.19 * GB, 98)),
        ((53.02 * MB, 80), (1.81 * GB, 80)),
        ((23.17 * MB, 48), (2.10 * GB, 112)),
        ((39.0 * MB, 91), (1.22 * GB, 69)),
    ),
}
_REAL_COUNT_DIVISOR = 4
_FTYPE = {"sra": "sra", "lcls": "xtc"}

_DESCRIPTIONS = {
    HELDOUT: "held-out transfer: 1-3 groups of files with average sizes from BDP/20 to 20 BDP, 5-10 GB "
             "(reference scale), all present at the start; the shape is drawn from the seed (issue 44)",
    TAILS: "straggler tails: 2-6 large files among 600-2000 small ones, all present at the start; the shape is "
           "drawn from the seed (issue 44)",
    "w1": "workload #1: small, large, small, large files (Table 4.1)",
    "w2": "workload #2: large, small, large, small files (Table 4.1)",
    "w3": "workload #3: extra small, extra large, large, large files (Table 4.1)",
    "w4": "workload #4: small+large files in every interval (Table 4.1)",
    "sra": "SRA-like genome files, small+large groups per interval (Table 4.2, counts / 4)",
    "lcls": "LCLS-like detector files, mostly large (Table 4.2, counts / 4)",
    "mix": "mix change: large, then 2000 extra small, then large files, each phase arriving when the previous "
           "one would finish at line rate (backlogged throughout)",
}


@dataclass(frozen=True)
class Batch:
    """Files that appear at one moment.

    :param t: seconds after the start of the stream when the files appear.
    :param files: the files of this batch.
    """

    t: float
    files: list[FileInfo] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class Workload:
    """A stream of file batches.

    :param name: workload name (one of ``WORKLOADS``).
    :param batches: batches in arrival order.
    :param description: what the workload models and where it comes from.
    :param scale: the size multiplier it was built with.
    """

    name: str
    batches: list[Batch]
    description: str = ""
    scale: float = 1.0

    @property
    def total_bytes(self) -> int:
        return sum(b.bytes for b in self.batches)

    @property
    def files(self) -> list[FileInfo]:
        return [f for b in self.batches for f in b.files]


def default_scale(bandwidth_bps: float, rtt_s: float) -> float:
    """Size multiplier that keeps size/BDP ratios of the reference (10 Gbit/s, 40 ms) workloads.

    1 Gbit/s / 40 ms -> 0.1; 10 Gbit/s / 40 ms -> 1.0; 100 Gbit/s / 100 ms -> 25.
    """
    if bandwidth_bps <= 0 or rtt_s <= 0:
        raise ValueError(f"default_scale: bandwidth ({bandwidth_bps}) and rtt ({rtt_s}) must be > 0")
    return (bandwidth_bps * rtt_s) / (REFERENCE_BANDWIDTH_BPS * REFERENCE_RTT_S)


def _count(n: int, count_factor: float) -> int:
    return max(1, int(round(n * count_factor)))


def _synthetic(name: str, rng: random.Random, scale: float, count_factor: float,
               interval_s: float) -> list[Batch]:
    batches = []
    for k, groups in enumerate(_SYNTHETIC[name]):
        files: list[FileInfo] = []
        for cls, share in groups:
            lo, hi, n = _CLASSES[cls]
            for j in range(_count(int(n * share), count_factor)):
                size = math.exp(rng.uniform(math.log(lo), math.log(hi)))
                files.append(FileInfo(f"{name}/i{k + 1}/{cls}-{j:05d}.dat",
                                      max(1, int(size * scale)), "dat"))
        batches.append(Batch(k * interval_s, files))
    return batches


def _real(name: str, rng: random.Random, scale: float, count_factor: float,
          interval_s: float) -> list[Batch]:
    ext = _FTYPE[name]
    batches = []
    for k, groups in enumerate(_REAL[name]):
        files: list[FileInfo] = []
        for label, (avg, n) in zip(("small", "large"), groups):
            count = _count(n // _REAL_COUNT_DIVISOR, count_factor)
            raw = [rng.lognormvariate(0.0, 0.6) for _ in range(count)]
            norm = avg / (sum(raw) / count)
            for j, r in enumerate(raw):
                files.append(FileInfo(f"{name}/i{k + 1}/{label}-{j:05d}.{ext}",
                                      max(1, int(r * norm * scale)), ext))
        rng.shuffle(files)
        batches.append(Batch(k * interval_s, files))
    return batches


def _tails(rng: random.Random, scale: float, count_factor: float) -> list[FileInfo]:
    """A few large files among many small ones, sizes within +-20 % / +-50 % of the averages the seed draws."""
    n_large, large = rng.randint(2, 6), rng.uniform(800e6, 2e9)
    n_small, small = _count(rng.randint(600, 2000), count_factor), rng.uniform(1.5e6, 8e6)
    files = [FileInfo(f"tails/large-{j:05d}.h5", max(1, int(large * rng.uniform(0.8, 1.2) * scale)), "h5")
             for j in range(n_large)]
    files += [FileInfo(f"tails/small-{j:05d}.dat", max(1, int(small * rng.uniform(0.5, 1.5) * scale)), "dat")
              for j in range(n_small)]
    rng.shuffle(files)
    return files


def _heldout(rng: random.Random, scale: float, count_factor: float) -> list[FileInfo]:
    """1-3 groups, each with a log-uniform average size and a share of the total; sizes +-50 % of the average."""
    total = rng.uniform(5 * GB, 10 * GB)
    n_groups = rng.randint(1, 3)
    shares = [rng.uniform(0.2, 1.0) for _ in range(n_groups)]
    files: list[FileInfo] = []
    for g, share in enumerate(shares):
        avg = math.exp(rng.uniform(math.log(2.5 * MB), math.log(1 * GB)))
        count = _count(max(2, int(round(total * share / sum(shares) / avg))), count_factor)
        files += [FileInfo(f"heldout/g{g + 1}/f-{j:05d}.dat", max(1, int(avg * rng.uniform(0.5, 1.5) * scale)), "dat")
                  for j in range(count)]
    rng.shuffle(files)
    return files


def _mix(rng: random.Random, scale: float, count_factor: float) -> list[Batch]:
    """Phases of ``_MIX_PHASES``; phase k arrives when phases < k would be done at the reference line rate."""
    batches, t = [], 0.0
    for k, cls in enumerate(_MIX_PHASES):
        lo, hi, n = _CLASSES[cls]
        files = [FileInfo(f"mix/p{k + 1}/{cls}-{j:05d}.dat",
                          max(1, int(math.exp(rng.uniform(math.log(lo), math.log(hi))) * scale)), "dat")
                 for j in range(_count(n, count_factor))]
        batches.append(Batch(t, files))
        t += sum(f.size for f in files) / scale * 8 / REFERENCE_BANDWIDTH_BPS
    return batches


def make_workload(name: str, *, scale: float = 1.0, seed: int = 0, interval_s: float = 5.0,
                  count_factor: float = 1.0) -> Workload:
    """Build one named workload, deterministic for a given (name, scale, seed, interval, count_factor).

    :param name: one of ``WORKLOADS``.
    :param scale: multiplies every file size (see ``default_scale``).
    :param seed: random seed for the sizes.
    :param interval_s: seconds between batches (the thesis uses 20 s at 10 Gbit/s; 0: all present at the
        start, "backlogged"); ``mix`` times its phases itself.
    :param count_factor: multiplies file counts (at least one file per group).
    """
    if name not in WORKLOADS + (MIX, TAILS, HELDOUT):
        raise ValueError(f"unknown workload {name!r}: expected one of {', '.join(WORKLOADS + (MIX, TAILS, HELDOUT))}")
    if scale <= 0 or count_factor <= 0 or interval_s < 0:
        raise ValueError(f"workload {name}: scale ({scale}) and count_factor ({count_factor}) must be > 0 "
                         f"and interval_s ({interval_s}) >= 0")
    rng = random.Random(f"{name}:{seed}")
    if name == MIX:
        return Workload(name, _mix(rng, scale, count_factor), _DESCRIPTIONS[name], scale)
    if name == TAILS:
        return Workload(name, [Batch(0.0, _tails(rng, scale, count_factor))], _DESCRIPTIONS[name], scale)
    if name == HELDOUT:
        return Workload(name, [Batch(0.0, _heldout(rng, scale, count_factor))], _DESCRIPTIONS[name], scale)
    build = _synthetic if name in _SYNTHETIC else _real
    return Workload(name, build(name, rng, scale, count_factor, interval_s), _DESCRIPTIONS[name], scale)
