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
import time
from typing import Any, Iterable, Iterator

from fstream_provider.bus.keys import HISTORY_MAXLEN, Keys
from fstream_provider.tuning.harp_history import HistoryRow

log = logging.getLogger(__name__)

HISTORY_MAX_AGE_S = 90 * 24 * 3600  # the paper collected 12 weeks; older load patterns say little about today


def _parse(entry_id: Any, fields: dict) -> HistoryRow | None:
    """One stream entry's row; an unreadable entry is logged and skipped, never fatal."""
    try:
        return HistoryRow.from_dict(json.loads(fields.get("row", fields.get(b"row"))))
    except (TypeError, ValueError) as exc:
        log.warning("history entry %s skipped: %s", entry_id, exc)
        return None


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
