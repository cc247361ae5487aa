"""Small/large file clustering (thesis §3.1): small if ``size * 8 / bandwidth < 0.4 s``; arrivals merge."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from fstream_provider.tuning.base import ClusterStats, FileInfo

SMALL = "small"
LARGE = "large"
ALL = "all"
SMALL_SECONDS = 0.4


def classify(size: int, bandwidth_bps: float) -> str:
    """Return ``"small"`` when the file would take under 0.4 s at ``bandwidth_bps``, else ``"large"``."""
    if bandwidth_bps <= 0:
        raise ValueError(f"classify: bandwidth must be > 0, got {bandwidth_bps}")
    return SMALL if size * 8 / bandwidth_bps < SMALL_SECONDS else LARGE


@dataclass
class Cluster:
    """Known pending work of one cluster.

    :param name: ``"small"`` or ``"large"``.
    :param files: pending files (estimate; refreshed from the driver's counts).
    :param bytes: their total size.
    :param ftypes: count of files per file type seen in this cluster.
    :param seen_files: files that ever arrived in this cluster.
    :param seen_bytes: their total size.
    """

    name: str
    files: int = 0
    bytes: int = 0
    ftypes: dict[str, int] = field(default_factory=dict)
    seen_files: int = 0
    seen_bytes: int = 0

    @property
    def avg_size(self) -> float:
        """Average pending file size, else the average of everything seen (0 if nothing)."""
        if self.files > 0 and self.bytes > 0:
            return self.bytes / self.files
        return self.seen_bytes / self.seen_files if self.seen_files else 0.0

    @property
    def ftype(self) -> str:
        """The most common file type of the cluster ("" if none)."""
        return max(self.ftypes.items(), key=lambda kv: (kv[1], kv[0]))[0] if self.ftypes else ""


class Clustering:
    """Pending files grouped by cluster; new arrivals merge into an existing cluster or create one.

    :param bandwidth_bps: bandwidth used for the 0.4 s rule (kept fixed so a file never changes cluster).
    :param split: False puts every file in one cluster named ``"all"`` (tuners that do not cluster).
    """

    def __init__(self, *, bandwidth_bps: float, split: bool = True) -> None:
        self.bandwidth_bps = bandwidth_bps
        self.split = split
        self._clusters: dict[str, Cluster] = {}

    def cluster_of(self, file: FileInfo) -> str:
        return classify(file.size, self.bandwidth_bps) if self.split else ALL

    def merge(self, files: Iterable[FileInfo]) -> set[str]:
        """Add arrivals; return the names of clusters that received files (created if new)."""
        touched: set[str] = set()
        for f in files:
            name = self.cluster_of(f)
            c = self._clusters.setdefault(name, Cluster(name))
            c.files += 1
            c.bytes += f.size
            c.seen_files += 1
            c.seen_bytes += f.size
            c.ftypes[f.ftype] = c.ftypes.get(f.ftype, 0) + 1
            touched.add(c.name)
        return touched

    def refresh(self, stats: Mapping[str, ClusterStats]) -> None:
        """Replace pending counts with the driver's (files that started are no longer pending)."""
        for name, st in stats.items():
            c = self._clusters.setdefault(name, Cluster(name))
            c.files, c.bytes = st.pending_files, st.pending_bytes

    def get(self, name: str) -> Cluster | None:
        return self._clusters.get(name)

    def with_work(self, stats: Mapping[str, ClusterStats] | None = None) -> list[Cluster]:
        """Clusters with pending files or (per ``stats``) channels still busy, small first."""
        out = []
        for name in sorted(self._clusters, key=lambda n: (n != SMALL, n)):
            c = self._clusters[name]
            busy = stats is not None and name in stats and stats[name].active_channels > 0
            if c.files > 0 or busy:
                out.append(c)
        return out
