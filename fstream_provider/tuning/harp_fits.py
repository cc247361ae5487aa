"""Fitted HARP group models kept between fits: a group is refitted only when the rows it is fitted on changed.

``HarpOptimizer.fit`` filters the history for one request, groups what is similar into experiment sets and
fits a cubic per group (``harp_model``). Most of that work is the per-group fitting, and between two jobs of
one agent most groups are the same rows: calibration passes and finished transfers do not change, only the
groups of the current time window grow. So a fitted group is kept under a key that says exactly what it was
fitted from (the optimizer's settings that enter a fit, the group's key and a digest of its rows' cc, p, pp
and throughput, in order) and reused while that key recurs. The digest is the group's version: a counter kept
beside the history could not stand in for it, since which rows of a group are similar enough to be fitted on
depends on the request and on the whole history (the similarity normalises every feature by its largest
value), so two jobs can fit different rows of an unchanged group.

Pure: no I/O; the cache's owner (``fstream_provider.bus.history_cache``, one per history in a process)
decides its lifetime. A fit is deterministic, so a reused model is the one a refit would give.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable

from fstream_provider.extras import agent_only

try:
    import numpy as np
except ImportError as exc:  # a provider-only install (issue 39)
    raise agent_only(exc, "HARP's fit cache") from exc

FIT_CACHE_SIZE = 2048  # fitted groups kept (a model is a few kB; a 200,000-row history fits a few hundred)


def rows_digest(rows: Any) -> bytes:
    """What a group's fit depends on in its rows: cc, p, pp and throughput, in order (16 bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for name in ("cc", "p", "pp", "throughput_bps"):
        h.update(np.ascontiguousarray(rows[name].to_numpy(float)).tobytes())
    return h.digest()


class GroupFitCache:
    """Fitted groups by (optimizer settings, group key, rows digest), least recently used dropped first.

    Thread-safe: the jobs of one agent process may fit at once. Two threads missing the same key both fit
    it (same result); the lock is never held while fitting.

    :param maxsize: entries kept.
    """

    def __init__(self, maxsize: int = FIT_CACHE_SIZE) -> None:
        if maxsize < 1:
            raise ValueError(f"fit cache size {maxsize!r}: must be >= 1")
        self.maxsize = maxsize
        self._lock = threading.Lock()
        self._fits: OrderedDict[Hashable, Any] = OrderedDict()
        self.fits = 0  # groups fitted (misses)
        self.hits = 0  # groups reused

    def __len__(self) -> int:
        return len(self._fits)

    def get_or_fit(self, key: Hashable, fit: Callable[[], Any]) -> tuple[Any, bool]:
        """``(fit(), False)`` the first time ``key`` is asked for, ``(the same result, True)`` after that."""
        with self._lock:
            if key in self._fits:
                self._fits.move_to_end(key)
                self.hits += 1
                return self._fits[key], True
        result = fit()
        with self._lock:
            self._fits[key] = result
            self._fits.move_to_end(key)
            self.fits += 1
            while len(self._fits) > self.maxsize:
                self._fits.popitem(last=False)
        return result, False

    def clear(self) -> None:
        with self._lock:
            self._fits.clear()
