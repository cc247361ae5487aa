"""HARP's prediction as the ``fstream`` tuner's starting point (HARP §III-B without the sample transfer).

``FStreamTuner(seed=harp_start(path, history))`` starts each cluster of the initial dataset from the Optimizer's
equal-weight prediction instead of the heuristic; its online profiling then measures today's load (the thesis'
§3.4), so no sample is taken here. Split from ``harp`` (the ``harp`` tuner, Algorithm 1).
"""

from __future__ import annotations

from typing import Any

from fstream_provider.tuning.base import PathInfo
from fstream_provider.tuning.harp import fit_cache_of, history_rows, optimizer_for, request_for
from fstream_provider.tuning.harp_history import chunk_of
from fstream_provider.tuning.heuristic import Settings


class HarpStart:
    """HARP's prediction as the ``fstream`` tuner's starting point (``FStreamTuner(seed=...)``).

    No sample is taken here (the online profiling that follows measures today's load instead), so every
    group the Optimizer keeps weighs the same; a cluster the history cannot model keeps the heuristic.
    ``ready`` is False while the history is still loading: the tuner starts from the heuristic and moves to
    the prediction as soon as it is ready, if profiling has not decided anything yet.

    :param path: the path description.
    :param history: a DataFrame, or a loading source (see ``HarpTuner``).
    :param optimizer: a ``HarpOptimizer`` (default: the paper's settings within the path's bounds).
    """

    def __init__(self, path: PathInfo, history: Any, *, optimizer: Any = None, source: str = "",
                 destination: str = "") -> None:
        self.path, self._source, self.source, self.destination = path, history, source, destination
        self._optimizer = optimizer
        self.notes: list[str] = []

    @property
    def ready(self) -> bool:
        src = self._source
        return not callable(src) or src() is not None

    def __call__(self, cluster: Any) -> tuple[Settings, str] | None:
        history = self._source() if callable(self._source) else self._source
        avg = cluster.avg_size
        if history is None or len(history) == 0 or avg <= 0:
            return None
        if self._optimizer is None:
            self._optimizer = optimizer_for(self.path, fit_cache=fit_cache_of(self._source))
        req = request_for(self.path, chunk_of(avg, self.path.bdp_bytes), avg, max(1, cluster.files), self.source,
                          self.destination)
        try:
            pred = self._optimizer.optimize(history, req, None)
        except ValueError as exc:
            self.notes.append(f"{cluster.name}: {exc}")
            return None
        if pred.fallback:
            self.notes.append(f"{cluster.name}: {pred.reason}")
            return None
        return Settings(pred.cc, pred.p, pred.pp), f"HARP start without sample: {pred.reason}"


def harp_start(path: PathInfo, history: Any, **kw: Any) -> HarpStart | None:
    """A ``HarpStart`` when there is (or will be) history, else None."""
    return HarpStart(path, history, **kw) if history_rows(history) > 0 else None
