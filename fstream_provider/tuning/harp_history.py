"""HARP's transfer history: one row per interval and cluster of a transfer, and the file chunks (HARP §III-A, §III-B).

HARP (Arslan, Kosar: "HARP: predictive transfer optimization based on historical analysis and real-time
probing", SC'16) learns from a store of past transfers, one entry per dataset, path and parameter
combination with the throughput it reached (the paper's Table II). FStream writes such an entry for
every interval of every transfer and every calibration probe (``HistoryRow``); the agent appends them
to Redis (``fstream_provider.bus.transfer_history``) and ``fstream history export|import`` moves them
through pandas.

Chunks (§III-A, Algorithm 1 line 3) are relative to the path's bandwidth-delay product. The paper does
not print its thresholds; ours: *tiny* below BDP/10, *small* below BDP, *medium* below 10 x BDP, *large*
from there on (on a 1 Gbit/s, 40 ms path: 0.5 MB, 5 MB, 50 MB).

This module is the shared vocabulary (columns, chunk rule); it does no I/O.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Iterable, Mapping

TINY, SMALL, MEDIUM, LARGE = "tiny", "small", "medium", "large"
CHUNKS: tuple[str, ...] = (TINY, SMALL, MEDIUM, LARGE)
CHUNK_ORDINAL: dict[str, int] = {c: i + 1 for i, c in enumerate(CHUNKS)}  # the similarity feature (1..4)

KINDS = ("interval", "probe", "sample")  # a running transfer's interval, a calibration probe, a HARP sample


def bdp_buffer_ratio(bandwidth_bps: Any, rtt_s: Any, tcp_buffer: Any) -> Any:
    """BDP / TCP buffer (scalars or arrays): above 1, one stream cannot fill the path (§III-B1)."""
    return bandwidth_bps * rtt_s / 8.0 / tcp_buffer


#: A representative file of each chunk, as a multiple of the BDP (calibration probes, the simulator's history).
SIZE_OF_CHUNK = {"tiny": 1 / 30, "small": 1 / 3, "medium": 3.0, "large": 12.0}
#: The settings one calibration pass tries (120; a cubic in three variables needs 20).
CALIBRATION_GRID = {"cc": (1, 2, 4, 8, 16, 32), "p": (1, 2, 4, 8, 16), "pp": (0, 1, 4, 16)}


def chunk_of(size: float, bdp_bytes: float) -> str:
    """The HARP chunk of a file of ``size`` bytes on a path whose BDP is ``bdp_bytes``."""
    if bdp_bytes <= 0:
        raise ValueError(f"chunk_of: the bandwidth-delay product must be > 0 bytes, got {bdp_bytes}")
    if size < bdp_bytes / 10:
        return TINY
    if size < bdp_bytes:
        return SMALL
    if size < 10 * bdp_bytes:
        return MEDIUM
    return LARGE


@dataclass(frozen=True)
class HistoryRow:
    """One history entry: a dataset moved on a path with (cc, p, pp) at a throughput.

    :param source: where the files came from (agent name or host).
    :param destination: ``host:port`` of the receiver.
    :param bandwidth_bps: the path's bandwidth as the transfer knew it (bits/s).
    :param rtt_s: round-trip time (s).
    :param tcp_buffer: the TCP buffer cap per stream the tuner was told (bytes).
    :param chunk: ``tiny``, ``small``, ``medium`` or ``large`` (``chunk_of`` the average file size).
    :param avg_file_size: average size of the cluster's files (bytes).
    :param file_count: files in the cluster's dataset.
    :param cc: channels working on it.
    :param p: TCP streams per channel.
    :param pp: files queued ahead per channel.
    :param throughput_bps: what it reached (bits/s).
    :param time: end of the interval, seconds since the epoch.
    :param duration_s: length of the interval.
    :param group: the paper's "same dataset, collected at about the same time": a job and cluster, or a
        calibration run and chunk.
    :param kind: ``interval`` (a transfer), ``probe`` (calibration) or ``sample`` (a HARP sample transfer).
    :param source_limited: the cluster had no file waiting (its throughput says how fast data came, not
        what the settings can do); the optimizer leaves such rows out.
    :param background_bps: competing traffic on the path during the interval, when known (NaN otherwise).
    """

    source: str
    destination: str
    bandwidth_bps: float
    rtt_s: float
    tcp_buffer: int
    chunk: str
    avg_file_size: float
    file_count: int
    cc: int
    p: int
    pp: int
    throughput_bps: float
    time: float
    duration_s: float
    group: str
    kind: str = "interval"
    source_limited: bool = False
    background_bps: float = math.nan

    def __post_init__(self) -> None:
        if self.chunk not in CHUNKS:
            raise ValueError(f"history row: chunk {self.chunk!r} is not one of {', '.join(CHUNKS)}")
        if self.kind not in KINDS:
            raise ValueError(f"history row: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        for name in ("bandwidth_bps", "rtt_s", "tcp_buffer"):
            if not getattr(self, name) > 0:
                raise ValueError(f"history row: {name} must be > 0, got {getattr(self, name)!r}")
        for name in ("cc", "p"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"history row: {name} must be >= 1, got {getattr(self, name)!r}")
        if int(self.pp) < 0 or self.throughput_bps < 0 or self.file_count < 0:
            raise ValueError("history row: pp, throughput_bps and file_count must be >= 0")

    @property
    def bdp_buffer_ratio(self) -> float:
        """BDP / TCP buffer: above 1, one stream cannot fill the path and parallel streams help (§III-B1)."""
        return bdp_buffer_ratio(self.bandwidth_bps, self.rtt_s, self.tcp_buffer)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["bdp_buffer_ratio"] = self.bdp_buffer_ratio
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "HistoryRow":
        """Rebuild a row; extra keys (such as ``bdp_buffer_ratio``) are ignored, missing required ones named."""
        known = {f.name: f for f in fields(cls)}
        missing = [n for n, f in known.items() if n not in d and f.default is MISSING]
        if missing:
            raise ValueError(f"history row: missing field(s) {', '.join(missing)}")
        kw: dict[str, Any] = {}
        for name, f in known.items():
            if name not in d:
                continue
            v = d[name]
            if f.type == "int":
                v = int(v)
            elif f.type == "float":
                v = math.nan if v is None or v == "" else float(v)
            elif f.type == "bool":
                v = v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")
            else:
                v = str(v)
            kw[name] = v
        return cls(**kw)


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(HistoryRow)) + ("bdp_buffer_ratio",)


def to_frame(rows: Iterable[HistoryRow]) -> Any:
    """The rows as a pandas ``DataFrame`` with ``COLUMNS`` (empty frame with those columns if none)."""
    import pandas as pd

    return pd.DataFrame([r.to_dict() for r in rows], columns=list(COLUMNS))


def from_frame(frame: Any) -> list[HistoryRow]:
    """Rows from a ``DataFrame`` (as read from CSV or Parquet); a bad row raises naming its index."""
    out = []
    for i, rec in enumerate(frame.to_dict(orient="records")):
        try:
            out.append(HistoryRow.from_dict(rec))
        except ValueError as exc:
            raise ValueError(f"row {i}: {exc}") from None
    return out
