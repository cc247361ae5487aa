"""What a transfer reads from and writes to Redis for its tuners: profiling history and HARP's transfer history.

Both are optimisations: a Redis error here is logged once and never fails a transfer.

* Profiling history (``Keys.profiling``): the ``fstream`` tuner's best layouts per size class and file type.
* Transfer history (``Keys.history``, issue #10): ``HistoryRecorder`` turns every interval record of the
  sender into one ``HistoryRow`` per cluster (cc, p, pp and the cluster's own throughput, its chunk from
  the average size of the files the sender gave it) and appends them in batches; the ``harp`` tuner and
  the HARP-seeded ``fstream`` start read it back (``BackgroundHistory``, while the transfer starts), through the
  process's ``bus.history_cache``: the first job of a process parses the history, later ones read only what
  was appended since, and reuse the HARP group models fitted on rows that did not change.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fstream_provider.bus.keys import HISTORY_MAXLEN, Keys
from fstream_provider.bus.transfer_history import HISTORY_MAX_AGE_S, TransferHistory
from fstream_provider.tuning.base import PathInfo
from fstream_provider.tuning.harp_history import HistoryRow, chunk_of

HISTORY_LOAD_LIMIT = 200_000  # newest rows a tuner reads (a million JSON rows would take seconds to parse)


@dataclass(frozen=True)
class HistoryOptions:
    """How a transfer keeps HARP's transfer history.

    :param record: append every interval as history rows (``--no-history`` turns it off).
    :param max_rows: entries kept in Redis (``--history-max-rows``).
    :param max_age_s: entries older than this are trimmed (``--history-max-age``).
    :param keys: the key schema (namespace) the rows and the profiling history live in.
    :param source: this side's name in the rows (default: the host name).
    """

    record: bool = True
    max_rows: int = HISTORY_MAXLEN
    max_age_s: float = HISTORY_MAX_AGE_S
    keys: Keys = field(default_factory=Keys)
    source: str = ""


def load_profiling(redis: Any, log: logging.Logger) -> Any:
    """The profiling history from Redis (None on error)."""
    try:
        from fstream_provider.bus.profiling_store import load_history
        return load_history(redis)
    except Exception as exc:  # noqa: BLE001 - history is an optimisation, never a reason to fail
        log.warning("profiling history not loaded: %s", exc)
        return None


def save_profiling(redis: Any, history: Any, log: logging.Logger) -> None:
    """Persist what the tuner learned (profiling history) so a later stream starts near it."""
    try:
        from fstream_provider.bus.profiling_store import save_history
        n = save_history(redis, history)
        if n:
            log.info("saved %d profiling record(s) to Redis", n)
    except Exception as exc:  # noqa: BLE001 - losing history only costs a slower start next time
        log.warning("profiling history not saved: %s", exc)


#: a job that moves in less than this at the path's rate is over before a cold process has parsed its history
#: (issue 42: 200,000 rows and scikit-learn's import take a cold agent 1-2 CPU-s; 32 cold agents each starting one
#: for a 64 KiB job held a 2-core facility's p99 submit -> first byte at 3.5 s). Its tuner starts from the heuristic.
HISTORY_WORTH_S = 2.0


def background(redis: Any, log: logging.Logger, options: HistoryOptions | None, files: list, streaming: bool,
               path: PathInfo) -> "BackgroundHistory | None":
    """The transfer history for a tuner that reads it, or None when the job cannot last long enough to use it: a
    fixed set of files that moves in under ``HISTORY_WORTH_S`` at the path's rate (a stream may grow: loaded)."""
    if not streaming:
        total = sum(f.size for f in files)
        seconds = total * 8 / max(path.bandwidth_bps, 1.0)
        if seconds < HISTORY_WORTH_S:
            log.info("transfer history not loaded: %d file(s), %d bytes, move in %.3f s at %.3g bit/s, less than "
                     "the %.0f s a cold load takes; the tuner starts from the heuristic",
                     len(files), total, seconds, path.bandwidth_bps, HISTORY_WORTH_S)
            return None
    return BackgroundHistory(redis, log, options)


