"""Shared bookkeeping of the clustering tuners: per-cluster settings, max-cc fitting, suggestions."""

from __future__ import annotations

from typing import Mapping

from fstream_provider.tuning.base import (
    ClusterLayout,
    ClusterStats,
    FileInfo,
    Observation,
    PathInfo,
    Suggestion,
)
from fstream_provider.tuning.clustering import Cluster, Clustering
from fstream_provider.tuning.heuristic import Settings, clamp, heuristic


def fit_cc(wanted: Mapping[str, int], max_cc: int, weights: Mapping[str, float] | None = None) -> dict[str, int]:
    """Scale per-cluster channel counts down to ``max_cc`` in total, keeping one per cluster if possible."""
    out = {k: max(1, v) for k, v in wanted.items()}
    w = weights or {}
    while sum(out.values()) > max_cc:
        # take from the cluster with the most channels per unit of weight
        name = max((k for k in out if out[k] > 1), default=None,
                   key=lambda k: (out[k] / max(w.get(k, 1.0), 1e-12), k))
        if name is None:
            # more clusters than channels: the lightest clusters wait with cc=0
            name = min((k for k in out if out[k] > 0), key=lambda k: (w.get(k, 0.0), k))
        out[name] -= 1
    return out


def fmt_bps(bps: float) -> str:
    """Human-readable rate, e.g. ``"8.4 Gbit/s"``."""
    for unit, div in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if abs(bps) >= div:
            return f"{bps / div:.4g} {unit}"
    return f"{bps:.3g} bit/s"


def fmt_size(n: float) -> str:
    """Human-readable size in binary units, e.g. ``"4.19 MiB"``: as ``model.units.format_bytes`` and the UI."""
    for unit, div in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n:.0f} B"


class ClusteredTuner:
    """Base of the heuristic tuners: clusters files, keeps settings per cluster, builds suggestions.

    :param path: the path description.
    :param cluster: split small and large files (thesis); False puts everything in "all".
    """

    name = "clustered"

    def __init__(self, *, path: PathInfo, cluster: bool = True) -> None:
        self.path = path
        self._clustering = Clustering(bandwidth_bps=path.bandwidth_bps, split=cluster)
        self._settings: dict[str, Settings] = {}
        self._stats: Mapping[str, ClusterStats] = {}
        self._last: tuple[ClusterLayout, ...] | None = None
        self._reason = "waiting for files"
        self._t = 0.0

    # -- clustering ---------------------------------------------------------------------
    def cluster_of(self, file: FileInfo) -> str:
        return self._clustering.cluster_of(file)

    def _ingest(self, obs: Observation) -> set[str]:
        """Merge arrivals and refresh pending counts; return clusters that received files."""
        self._t = obs.t
        touched = self._clustering.merge(obs.new_files)
        if obs.clusters:
            self._clustering.refresh(obs.clusters)
        self._stats = obs.clusters
        return touched

    def _working(self) -> list[Cluster]:
        return self._clustering.with_work(self._stats)

    def _heuristic(self, c: Cluster) -> Settings:
        avg = c.avg_size or 1.0
        return heuristic(avg, max(1, c.files), self.path)

    # -- suggestions --------------------------------------------------------------------
    def _weights(self, clusters: list[Cluster]) -> dict[str, float]:
        return {c.name: float(max(c.bytes, 1)) for c in clusters}

    def _clusters_with_settings(self) -> list[Cluster]:
        """Clusters with work, each with heuristic settings (computed the first time it is seen)."""
        clusters = self._working()
        for c in clusters:
            if c.name not in self._settings:
                self._settings[c.name] = self._heuristic(c)
        return clusters

    def _layouts(self) -> tuple[ClusterLayout, ...]:
        clusters = self._clusters_with_settings()
        if not clusters:
            return ()
        cc = fit_cc({c.name: self._settings[c.name].cc for c in clusters}, self.path.max_cc,
                    self._weights(clusters))
        out = []
        for c in clusters:
            s = clamp(self._settings[c.name], self.path)
            out.append(ClusterLayout(c.name, cc[c.name], s.p, s.pp))
        return tuple(out)

    def suggest(self) -> Suggestion:
        layouts = self._layouts()
        changed = layouts != self._last
        self._last = layouts
        return Suggestion(layouts, self._reason, changed)

    def update(self, observation: Observation) -> None:  # pragma: no cover - overridden
        self._ingest(observation)


def describe(name: str, c: Cluster, s: Settings) -> str:
    return (f"{name} {c.files} files avg {fmt_size(c.avg_size)}: "
            f"cc={s.cc} p={s.p} pp={s.pp}")
