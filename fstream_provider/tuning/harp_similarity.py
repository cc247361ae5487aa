"""HARP's filtering and grouping of history (Arslan & Kosar, SC'16, §III-B1, Equation 1).

*Filtering.* Each history entry and the intended transfer of one chunk are described by six features:
bandwidth, RTT, BDP/buffer, chunk type (1..4), average file size and file count. Each feature is
normalised by its largest value over the history and the request (the paper: "we normalize feature
vectors ... to keep ranges of properties as close as possible"), then weighted by (2, 2, 10, 10, 3, 1)
inside the cosine (Eq. 1 with per-feature weights: ``sum w a b / (sqrt(sum w a^2) sqrt(sum w b^2))``).
Entries at or above a threshold are kept; the threshold starts at 0.99 and drops by 0.01 until at least
``min_entries`` are kept (the paper: 3,000 of 21,000; we scale that to the history we have, see
``HarpOptimizer``), never below ``floor``.

*Departure* (switch ``log-features``, off in the ``paper`` variant): file size and count are normalised
on a log scale (``log1p``): their ranges span six orders of magnitude, and a linear max-normalisation
puts every file far below the largest at about zero: with 10 MB files in the history a 1 kB and a
100 kB dataset look identical (similarity 1 - 6e-6), while on a log scale a factor of 100 weighs the
same whether smaller or larger. Chunk type, which the paper adds for this reason, still separates
tiny from small files. The other four features are normalised linearly as in the paper.

*Grouping.* The paper groups the kept entries that share dataset and network settings and were
collected at about the same time (one group = one sweep, its own background load). Calibration probes
(``kind == "probe"``) are grouped by their ``group`` label: one pass of ``fstream calibrate`` over the
grid for one chunk. Rows of transfers (intervals, samples) are grouped by path and chunk within one
``window_s`` time window: a single transfer rarely tries enough settings for a cubic, several transfers
in one hour on one path together may.
"""

from __future__ import annotations

from dataclasses import dataclass

from fstream_provider.extras import agent_only

try:
    import numpy as np
    import pandas as pd
except ImportError as exc:  # a provider-only install (issue 39)
    raise agent_only(exc, "HARP's similar-transfer selection") from exc

from fstream_provider.tuning.harp_history import CHUNK_ORDINAL, CHUNKS, bdp_buffer_ratio

WEIGHTS = (2.0, 2.0, 10.0, 10.0, 3.0, 1.0)  # bandwidth, RTT, BDP/buffer, chunk type, file size, file count
GROUP_WINDOW_S = 3600.0  # rows of one path and chunk within this window form one experiment set


@dataclass(frozen=True)
class HarpRequest:
    """The intended transfer of one chunk, as the Optimizer sees it.

    :param bandwidth_bps: the path's bandwidth (bits/s).
    :param rtt_s: round-trip time (s).
    :param tcp_buffer: TCP buffer cap per stream (bytes).
    :param chunk: ``tiny``, ``small``, ``medium`` or ``large``.
    :param avg_file_size: average file size of the chunk (bytes).
    :param file_count: files in the chunk.
    :param source: this side's name (not a similarity feature; for reasons and reports).
    :param destination: the receiver (likewise).
    """

    bandwidth_bps: float
    rtt_s: float
    tcp_buffer: int
    chunk: str
    avg_file_size: float
    file_count: int
    source: str = ""
    destination: str = ""

    def __post_init__(self) -> None:
        if self.chunk not in CHUNKS:
            raise ValueError(f"HARP request: chunk {self.chunk!r} is not one of {', '.join(CHUNKS)}")
        for name in ("bandwidth_bps", "rtt_s", "tcp_buffer", "avg_file_size"):
            if not getattr(self, name) > 0:
                raise ValueError(f"HARP request: {name} must be > 0, got {getattr(self, name)!r}")
        if self.file_count < 1:
            raise ValueError(f"HARP request: file_count must be >= 1, got {self.file_count!r}")

    def vector(self) -> np.ndarray:
        ratio = bdp_buffer_ratio(self.bandwidth_bps, self.rtt_s, self.tcp_buffer)
        return np.array([self.bandwidth_bps, self.rtt_s, ratio, CHUNK_ORDINAL[self.chunk],
                         self.avg_file_size, self.file_count], dtype=float)


def _raw(history: pd.DataFrame) -> np.ndarray:
    if "bdp_buffer_ratio" in history:
        ratio = history["bdp_buffer_ratio"].to_numpy(float)
    else:
        ratio = bdp_buffer_ratio(history["bandwidth_bps"], history["rtt_s"], history["tcp_buffer"]).to_numpy(float)
    chunk = history["chunk"].map(CHUNK_ORDINAL)
    if chunk.isna().any():
        bad = sorted(set(history["chunk"][chunk.isna()].astype(str)))
        raise ValueError(f"history: unknown chunk type(s) {', '.join(bad)} (expected {', '.join(CHUNKS)})")
    return np.column_stack([history["bandwidth_bps"].to_numpy(float), history["rtt_s"].to_numpy(float), ratio,
                            chunk.to_numpy(float), history["avg_file_size"].to_numpy(float),
                            history["file_count"].to_numpy(float)])


