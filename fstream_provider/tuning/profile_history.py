"""Profiling history (thesis §3.5): past profiling results looked up by similar average file size, then by class.

§3.5 keeps "two types of profiling, one for file size and the other for file type (i.e., small
or large)": a lookup first takes records whose average file size is similar to the cluster's,
and only when there are none, records of the same small/large class ("a 20 MB result can seed a
5 MB dataset when both are small"). *Similar* is stated here: within ``SIZE_TOLERANCE`` (a factor
of 2) either way, nearest first. The file extension is an extra level between the two only when
asked (``ftype=...``; the ``history-ftype`` switch of ``variants``). Newer records win ties (the
thesis keeps timestamps "to prioritize recent reports").

Records are stored in Redis under a power-of-4 size bucket and the extension
(``Keys.profiling``, ``bus/profiling_store``); the bucket only spreads keys, lookups use the
exact average size kept in each record. Records of versions before the average size was kept
read back with their bucket's middle as size and no class (they can match by size only).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable

SIZE_TOLERANCE = 2.0  # "similar average size": within a factor of 2 either way


def size_class(avg_size: float) -> str:
    """Bucket an average file size into a power-of-4 class, e.g. ``"4MiB"`` covers [4 MiB, 16 MiB)."""
    if avg_size < 1:
        return "0B"
    k = int(math.log2(avg_size)) // 2 * 2
    units = ((30, "GiB"), (20, "MiB"), (10, "KiB"), (0, "B"))
    for shift, unit in units:
        if k >= shift:
            return f"{2 ** (k - shift)}{unit}"
    return "0B"  # pragma: no cover


def _bucket_middle(cls: str) -> float:
    """Geometric middle of a ``size_class`` bucket (old records kept only the bucket)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10), ("B", 0)):
        if cls.endswith(unit):
            return float(cls[: -len(unit)]) * 2**shift * 2
    raise ValueError(f"size class {cls!r}: expected e.g. 4MiB")


@dataclass(frozen=True)
class ProfileRecord:
    """One profiled interval of one cluster.

    :param avg_size: average file size of the cluster (bytes).
    :param kind: its small/large class (``clustering.SMALL``/``LARGE``; "" unknown).
    :param ftype: file type (extension), "" if unknown.
    :param cc: channels the cluster used.
    :param p: streams per channel.
    :param pp: pipelining depth.
    :param throughput_bps: throughput the cluster reached with them.
    :param t: timestamp (seconds; the driver's clock, newest wins).
    """

    avg_size: float
    kind: str
    ftype: str
    cc: int
    p: int
    pp: int
    throughput_bps: float
    t: float

    @property
    def size_class(self) -> str:
        return size_class(self.avg_size)

    def to_dict(self) -> dict:
        return {**asdict(self), "size_class": self.size_class}

    @classmethod
    def from_dict(cls, d: dict) -> "ProfileRecord":
        avg = float(d["avg_size"]) if "avg_size" in d else _bucket_middle(str(d["size_class"]))
        return cls(avg, str(d.get("kind", "")), str(d.get("ftype", "")), int(d["cc"]), int(d["p"]),
                   int(d["pp"]), float(d["throughput_bps"]), float(d["t"]))


class ProfileHistory:
    """In-memory profiling history; ``profiling_store`` loads and saves it from Redis.

    :param records: initial records (any order).
    :param keep: newest records kept per (size bucket, ftype), like the Redis lists.
    """

    def __init__(self, records: Iterable[ProfileRecord] = (), *, keep: int = 1000) -> None:
        self.keep = keep
        self._by_key: dict[tuple[str, str], list[ProfileRecord]] = {}
        self._new: list[ProfileRecord] = []
        for r in sorted(records, key=lambda r: r.t):
            self._insert(r)

    def _insert(self, r: ProfileRecord) -> None:
        rows = self._by_key.setdefault((r.size_class, r.ftype), [])
        rows.insert(0, r)
        rows.sort(key=lambda x: -x.t)
        del rows[self.keep:]

    def add(self, record: ProfileRecord) -> None:
        """Add a record (also remembered as unsaved, see ``take_unsaved``)."""
        self._insert(record)
        self._new.append(record)

    def take_unsaved(self) -> list[ProfileRecord]:
        """Records added since the last call, oldest first (for the store to persist)."""
        out, self._new = self._new, []
        return out

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_key.values())

    def records(self) -> list[ProfileRecord]:
        """Every record, newest first."""
        return sorted((r for rs in self._by_key.values() for r in rs), key=lambda r: -r.t)

    def lookup(self, avg_size: float, kind: str, desired_bps: float, *, ftype: str | None = None,
               newest: int = 50) -> tuple[ProfileRecord | None, str]:
        """Best past settings for ``desired_bps`` (§3.5): by similar size, [by file type,] then by class.

        Levels: "size" = average size within ``SIZE_TOLERANCE`` (the nearest sizes first, at
        most ``newest`` records), "type" = the same extension (only when ``ftype`` is given),
        "class" = the same small/large class. At the first level with records, the one with the
        fewest channels that reached ``desired`` wins (newest on ties); else the fastest one (the
        caller extrapolates its cc; a record that only reached the band's lower edge would park
        profiling there). Returns the record (None if no level matched) and the level's name.
        """
        rows = self.records()
        ratio = lambda r: abs(math.log(max(r.avg_size, 1.0) / max(avg_size, 1.0)))  # noqa: E731
        similar = sorted((r for r in rows if ratio(r) <= math.log(SIZE_TOLERANCE)), key=ratio)
        levels = [("size", similar)]
        if ftype:
            levels.append(("type", [r for r in rows if r.ftype == ftype]))
        levels.append(("class", [r for r in rows if kind and r.kind == kind]))
        for how, found in levels:
            found = found[:newest]
            if not found:
                continue
            full = [r for r in found if r.throughput_bps >= desired_bps]
            best = (min(full, key=lambda r: (r.cc, -r.t)) if full
                    else max(found, key=lambda r: (r.throughput_bps, r.t)))
            return best, how
        return None, ""
