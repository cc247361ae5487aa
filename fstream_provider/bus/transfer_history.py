"""HARP's transfer history in Redis: a stream of ``HistoryRow`` JSON at ``Keys.history()``, bounded by size and age.

Every interval of every transfer, every calibration probe and every HARP sample is one entry
(``fstream_provider.tuning.harp_history``). Growth is bounded twice on every append: ``MAXLEN ~ max_rows``
(newest kept) and ``MINID ~ now - max_age`` (older entries dropped), both approximate so trimming
stays O(1) amortised. The profiling history of the ``fstream`` tuner (``Keys.profiling``) is a different,
smaller thing: the best layout found per size class and file type, which the tuner reads back; this
stream is every measurement, which HARP's regression reads.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any, Iterable, Iterator

from fstream_provider.bus.keys import HISTORY_MAXLEN, Keys
from fstream_provider.tuning.harp_history import CHUNKS, KINDS, HistoryRow, bdp_buffer_ratio

log = logging.getLogger(__name__)

HISTORY_MAX_AGE_S = 90 * 24 * 3600  # the paper collected 12 weeks; older load patterns say little about today


#: The columns of a parsed batch (``harp_history.COLUMNS``) by storage: strings (categorical in a cached frame),
#: floats, integers and the one bool. cc, p and pp are int32: a row with a setting beyond 2^31 is skipped.
STR_FIELDS = ("source", "destination", "chunk", "group", "kind")
FLOAT_FIELDS = ("bandwidth_bps", "rtt_s", "avg_file_size", "throughput_bps", "time", "duration_s", "background_bps")
INT_FIELDS: dict[str, str] = {"tcp_buffer": "int64", "file_count": "int64", "cc": "int32", "p": "int32",
                              "pp": "int32"}
_DEFAULTS: dict[str, Any] = {"kind": "interval", "source_limited": False, "background_bps": math.nan}
_INT32 = 2**31


def entry_id(raw: Any) -> tuple[int, int]:
    """A stream entry id ``"ms-seq"`` as two integers (ordered as Redis orders them)."""
    ms, _, seq = (raw.decode() if isinstance(raw, bytes) else str(raw)).partition("-")
    return int(ms), int(seq or 0)


def _parse(entry_id: Any, fields: dict) -> HistoryRow | None:
    """One stream entry's row; an unreadable entry is logged and skipped, never fatal."""
    try:
        return HistoryRow.from_dict(json.loads(fields.get("row", fields.get(b"row"))))
    except (TypeError, ValueError) as exc:
        log.warning("history entry %s skipped: %s", entry_id, exc)
        return None


def _value(d: Any, name: str) -> Any:
    return d[name] if name not in _DEFAULTS else d.get(name, _DEFAULTS[name])


def _bulk(dicts: list) -> dict[str, Any] | None:
    """Columns of well-typed rows in one go; None when any row needs ``HistoryRow.from_dict``'s coercion or
    fails its checks (the caller then goes row by row, so both ways keep and skip the same rows)."""
    import numpy as np

    try:
        out: dict[str, Any] = {}
        for name in FLOAT_FIELDS:
            a = np.asarray([_value(d, name) for d in dicts])
            if a.dtype.kind not in "fiub":
                return None
            out[name] = a.astype(np.float64)
        for name, dtype in INT_FIELDS.items():
            a = np.asarray([_value(d, name) for d in dicts])
            if a.dtype.kind not in "iub" or (dtype == "int32" and len(a) and int(np.abs(a).max()) >= _INT32):
                return None
            out[name] = a.astype(dtype)
        a = np.asarray([_value(d, "source_limited") for d in dicts])
        if a.dtype.kind != "b":
            return None
        out["source_limited"] = a
        for name in STR_FIELDS:
            a = np.asarray([_value(d, name) for d in dicts], dtype=object)
            if not all(type(v) is str for v in set(a.tolist())):
                return None
            out[name] = a
    except (KeyError, TypeError, AttributeError, ValueError, OverflowError):
        return None
    ok = (set(out["chunk"].tolist()) <= set(CHUNKS) and set(out["kind"].tolist()) <= set(KINDS)
          and bool(np.all(out["bandwidth_bps"] > 0)) and bool(np.all(out["rtt_s"] > 0))
          and bool(np.all(out["tcp_buffer"] > 0)) and bool(np.all(out["cc"] >= 1)) and bool(np.all(out["p"] >= 1))
          and bool(np.all(out["pp"] >= 0)) and not bool(np.any(out["throughput_bps"] < 0))
          and bool(np.all(out["file_count"] >= 0)))
    if not ok:
        return None
    out["bdp_buffer_ratio"] = bdp_buffer_ratio(out["bandwidth_bps"], out["rtt_s"], out["tcp_buffer"].astype(np.float64))
    return out


def _by_row(dicts: list, ids: list) -> tuple[dict[str, Any], Any]:
    """Columns through ``HistoryRow.from_dict`` one row at a time; rows it refuses are logged and marked invalid."""
    import numpy as np

    rows: list[HistoryRow | None] = []
    for d, i in zip(dicts, ids):
        try:
            r = HistoryRow.from_dict(d)
            if max(abs(int(r.cc)), abs(int(r.p)), abs(int(r.pp))) >= _INT32:
                raise ValueError("cc, p or pp beyond 2^31")
            rows.append(r)
        except (TypeError, ValueError, AttributeError) as exc:
            log.warning("history entry %s skipped: %s", i, exc)
            rows.append(None)
    valid = np.array([r is not None for r in rows], dtype=bool)
    good = [r for r in rows if r is not None]
    out: dict[str, Any] = {n: np.asarray([getattr(r, n) for r in good], dtype=np.float64) for n in FLOAT_FIELDS}
    out.update({n: np.asarray([getattr(r, n) for r in good], dtype=t) for n, t in INT_FIELDS.items()})
    out["source_limited"] = np.asarray([bool(r.source_limited) for r in good], dtype=bool)
    out.update({n: np.asarray([getattr(r, n) for r in good], dtype=object) for n in STR_FIELDS})
    out["bdp_buffer_ratio"] = np.asarray([r.bdp_buffer_ratio for r in good], dtype=np.float64)
    return out, valid


