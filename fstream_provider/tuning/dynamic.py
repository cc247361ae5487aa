"""``static`` and ``dynamic`` tuners (thesis §3.2, §3.3): the heuristic once, or again on every new dataset."""

from __future__ import annotations

from fstream_provider.tuning.base import Observation, PathInfo
from fstream_provider.tuning.common import ClusteredTuner, describe


class StaticTuner(ClusteredTuner):
    """Heuristic per cluster on the initial dataset; later clusters reuse the initial settings.

    :param path: the path description.
    """

    name = "static"

    def __init__(self, *, path: PathInfo) -> None:
        super().__init__(path=path)
        self._initial = None

    def update(self, observation: Observation) -> None:
        touched = self._ingest(observation)
        if not touched:
            self._reason = "static: settings fixed at start"
            return
        parts = []
        for name in sorted(touched):
            if name in self._settings:
                continue
            c = self._clustering.get(name)
            if self._initial is None:
                s = self._heuristic(c)
                parts.append("heuristic " + describe(name, c, s))
            else:
                s = self._initial
                parts.append(f"new cluster {name} keeps the initial settings cc={s.cc} p={s.p} pp={s.pp}")
            self._settings[name] = s
        if self._initial is None and self._settings:
            big = max(self._settings, key=lambda n: self._clustering.get(n).bytes)
            self._initial = self._settings[big]
        self._reason = "static: " + ("; ".join(parts) if parts else "settings fixed at start")


class DynamicTuner(ClusteredTuner):
    """Re-run the heuristic for every cluster that receives new files (merged with what is pending).

    :param path: the path description.
    """

    name = "dynamic"

    def update(self, observation: Observation) -> None:
        touched = self._ingest(observation)
        if not touched:
            self._reason = "dynamic: no new files, settings kept"
            return
        parts = []
        for name in sorted(touched):
            c = self._clustering.get(name)
            s = self._heuristic(c)
            self._settings[name] = s
            parts.append(describe(name, c, s))
        self._reason = "dynamic: new files, heuristic " + "; ".join(parts)
