"""Profiling history (thesis §3.5): records by file-size class and file type, looked up newest first."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable


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


@dataclass(frozen=True)
class ProfileRecord:
    """One profiled interval of one cluster.

    :param size_class: ``size_class(avg file size)``.
    :param ftype: file type (extension), "" if unknown.
    :param cc: channels the cluster used.
    :param p: streams per channel.
    :param pp: pipelining depth.
    :param throughput_bps: throughput the cluster reached with them.
    :param t: timestamp (seconds; the driver's clock, newest wins).
    """

    size_class: str
    ftype: str
    cc: int
    p: int
    pp: int
    throughput_bps: float
    t: float

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ProfileRecord":
        return cls(str(d["size_class"]), str(d.get("ftype", "")), int(d["cc"]), int(d["p"]),
                   int(d["pp"]), float(d["throughput_bps"]), float(d["t"]))


class ProfileHistory:
    """In-memory profiling history; ``profiling_store`` loads and saves it from Redis.

    :param records: initial records (any order).
    :param keep: newest records kept per (size_class, ftype).
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

    def records(self, *, size_cls: str | None = None, ftype: str | None = None) -> list[ProfileRecord]:
        """Matching records, newest first."""
        rows = [r for (sc, ft), rs in self._by_key.items() for r in rs
                if (size_cls is None or sc == size_cls) and (ftype is None or ft == ftype)]
        return sorted(rows, key=lambda r: -r.t)

    def lookup(self, size_cls: str, ftype: str, desired_bps: float, *, newest: int = 50) -> tuple[ProfileRecord | None, str]:
        """Best past settings for ``desired_bps``: by size class first, then by file type.

        Among the ``newest`` matching records, the one with the fewest channels that reached
        ``desired`` wins (newest on ties); else the fastest one (the caller scales its cc; a
        record that only reached the band's lower edge would park profiling there). Returns
        the record (None if no match) and how it was found ("size", "type" or "").
        """
        for how, rows in (("size", self.records(size_cls=size_cls)),
                          ("type", self.records(ftype=ftype) if ftype else [])):
            rows = rows[:newest]
            if not rows:
                continue
            full = [r for r in rows if r.throughput_bps >= desired_bps]
            if full:
                best = min(full, key=lambda r: (r.cc, -r.t))
            else:
                best = max(rows, key=lambda r: (r.throughput_bps, r.t))
            return best, how
        return None, ""