def parse_columns(entries: list) -> dict[str, Any]:
    """Stream entries (``XRANGE`` replies, oldest first) as columns, one value per entry.

    Every ``harp_history.COLUMNS`` field (strings as object arrays), ``id_ms`` and ``id_seq`` (the entry ids)
    and ``valid``: False for an entry ``TransferHistory.rows`` would skip (unreadable JSON, a row
    ``HistoryRow`` refuses; logged), whose other values are placeholders. Well-typed rows, the ones
    ``append`` writes, are converted column by column; a batch with anything else goes row by row through
    ``HistoryRow.from_dict``, so a frame built from these columns equals ``TransferHistory.frame()``.
    """
    import numpy as np  # here: the agent imports this module, and only HARP's history needs numpy

    n = len(entries)
    id_ms, id_seq = np.empty(n, np.int64), np.empty(n, np.int64)
    dicts, at, names = [], [], []
    for k, (eid, fields) in enumerate(entries):
        id_ms[k], id_seq[k] = entry_id(eid)
        try:
            dicts.append(json.loads(fields.get("row", fields.get(b"row"))))
            at.append(k)
            names.append(eid)
        except (TypeError, ValueError) as exc:
            log.warning("history entry %s skipped: %s", eid, exc)
    cols = _bulk(dicts)
    valid = np.zeros(n, dtype=bool)
    where = np.asarray(at, dtype=np.int64)
    if cols is not None:
        valid[where] = True
    else:
        cols, ok = _by_row(dicts, names)
        where = where[ok]
        valid[where] = True
    out: dict[str, Any] = {"id_ms": id_ms, "id_seq": id_seq, "valid": valid}
    for name, col in cols.items():
        full = np.full(n, "", dtype=object) if col.dtype == object else np.zeros(n, dtype=col.dtype)
        full[where] = col
        out[name] = full
    return out


class TransferHistory:
    """Append and read HARP history rows.

    :param client: a ``redis.Redis`` (``decode_responses`` either way).
    :param keys: the key schema (namespace).
    :param max_rows: entries kept (``MAXLEN ~``); ``0`` keeps no bound on count.
    :param max_age_s: entries older than this are trimmed on append (``MINID ~``); ``0`` keeps them.
    """

    def __init__(self, client: Any, *, keys: Keys | None = None, max_rows: int = HISTORY_MAXLEN,
                 max_age_s: float = HISTORY_MAX_AGE_S) -> None:
        if max_rows < 0 or max_age_s < 0:
            raise ValueError(f"history limits must be >= 0 (max_rows={max_rows}, max_age_s={max_age_s})")
        self.client = client
        self.keys = keys or Keys()
        self.max_rows = int(max_rows)
        self.max_age_s = float(max_age_s)

    @property
    def key(self) -> str:
        return self.keys.history()

    def append(self, rows: Iterable[HistoryRow], *, now: float | None = None) -> int:
        """Append ``rows`` (one pipeline) and trim by size and age; return how many were written."""
        rows = list(rows)
        if not rows:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for r in rows:
            pipe.xadd(self.key, {"row": json.dumps(r.to_dict(), allow_nan=True)},
                      maxlen=self.max_rows or None, approximate=True)
        if self.max_age_s:
            cutoff_ms = int(((time.time() if now is None else now) - self.max_age_s) * 1000)
            if cutoff_ms > 0:
                pipe.xtrim(self.key, minid=f"{cutoff_ms}-0", approximate=True)
        pipe.execute()
        return len(rows)

    def iter_rows(self, *, batch: int = 5000) -> Iterator[HistoryRow]:
        """Every stored row, oldest first; an unreadable entry is logged and skipped, never fatal."""
        start = "-"
        while True:
            chunk = self.client.xrange(self.key, min=start, count=batch)
            if not chunk:
                return
            for entry_id, fields in chunk:
                row = _parse(entry_id, fields)
                if row is not None:
                    yield row
            last = chunk[-1][0]
            last = last.decode() if isinstance(last, bytes) else last
            start = "(" + last
            if len(chunk) < batch:
                return

    def rows(self) -> list[HistoryRow]:
        return list(self.iter_rows())

    def newest(self, limit: int) -> list[HistoryRow]:
        """The newest ``limit`` rows, oldest first."""
        rows = (_parse(i, f) for i, f in reversed(self.client.xrevrange(self.key, count=limit)))
        return [r for r in rows if r is not None]

    def frame(self, limit: int | None = None) -> Any:
        """The history (or its newest ``limit`` rows) as a pandas ``DataFrame`` (``harp_history.COLUMNS``)."""
        from fstream_provider.tuning.harp_history import to_frame

        return to_frame(self.iter_rows() if limit is None else self.newest(limit))

    def count(self) -> int:
        return int(self.client.xlen(self.key))

    def clear(self) -> int:
        """Delete the whole history; return how many entries it held."""
        n = self.count()
        self.client.delete(self.key)
        return n
