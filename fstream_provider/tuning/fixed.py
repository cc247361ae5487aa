"""The ``fixed`` tuner: use the given cc/p/pp for all files, never change them."""

from __future__ import annotations

from fstream_provider.tuning.base import ClusterLayout, FileInfo, Observation, Suggestion


class FixedTuner:
    """Apply one layout for the whole transfer.

    :param cc: channels.
    :param p: TCP streams per channel.
    :param pp: files queued ahead per channel.
    """

    name = "fixed"

    def __init__(self, *, cc: int = 4, p: int = 1, pp: int = 4) -> None:
        self.cc, self.p, self.pp = max(1, cc), max(1, p), max(0, pp)
        self._sent = False

    def update(self, observation: Observation) -> None:
        return None

    def suggest(self) -> Suggestion:
        changed = not self._sent
        self._sent = True
        reason = f"fixed settings cc={self.cc} p={self.p} pp={self.pp}" if changed else ""
        return Suggestion((ClusterLayout("all", self.cc, self.p, self.pp),), reason, changed)

    def cluster_of(self, file: FileInfo) -> str:
        return "all"