def similarity(history: pd.DataFrame, request: HarpRequest, weights=WEIGHTS, *, log_features: bool = True) -> np.ndarray:
    """Weighted cosine similarity (Eq. 1) of every history row to ``request``; one value in [0, 1] per row.

    ``log_features=False`` scales file size and count linearly, as the paper does (variant ``paper``)."""
    if len(history) == 0:
        return np.zeros(0)
    raw = _raw(history)
    req = request.vector()
    if (raw < 0).any():
        raise ValueError("history: negative feature values (bandwidth, RTT, buffer ratio, size, count must be >= 0)")
    req = req.copy()
    if log_features:
        raw[:, 4:] = np.log1p(raw[:, 4:])
        req[4:] = np.log1p(req[4:])
    scale = np.maximum(raw.max(axis=0), req)
    scale[scale == 0] = 1.0
    a, b = raw / scale, req / scale
    w = np.asarray(weights, dtype=float)
    if w.shape != (6,) or (w < 0).any():
        raise ValueError(f"similarity weights {weights!r}: expected six weights >= 0")
    num = (a * b * w).sum(axis=1)
    den = np.sqrt((a * a * w).sum(axis=1)) * np.sqrt((b * b * w).sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(den > 0, num / den, 0.0)
    return np.clip(out, 0.0, 1.0)


def select_similar(history: pd.DataFrame, request: HarpRequest, *, min_entries: int, start: float = 0.99,
                   step: float = 0.01, floor: float = 0.5, weights=WEIGHTS,
                   log_features: bool = True) -> tuple[pd.DataFrame, float, str]:
    """Rows with similarity >= a threshold lowered from ``start`` until ``min_entries`` are kept (or ``floor``).

    :returns: (the kept rows with a ``similarity`` column, the threshold used, a reason).
    """
    if not 0 < floor <= start <= 1 or step <= 0:
        raise ValueError(f"similarity threshold: need 0 < floor ({floor}) <= start ({start}) <= 1 and step > 0")
    sim = similarity(history, request, weights, log_features=log_features)
    if len(sim) == 0:
        return history.assign(similarity=sim), start, "no history"
    thr = start
    while True:
        kept = sim >= thr - 1e-12
        if kept.sum() >= min_entries or thr - step < floor - 1e-12:
            break
        thr = round(thr - step, 6)
    out = history[kept].assign(similarity=sim[kept])
    note = (f"{int(kept.sum())} of {len(sim)} entries with similarity >= {thr:.2f}"
            + ("" if kept.sum() >= min_entries else f" (fewer than {min_entries} even at the floor {floor:.2f})"))
    return out, thr, note


def group_keys(rows: pd.DataFrame, *, window_s: float = GROUP_WINDOW_S) -> np.ndarray:
    """Each row's experiment set (see ``group_rows``): a function of the row alone, so a cache of the history
    can tell which groups an append or a trim touched (``fstream_provider.bus.history_cache``)."""
    if window_s <= 0:
        raise ValueError(f"group window {window_s!r}: must be > 0 seconds")
    if len(rows) == 0:
        return np.zeros(0, dtype=object)
    win = np.floor(rows["time"].to_numpy(float) / window_s).astype(np.int64)
    keys = (rows["source"].astype(str) + "|" + rows["destination"].astype(str) + "|"
            + rows["chunk"].astype(str) + "|" + rows["bandwidth_bps"].round(-3).astype(str) + "|"
            + rows["rtt_s"].round(5).astype(str) + "|" + rows["tcp_buffer"].astype(str) + "|w" + win.astype(str))
    if "kind" in rows:  # a calibration pass is a designed experiment set: its label is its group
        probe = (rows["kind"].astype(str) == "probe").to_numpy()
        return np.where(probe, "probe|" + rows["group"].astype(str), keys).astype(object)
    return keys.to_numpy(dtype=object)


def group_rows(similar: pd.DataFrame, *, window_s: float = GROUP_WINDOW_S) -> dict[str, pd.DataFrame]:
    """The paper's experiment sets: same path and chunk, collected within one ``window_s`` window.

    Rows are keyed by (source, destination, chunk, bandwidth, RTT, TCP buffer, time window); a ``group``
    label whose rows span several windows is split, and different labels in one window are merged.
    """
    keys = group_keys(similar, window_s=window_s)
    if len(similar) == 0:
        return {}
    return {k: g for k, g in similar.groupby(keys, sort=True)}
