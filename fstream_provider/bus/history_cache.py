"""HARP's transfer history parsed once per process and kept current: a later job reads only what was appended.

Every ``harp`` or HARP-seeded ``fstream`` job needs the transfer history (``Keys.history()``, up to a million
rows of JSON) as a DataFrame before its model is ready. An agent runs many jobs one after the other, so the
parsed rows are kept per process, one ``HistoryCache`` per (Redis server, history key, row limit)
(``HistoryCaches``; ``process_caches()`` is the process's):

* **what is held**: the newest ``limit`` stream entries as columns (floats and integers as numpy arrays,
  the five strings as categorical codes, about 130 bytes a row), the entry ids, and which entries are rows
  (an unreadable entry is kept as a placeholder so the window counts entries as ``XREVRANGE COUNT`` does);
* **refresh** (one ``MULTI``: ``XINFO STREAM``, the last entry read, the entries after it): appends what came
  after the last id read; drops the cached head that Redis trimmed (``MAXLEN``/``MINID``: the stream's first
  entry is past it) or that falls out of the window; reads the window again when the last entry read is gone
  (the stream was deleted, recreated, or trimmed past all we held), when ``entries-added`` (Redis >= 7) says
  the stream was recreated, or when the cache holds the whole stream and its length disagrees (entries
  deleted in between);
* **generations**: ``generation`` counts changes; ``group_versions`` gives each HARP experiment set
  (``harp_similarity.group_keys``) the generation it last changed in, kept incrementally once asked for;
* **fitted models**: ``fit_cache`` (``harp_fits.GroupFitCache``) keeps the HARP groups fitted on this
  history; the tuners take it from the history source and refit only groups whose rows changed.

A frame handed out is a snapshot: its columns are read-only views of buffers written only past their end,
so a refresh never changes a frame a tuner is using. Entries deleted in the middle of a window that does not
start at the stream's first entry (``XDEL``; FStream never does it) are not noticed until a reload.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from fstream_provider.extras import agent_only

try:
    import numpy as np
    import pandas as pd
except ImportError as exc:  # a provider-only install (issue 39)
    raise agent_only(exc, "HARP's transfer-history cache") from exc

from fstream_provider.bus.transfer_history import FLOAT_FIELDS, INT_FIELDS, STR_FIELDS, entry_id, parse_columns
from fstream_provider.tuning.harp_fits import GroupFitCache
from fstream_provider.tuning.harp_history import COLUMNS
from fstream_provider.tuning.harp_similarity import GROUP_WINDOW_S, group_keys

log = logging.getLogger(__name__)

READ_BATCH = 5000  # entries per XRANGE: big replies block Redis and hold the GIL while they are parsed
_NUMERIC: dict[str, Any] = {"id_ms": np.int64, "id_seq": np.int64, "valid": np.bool_,
                            **{n: np.float64 for n in FLOAT_FIELDS}, **INT_FIELDS, "source_limited": np.bool_,
                            "bdp_buffer_ratio": np.float64}


class _Columns:
    """Parsed entries column by column, live in ``[start, end)`` of buffers that are only written outside it."""

    def __init__(self, capacity: int, at: int = 0) -> None:
        self.cap = max(1, capacity)
        self.num = {n: np.zeros(self.cap, t) for n, t in _NUMERIC.items()}
        self.codes = {n: np.zeros(self.cap, np.int32) for n in STR_FIELDS}
        self.cats: dict[str, list[str]] = {n: [] for n in STR_FIELDS}
        self.index: dict[str, dict[str, int]] = {n: {} for n in STR_FIELDS}
        self.start = self.end = at

    def __len__(self) -> int:
        return self.end - self.start

    def _put(self, batch: dict[str, Any], lo: int) -> None:
        hi = lo + len(batch["id_ms"])
        for name, arr in self.num.items():
            arr[lo:hi] = batch[name]
        for name in STR_FIELDS:
            local, uniques = pd.factorize(batch[name])
            index, cats = self.index[name], self.cats[name]
            to_global = np.empty(len(uniques), np.int32)
            for k, u in enumerate(uniques.tolist()):
                code = index.get(u)
                if code is None:
                    code = index[u] = len(cats)
                    cats.append(u)
                to_global[k] = code
            self.codes[name][lo:hi] = to_global[local]

    def append(self, batch: dict[str, Any], room: int) -> None:
        n = len(batch["id_ms"])
        if self.end + n > self.cap:
            self._compact(max(room, len(self) + n))
        self._put(batch, self.end)
        self.end += n

    def prepend(self, batch: dict[str, Any]) -> None:
        n = len(batch["id_ms"])
        assert n <= self.start, "prepend past the buffers' start"
        self._put(batch, self.start - n)
        self.start -= n

    def _compact(self, capacity: int) -> None:
        """Fresh buffers holding the live window at their start (frames keep the old ones); unused strings go."""
        lo, hi, live = self.start, self.end, len(self)
        num = {n: np.zeros(capacity, t) for n, t in _NUMERIC.items()}
        for name, arr in self.num.items():
            num[name][:live] = arr[lo:hi]
        codes = {n: np.zeros(capacity, np.int32) for n in STR_FIELDS}
        for name in STR_FIELDS:
            old = self.codes[name][lo:hi]
            used = np.unique(old)
            remap = np.zeros(max(1, len(self.cats[name])), np.int32)
            remap[used] = np.arange(len(used), dtype=np.int32)
            codes[name][:live] = remap[old]
            self.cats[name] = [self.cats[name][i] for i in used.tolist()]
            self.index[name] = {c: i for i, c in enumerate(self.cats[name])}
        self.num, self.codes, self.cap, self.start, self.end = num, codes, capacity, 0, live

    def drop_head(self, k: int) -> None:
        self.start += min(max(0, k), len(self))

    def before(self, ms: int, seq: int) -> int:
        """Live entries whose id is lower than ``ms-seq``."""
        m = self.num["id_ms"][self.start:self.end]
        lo, hi = int(np.searchsorted(m, ms, "left")), int(np.searchsorted(m, ms, "right"))
        return lo + int(np.searchsorted(self.num["id_seq"][self.start + lo:self.start + hi], seq, "left"))

    def id_at(self, i: int) -> tuple[int, int]:
        return int(self.num["id_ms"][i]), int(self.num["id_seq"][i])

    def frame(self, lo: int | None = None, hi: int | None = None) -> pd.DataFrame:
        """The rows of ``[lo, hi)`` (default: the live window) as ``harp_history.COLUMNS``, invalid entries left out."""
        lo = self.start if lo is None else lo
        hi = self.end if hi is None else hi
        cols: dict[str, Any] = {}
        for name in COLUMNS:
            if name in self.codes:
                cols[name] = pd.Categorical.from_codes(self.codes[name][lo:hi], categories=list(self.cats[name]))
            else:
                view = self.num[name][lo:hi].view()
                view.flags.writeable = False
                cols[name] = view
        frame = pd.DataFrame(cols, copy=False)
        valid = self.num["valid"][lo:hi]
        return frame if valid.all() else frame[valid].reset_index(drop=True)


@dataclass(frozen=True)
class Refresh:
    """What one ``HistoryCache.refresh`` did.

    :param new: entries read and appended.
    :param dropped: entries dropped from the cached head (trimmed in Redis, or out of the window).
    :param reloaded: the window was read again from Redis (``why`` says why).
    :param generation: the cache's generation after it.
    :param seconds: how long it took (waiting for another thread's refresh included).
    """

    new: int
    dropped: int
    reloaded: bool
    generation: int
    seconds: float
    why: str = ""


class HistoryCache:
    """One history stream's newest entries, parsed, refreshed incrementally, thread-safe.

    :param key: the stream (``Keys.history()``).
    :param limit: newest entries held (None: all of them).
    :param batch: entries per ``XRANGE``/``XREVRANGE`` call.
    :param fit_cache: where HARP's fitted groups on this history are kept (default: a new ``GroupFitCache``).
    """

    def __init__(self, key: str, *, limit: int | None = None, batch: int = READ_BATCH,
                 fit_cache: GroupFitCache | None = None) -> None:
        if (limit is not None and limit < 1) or batch < 1:
            raise ValueError(f"history cache: limit ({limit!r}) and batch ({batch!r}) must be >= 1")
        self.key, self.limit, self.batch = key, limit, batch
        self.fit_cache = fit_cache if fit_cache is not None else GroupFitCache()
        self._lock = threading.RLock()
        self._cols: _Columns | None = None
        self._frame: tuple[int, pd.DataFrame] | None = None
        self._groups: dict[str, list[int]] | None = None  # group -> [rows, generation it last changed]
        self._gone: dict[str, int] = {}  # groups whose last row went, and when
        self._window_s = GROUP_WINDOW_S
        self._base = 0
        self._added: int | None = None  # XINFO's entries-added when the last entry read was the stream's last
        self._last_fields: dict | None = None  # the fields of the last entry read (a rewrite of it means recreated)
        self.generation = 0
        self.entries_read = 0  # over the cache's life (a positive count of what Redis sent)
        self.reloads = 0

    # -- what is held ----------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self._cols is not None

    @property
    def entries(self) -> int:
        """Stream entries held (rows, and entries that could not be read)."""
        return len(self._cols) if self._cols is not None else 0

    @property
    def capacity(self) -> int:
        """Entries the buffers have room for (the window and room to append)."""
        return self._cols.cap if self._cols is not None else 0

    @property
    def nbytes(self) -> int:
        """Bytes of the cache's column buffers (their capacity: the window plus room to append)."""
        cols = self._cols
        return 0 if cols is None else sum(a.nbytes for a in (*cols.num.values(), *cols.codes.values()))

    @property
    def last_id(self) -> str | None:
        cols = self._cols
        if cols is None or not len(cols):
            return None
        ms, seq = cols.id_at(cols.end - 1)
        return f"{ms}-{seq}"

    def frame(self) -> pd.DataFrame | None:
        """The held rows (``harp_history.COLUMNS``; strings categorical), or None before the first load."""
        with self._lock:
            if self._cols is None:
                return None
            if self._frame is None or self._frame[0] != self.generation:
                self._frame = (self.generation, self._cols.frame())
            return self._frame[1]

    def load(self, client: Any) -> pd.DataFrame:
        """``refresh`` then ``frame``."""
        self.refresh(client)
        frame = self.frame()
        assert frame is not None
        return frame

    # -- keeping it current ------------------------------------------------------------------------
    def refresh(self, client: Any) -> Refresh:
        """Bring the cache up to the stream: read what was appended, drop what was trimmed, reload if needed."""
        t0 = time.perf_counter()
        with self._lock:
            self._base = self.generation
            cols = self._cols
            if cols is None or not len(cols):
                new, why = self._reload(client), "first load" if cols is None else "nothing held"
                return Refresh(new, 0, True, self.generation, time.perf_counter() - t0, why)
            return self._incremental(client, cols, t0)

    def _changed(self) -> None:
        self.generation = self._base + 1
        self._frame = None

    def _room(self, needed: int) -> int:
        """Buffer capacity for ``needed`` entries: a quarter more (at least a batch), so appends copy the
        window about every quarter of it (amortised O(1) per entry); never much beyond the limit."""
        room = needed + max(self.batch, needed // 4)
        if self.limit is not None:
            room = min(room, self.limit + max(self.batch, self.limit // 4))
        return max(room, needed)

    def _read(self, client: Any, lo: str, hi: str, count: int, *, reverse: bool = False) -> tuple[list, Any]:
        """One batch and, read with it in one ``MULTI``, the stream's ``XINFO`` (None when there is no stream)."""
        pipe = client.pipeline(transaction=True)
        pipe.xinfo_stream(self.key)
        if reverse:
            pipe.xrevrange(self.key, max=hi, min=lo, count=count)
        else:
            pipe.xrange(self.key, min=lo, max=hi, count=count)
        info, chunk = pipe.execute(raise_on_error=False)
        if isinstance(chunk, Exception):
            raise chunk
        self.entries_read += len(chunk)
        return chunk, _info(info)

    def _reload(self, client: Any) -> int:
        """Read the newest ``limit`` entries (all without a limit) into fresh columns; return how many."""
        if self.limit is None:
            chunk, info = self._read(client, "-", "+", self.batch)
            cols = _Columns(self._room(int(info["length"]) if info else 0))
            while True:
                if chunk:
                    cols.append(parse_columns(chunk), self._room(len(cols) + len(chunk)))
                    self._last_fields = chunk[-1][1]
                if len(chunk) < self.batch:  # the stream's end as this XINFO saw it
                    break
                chunk, info = self._read(client, "(" + _id_text(chunk[-1][0]), "+", self.batch)
        else:  # newest first, each batch put before the one read before it
            want = min(self.batch, self.limit)
            chunk, info = self._read(client, "-", "+", want, reverse=True)
            self._last_fields = chunk[0][1] if chunk else None
            target = min(self.limit, int(info["length"])) if info else 0  # entries there are at most
            cols = _Columns(self._room(target), at=target)
            while chunk:
                cols.prepend(parse_columns(chunk[::-1]))
                if len(chunk) < want or len(cols) >= target:
                    break
                want = min(self.batch, target - len(cols))
                chunk, _ = self._read(client, "-", "(" + _id_text(chunk[-1][0]), want, reverse=True)
        self.reloads += 1
        was_empty = self._cols is not None and not len(self._cols)
        self._cols, self._added = cols, _added(info)  # this XINFO was read with the stream's newest entry
        if was_empty and not len(cols):
            return 0  # still nothing: no new generation
        self._changed()
        if self._groups is not None:  # every group is new to this generation; the ones not seen again are gone
            before, self._groups = self._groups, {}
            self._track(cols, cols.start, cols.end, +1)
            self._gone.update({g: self.generation for g in before if g not in self._groups})
        return len(cols)

    def _incremental(self, client: Any, cols: _Columns, t0: float) -> Refresh:
        last = self.last_id
        assert last is not None
        pipe = client.pipeline(transaction=True)
        pipe.xinfo_stream(self.key)
        pipe.xrange(self.key, min=last, max=last)
        pipe.xrange(self.key, min="(" + last, max="+", count=self.batch)
        info, still, chunk = pipe.execute(raise_on_error=False)
        for reply in (still, chunk):
            if isinstance(reply, Exception):
                raise reply
        info = _info(info)
        self.entries_read += len(still) + len(chunk)
        why, trimmed = "", 0
        complete = len(chunk) < self.batch  # the reply reaches the stream's end as XINFO saw it
        if info is None or not info.get("first-entry"):
            why = "the stream is gone"
        elif not still:
            why = "the last entry read is gone (stream deleted, recreated or trimmed past the cache)"
        elif complete and None not in (self._added, _added(info)) and _added(info) != self._added + len(chunk):
            why = (f"the stream was recreated ({_added(info)} entries ever added where {self._added + len(chunk)} "
                   "were expected)")
        elif self._last_fields is not None and still[0][1] != self._last_fields:
            # what gives a recreation away where XINFO has no entries-added (Redis 6.2, issue 39's floor)
            why = "the last entry read was rewritten (the stream was recreated with the same ids)"
        else:
            first = entry_id(info["first-entry"][0])
            trimmed = cols.before(*first)
            whole = cols.id_at(cols.start + trimmed) == first  # we hold from the stream's first entry on
            expected = len(cols) - trimmed + len(chunk)
            if whole and complete and int(info["length"]) != expected:
                why = f"{info['length']} entries in Redis where {expected} were expected"
        if why:
            held = len(cols)
            if info is None or not info.get("first-entry"):
                self._cols, self._added = _Columns(self._room(0)), None
                self._changed()
                self._track_all()
                return Refresh(0, held, True, self.generation, time.perf_counter() - t0, why)
            log.info("transfer history cache: reloading %s: %s", self.key, why)
            return Refresh(self._reload(client), held, True, self.generation, time.perf_counter() - t0, why)
        dropped = self._drop(cols, trimmed)
        new = 0
        while chunk:
            new += self._append(cols, chunk)
            if len(chunk) < self.batch:
                break
            chunk = client.xrange(self.key, min="(" + _id_text(chunk[-1][0]), max="+", count=self.batch)
            self.entries_read += len(chunk)
        self._added = _added(info) if complete else None  # unknown after reads outside the MULTI
        if self.limit is not None and len(cols) > self.limit:
            dropped += self._drop(cols, len(cols) - self.limit)
        return Refresh(new, dropped, False, self.generation, time.perf_counter() - t0)

    def _drop(self, cols: _Columns, k: int) -> int:
        if k <= 0:
            return 0
        self._changed()
        self._track(cols, cols.start, cols.start + k, -1)
        cols.drop_head(k)
        return k

    def _append(self, cols: _Columns, chunk: list) -> int:
        self._changed()
        cols.append(parse_columns(chunk), self._room(len(cols) + len(chunk)))
        self._last_fields = chunk[-1][1]
        self._track(cols, cols.end - len(chunk), cols.end, +1)  # after the append: a compaction moves rows
        return len(chunk)

    # -- which groups changed ------------------------------------------------------------------------
    def group_versions(self, window_s: float = GROUP_WINDOW_S) -> dict[str, int]:
        """Each held HARP experiment set (``harp_similarity.group_keys``) and the generation it last changed in.

        Kept up to date incrementally from the first call on (before it, nothing is spent on groups)."""
        with self._lock:
            if self._groups is None or window_s != self._window_s:
                self._window_s, self._groups, self._gone = window_s, {}, {}
                if self._cols is not None:
                    self._track(self._cols, self._cols.start, self._cols.end, +1)
            return {g: v for g, (_, v) in self._groups.items()}

    def changed_since(self, generation: int, window_s: float = GROUP_WINDOW_S) -> set[str]:
        """Groups that gained or lost rows after ``generation`` (ones whose last row went included)."""
        with self._lock:
            versions = self.group_versions(window_s)
            return {g for g, v in versions.items() if v > generation} | {g for g, v in self._gone.items()
                                                                        if v > generation}

    def _track(self, cols: _Columns, lo: int, hi: int, sign: int) -> None:
        if self._groups is None or hi <= lo:
            return
        keys = group_keys(cols.frame(lo, hi), window_s=self._window_s)
        if not len(keys):
            return
        groups, counts = np.unique(keys.astype(str), return_counts=True)
        for g, n in zip(groups.tolist(), counts.tolist()):
            cur = self._groups.setdefault(g, [0, 0])
            cur[0] += sign * n
            cur[1] = self.generation
            if cur[0] <= 0:
                del self._groups[g]
                self._gone[g] = self.generation
            else:
                self._gone.pop(g, None)

    def _track_all(self) -> None:
        if self._groups is not None:
            self._gone.update({g: self.generation for g in self._groups})
            self._groups = {}


def _id_text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _info(reply: Any) -> dict | None:
    """An ``XINFO STREAM`` reply; None for a stream that does not exist, any other error raised."""
    if isinstance(reply, Exception):
        if "no such key" in str(reply).lower():
            return None
        raise reply
    return {(_id_text(k)): v for k, v in reply.items()}


def _added(info: dict | None) -> int | None:
    """``entries-added`` (Redis >= 7: every entry ever added, so a recreated stream starts again), else None."""
    value = (info or {}).get("entries-added")
    return None if value is None else int(value)


def connection_identity(client: Any) -> str | None:
    """Which Redis (and as whom) a client talks to, for sharing a cache between clients; None if unknown."""
    pool = getattr(client, "connection_pool", None)
    kw = getattr(pool, "connection_kwargs", None)
    if isinstance(kw, dict):
        service = getattr(pool, "service_name", None)
        if service:
            where = f"sentinel:{service}"
        elif kw.get("path"):
            where = f"unix:{kw['path']}"
        elif kw.get("host"):
            where = f"tcp:{kw['host']}:{kw.get('port', 6379)}"
        else:
            return None
        return f"{kw.get('username') or ''}@{where}/{kw.get('db', 0)}"
    manager = getattr(client, "nodes_manager", None)
    nodes = getattr(manager, "startup_nodes", None)
    if nodes:
        user = (getattr(manager, "connection_kwargs", None) or {}).get("username") or ""
        return f"{user}@cluster:" + ",".join(sorted(str(n) for n in nodes))
    return None


class HistoryCaches:
    """The history caches of one process, one per (Redis server and user, history key, row limit).

    Clients of the same server share a cache (an agent opens a client per job); a client whose server
    cannot be told (``connection_identity`` None) gets a cache of its own that is not kept.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._caches: dict[tuple, HistoryCache] = {}

    def get(self, client: Any, key: str, *, limit: int | None = None) -> HistoryCache:
        ident = connection_identity(client)
        if ident is None:
            return HistoryCache(key, limit=limit)
        with self._lock:
            cache = self._caches.get((ident, key, limit))
            if cache is None:
                cache = self._caches[(ident, key, limit)] = HistoryCache(key, limit=limit)
            return cache

    def __len__(self) -> int:
        return len(self._caches)

    def clear(self) -> None:
        with self._lock:
            self._caches.clear()


_PROCESS_CACHES = HistoryCaches()


def process_caches() -> HistoryCaches:
    """This process's caches: the point of the cache is that one agent's jobs share it (tests make their own)."""
    return _PROCESS_CACHES
