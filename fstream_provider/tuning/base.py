"""The contract between tuners and whatever drives them (the real sender or the simulator).

A tuner is a small pure object: settings in the constructor, running state in private
fields, ``update(observation)`` and ``suggest()``. Time is passed in (``Observation.t``),
randomness too; a tuner does no I/O and never sleeps. The sender (``transfer_agent``) and
the simulator (``fstream_provider.tuning.sim``) both build ``Observation`` objects once per
interval and apply the returned ``Suggestion`` without stopping the transfer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class FileInfo:
    """One file as tuners see it.

    :param path: source path (or any unique name).
    :param size: size in bytes.
    :param ftype: file type for profiling history, normally the lower-case extension ("h5", "sra").
    """

    path: str
    size: int
    ftype: str = ""


@dataclass(frozen=True)
class PathInfo:
    """What is known about the network path.

    :param bandwidth_bps: bottleneck bandwidth in bits/s (user-given or measured).
    :param rtt_s: round-trip time in seconds.
    :param tcp_buffer: maximum TCP buffer per stream in bytes (caps one stream to buffer/RTT).
    :param max_cc: upper bound on concurrency (channels).
    :param max_p: upper bound on parallelism (streams per channel).
    :param max_pp: upper bound on pipelining depth.
    """

    bandwidth_bps: float
    rtt_s: float
    tcp_buffer: int = 4 * 2**20
    max_cc: int = 32
    max_p: int = 16
    max_pp: int = 100

    @property
    def bdp_bytes(self) -> float:
        """Bandwidth-delay product in bytes."""
        return self.bandwidth_bps * self.rtt_s / 8.0


@dataclass(frozen=True)
class ClusterLayout:
    """Target settings for one cluster of files.

    :param cluster: cluster name ("small", "large", or "all" when not clustering).
    :param cc: channels working on this cluster.
    :param p: TCP streams per channel.
    :param pp: files queued ahead per channel.
    """

    cluster: str
    cc: int
    p: int
    pp: int


@dataclass(frozen=True)
class Suggestion:
    """A tuner's answer: the layout per cluster and why.

    :param layouts: one layout per cluster that has work.
    :param reason: short human-readable reason; empty only when nothing changed.
    :param changed: True when this differs from the previous suggestion.
    :param held: clusters the tuner deliberately gives no channel for now (HARP holds a chunk until its
        sample transfers are measured); a driver opens none for them instead of rescuing their files.
    """

    layouts: tuple[ClusterLayout, ...]
    reason: str
    changed: bool = True
    held: frozenset[str] = frozenset()

    def total_cc(self) -> int:
        return sum(l.cc for l in self.layouts)

    def layout(self, cluster: str) -> ClusterLayout | None:
        for l in self.layouts:
            if l.cluster == cluster:
                return l
        return None


@dataclass(frozen=True)
class ClusterStats:
    """What happened to one cluster during the last interval.

    :param bytes: bytes moved for this cluster in the interval.
    :param throughput_bps: bytes * 8 / dt.
    :param active_channels: channels that carried data for this cluster.
    :param pending_files: files of this cluster not yet started.
    :param pending_bytes: their total size.
    """

    bytes: int = 0
    throughput_bps: float = 0.0
    active_channels: int = 0
    pending_files: int = 0
    pending_bytes: int = 0


@dataclass(frozen=True)
class Observation:
    """One interval's record, as fed to ``Tuner.update``.

    :param t: seconds since the transfer started (end of this interval).
    :param dt: length of this interval in seconds (0 for the initial observation).
    :param bytes: bytes moved in the interval (all clusters).
    :param throughput_bps: bytes * 8 / dt (0 when dt == 0).
    :param new_files: files that arrived since the previous observation (at t=0: the initial dataset).
    :param clusters: per-cluster statistics for the interval.
    :param layouts: the layouts that were in force during the interval.
    :param done: True when nothing is pending and nothing is in flight.
    """

    t: float
    dt: float
    bytes: int = 0
    throughput_bps: float = 0.0
    new_files: Sequence[FileInfo] = ()
    clusters: Mapping[str, ClusterStats] = field(default_factory=dict)
    layouts: Sequence[ClusterLayout] = ()
    done: bool = False


@runtime_checkable
class Tuner(Protocol):
    """What the sender and the simulator need from a tuner."""

    name: str

    def update(self, observation: Observation) -> None:
        """Feed one interval's record (the first one has dt == 0 and the initial files)."""

    def suggest(self) -> Suggestion:
        """Return the layout to apply now, with a reason."""

    def cluster_of(self, file: FileInfo) -> str:
        """Return the cluster name a file belongs to (must be one of the suggested layouts' names)."""
