"""Baseline tuners for comparisons: ``globus`` (Globus-like presets) and ``adaptivecc`` (DESIGN.md readings).

- ``globus`` (our approximation of Globus, documented as such): at most two files at once,
  two or four streams by average file size (SEAL §3.1), three size classes (HARP §V):
  below 50 MB cc=2 p=2 pp=20; 50-250 MB cc=2 p=4 pp=5; above 250 MB cc=2 p=4 pp=1. The
  class follows the average size of the pending dataset; no clustering.
- ``adaptivecc`` (thesis §4.2): heuristic on the initial dataset (or the user's starting
  point, where given), then while the utility
  ``throughput * (1 - penalty) ** cc`` keeps improving by at least 5 %, double the
  concurrency once per interval; then keep the best value for the rest of the transfer.
"""

from __future__ import annotations

from fstream_provider.tuning.base import Observation, PathInfo
from fstream_provider.tuning.common import ClusteredTuner, fmt_bps, fmt_size
from fstream_provider.tuning.heuristic import Settings, StartLayout, clamp

MB = 1_000_000


def globus_preset(avg_size: float) -> Settings:
    """Globus-like (cc, p, pp) for an average file size in bytes."""
    if avg_size < 50 * MB:
        return Settings(2, 2, 20)
    if avg_size < 250 * MB:
        return Settings(2, 4, 5)
    return Settings(2, 4, 1)


class GlobusTuner(ClusteredTuner):
    """Fixed presets by average file size (see module docstring).

    :param path: the path description (only its bounds are used).
    """

    name = "globus"

    def __init__(self, *, path: PathInfo) -> None:
        super().__init__(path=path, cluster=False)

    def update(self, observation: Observation) -> None:
        touched = self._ingest(observation)
        if not touched:
            self._reason = "globus: preset kept"
            return
        c = self._clustering.get("all")
        s = clamp(globus_preset(c.avg_size), self.path)
        self._settings["all"] = s
        self._reason = f"globus: preset for avg {fmt_size(c.avg_size)}: cc={s.cc} p={s.p} pp={s.pp}"


class AdaptiveCCTuner(ClusteredTuner):
    """Heuristic start, concurrency searched once at the beginning with a utility, then kept.

    :param path: the path description.
    :param start: where to start instead of the heuristic (values left None come from it).
    :param penalty: per-channel utility penalty.
    :param min_gain: relative utility gain needed to keep searching.
    """

    name = "adaptivecc"

    def __init__(self, *, path: PathInfo, start: StartLayout | None = None, penalty: float = 0.02,
                 min_gain: float = 0.05) -> None:
        super().__init__(path=path, cluster=False)
        self.start = start or StartLayout()
        self.penalty = penalty
        self.min_gain = min_gain
        self._searching = True
        self._best: tuple[float, int] | None = None

    def update(self, observation: Observation) -> None:
        obs = observation
        self._ingest(obs)
        if "all" not in self._settings:
            c = self._clustering.get("all")
            if c is None:
                return
            s = self._settings["all"] = clamp(self.start.over(self._heuristic(c)), self.path)
            if self.start:
                self._reason = f"adaptivecc: start cc={s.cc} p={s.p} pp={s.pp} ({self.start.describe()})"
            else:
                self._reason = f"adaptivecc: heuristic start cc={s.cc} p={s.p} pp={s.pp}"
            return
        s = self._settings["all"]
        if not self._searching or obs.dt <= 0:
            self._reason = f"adaptivecc: cc={s.cc} kept"
            return
        pending = sum(st.pending_files for st in obs.clusters.values())
        cc_now = sum(l.cc for l in obs.layouts) or s.cc
        if pending < cc_now or obs.throughput_bps <= 0:
            self._reason = "adaptivecc: too few files pending to judge, waiting"
            return
        u = obs.throughput_bps * (1 - self.penalty) ** cc_now
        if self._best is None or u >= self._best[0] * (1 + self.min_gain):
            self._best = (u, cc_now)
            new = min(2 * cc_now, self.path.max_cc)
            if new == cc_now:
                self._searching = False
                self._reason = f"adaptivecc: at max cc={cc_now}, search done"
                return
            self._settings["all"] = Settings(new, s.p, s.pp)
            self._reason = (f"adaptivecc: utility {fmt_bps(u)} at cc={cc_now} improved, "
                            f"trying cc={new}")
        else:
            best_cc = self._best[1]
            self._settings["all"] = Settings(best_cc, s.p, s.pp)
            self._searching = False
            self._reason = (f"adaptivecc: utility {fmt_bps(u)} at cc={cc_now} not better, "
                            f"keeping cc={best_cc} for the rest of the transfer")