class BackgroundHistory:
    """Load the transfer history (and import the Optimizer's libraries) in a thread while the transfer starts.

    pandas takes about half a second to import on a small machine (scikit-learn, 1.6 s more, is no longer
    imported: ``harp_cubic``) and a large history a while to parse; HARP's start does not need either, so the transfer starts at once and the tuner
    picks the history up when it is ready. Calling the object returns the DataFrame, or None while loading.

    The rows come from the process's history cache (``bus.history_cache``, imported in the thread: it needs
    pandas): the first job parses the newest ``limit`` entries, a later job only the entries appended since
    (its thread is done in milliseconds). ``fit_cache`` is that history's cache of fitted HARP groups, which
    the tuners pick up from here once the history is loaded (None before).

    :param redis: a ``redis.Redis``.
    :param log: where the load is reported.
    :param options: namespace.
    :param limit: newest rows to load.
    :param caches: the ``history_cache.HistoryCaches`` to use (default: the process's).
    """

    def __init__(self, redis: Any, log: logging.Logger, options: HistoryOptions | None = None,
                 limit: int = HISTORY_LOAD_LIMIT, caches: Any = None) -> None:
        keys = (options or HistoryOptions()).keys
        store = TransferHistory(redis, keys=keys)
        self.cache: Any = None
        self.fit_cache: Any = None
        self._frame: Any = None
        self._done = threading.Event()
        try:
            self.rows = min(store.count(), limit)
        except Exception as exc:  # noqa: BLE001 - HARP falls back to the heuristic without history
            log.warning("transfer history not loaded: %s", exc)
            self.rows = 0
        if self.rows == 0:
            self._done.set()
            return

        def load() -> None:
            try:
                from fstream_provider.bus.history_cache import process_caches

                self.cache = (caches if caches is not None else process_caches()).get(redis, store.key, limit=limit)
                r = self.cache.refresh(redis)
                self._frame = self.cache.frame()
                self.fit_cache = self.cache.fit_cache
                if r.reloaded:
                    log.info("transfer history: %d row(s) loaded in %.2f s", len(self._frame), r.seconds)
                else:
                    log.info("transfer history: %d row(s) cached, %d new and %d dropped read in %.3f s",
                             len(self._frame), r.new, r.dropped, r.seconds)
                import fstream_provider.tuning.harp_model  # noqa: F401 - numpy and pandas, before the tuner needs them
            except Exception as exc:  # noqa: BLE001 - HARP falls back to the heuristic without history
                log.warning("transfer history not loaded: %s", exc)
            finally:
                self._done.set()

        threading.Thread(target=load, name="fstream-history-load", daemon=True).start()

    @property
    def ready(self) -> bool:
        return self._done.is_set()

    def __call__(self) -> Any:
        return self._frame if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> Any:
        self._done.wait(timeout)
        return self()


class HistoryRecorder:
    """Turn the sender's interval records into ``HistoryRow``s and append them in batches.

    :param redis: a ``redis.Redis``.
    :param options: limits, namespace and source name.
    :param path: the path as the tuners were told it (bandwidth, RTT, TCP buffer).
    :param destination: the receiver's ``host:port``.
    :param job_id: the job (groups rows of one transfer's cluster).
    :param log: where a failure is reported (once).
    :param flush_every_s: write at most this often while the transfer runs.
    """

    def __init__(self, redis: Any, options: HistoryOptions, *, path: PathInfo, destination: str, job_id: str,
                 log: logging.Logger, flush_every_s: float = 5.0) -> None:
        self.store = TransferHistory(redis, keys=options.keys, max_rows=options.max_rows,
                                     max_age_s=options.max_age_s)
        self.source = options.source or os.uname().nodename
        self.path, self.destination, self.job_id, self.log = path, destination, job_id, log
        self.flush_every_s = flush_every_s
        self._files: dict[str, list[int]] = {}  # cluster -> [files, bytes]
        self._rows: list[HistoryRow] = []
        self._last_flush = time.monotonic()
        self._failed = False
        self.written = 0

    def note_files(self, cluster: str, size: int) -> None:
        c = self._files.setdefault(cluster, [0, 0])
        c[0] += 1
        c[1] += size

    def interval(self, rec: dict) -> None:
        """One interval record of the sender (``Transfer._record``)."""
        dt = float(rec.get("dt") or 0.0)
        if dt <= 0:
            return
        now = time.time()
        for name, c in (rec.get("clusters") or {}).items():
            files, nbytes = self._files.get(name, (0, 0))
            if not files or int(c.get("cc", 0)) < 1:
                continue
            avg = nbytes / files
            self._rows.append(HistoryRow(
                source=self.source, destination=self.destination, bandwidth_bps=self.path.bandwidth_bps,
                rtt_s=self.path.rtt_s, tcp_buffer=self.path.tcp_buffer,
                chunk=chunk_of(max(avg, 1.0), self.path.bdp_bytes), avg_file_size=avg, file_count=files,
                cc=int(c["cc"]), p=max(1, int(c.get("p", 1))), pp=max(0, int(c.get("pp", 0))),
                throughput_bps=max(0.0, float(c.get("throughput_bps", 0.0))), time=now, duration_s=dt,
                group=f"{self.job_id}:{name}", kind="sample" if name.endswith(".sample") else "interval",
                # channels without a queued file each: the rate says how fast files came, not what cc/p/pp can do
                source_limited=int(c.get("pending_files", 0)) < int(c["cc"]), background_bps=math.nan))
        if time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def flush(self) -> int:
        """Append what is buffered; a Redis error is logged once and the rows are dropped."""
        rows, self._rows = self._rows, []
        self._last_flush = time.monotonic()
        if not rows:
            return 0
        try:
            n = self.store.append(rows)
            self.written += n
            return n
        except Exception as exc:  # noqa: BLE001 - history never fails a transfer
            if not self._failed:
                self._failed = True
                self.log.warning("transfer history not recorded (%d row(s) dropped): %s", len(rows), exc)
            return 0
