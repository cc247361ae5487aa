"""The sender's stream grant from its (source, destination) pool (ADAPT, ``fstream_provider.bus.pools``).

``PoolLease`` asks the pool for a grant before the first channel opens, then every ``period`` asks again
(an update request: Fig. 3 of the ADAPT report asks PROVISION each round; a round here is
``UPDATE_S``, the FStream tuner's shortest profiling interval, or ttl/3 if shorter) which also renews the lease,
and gives every stream back when the transfer ends. The tuner is wrapped in
``fstream_provider.tuning.granted.Granted`` and so never opens more streams than ``streams``.
If Redis is unreachable the grant already held stays in force until its lease would lapse; after that
the transfer runs on one stream rather than unbounded (fail closed: the pool is a promise to others).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from transfer_agent.errors import FStreamError

log = logging.getLogger("fstream.sender")

# Seconds between update requests. At ttl/3 (10 s) a transfer that (re)started took 30 s to grow from
# s_i = 4 to 16 streams by s_u = 4, and a burst with preemptions ran at 0.82 of the path (BENCHMARKS §10).
UPDATE_S = 2.0


class PoolLease:
    """One transfer's grant on one pool, kept fresh by a daemon thread.

    :param pools: a ``StreamPools``.
    :param source: this side's name in the pool's pair.
    :param destination: the receiver's name in the pair.
    :param client: this transfer's name in the pool (unique per running transfer).
    :param on_change: called with (streams, reason) when the grant changes (events, logs).
    """

    def __init__(self, pools: Any, source: str, destination: str, client: str,
                 on_change: Callable[[int, str], None] | None = None, klass: str = "") -> None:
        self.pools, self.source, self.destination, self.client = pools, source, destination, client
        self.on_change = on_change
        self.klass = klass  # the job's priority class: interactive requests may take streams from batch ones
        self.want: Callable[[], int] | None = None  # the streams the bounded tuner asks for (``bounded``)
        self.period = max(0.2, min(UPDATE_S, pools.ttl_ms / 1000 / 3))
        self.streams = 0
        self._valid_until = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def current(self) -> int:
        """The streams the tuner may use now (at least one: a transfer always moves)."""
        if time.monotonic() > self._valid_until:
            return 1
        return max(1, self.streams)

    def start(self) -> "PoolLease":
        self._ask()
        self._thread = threading.Thread(target=self._run, name=f"fstream-pool-{self.client}", daemon=True)
        self._thread.start()
        return self

    def _ask(self) -> None:
        try:
            g = self.pools.provision(self.source, self.destination, self.client, klass=self.klass,
                                     want=self.want() if self.want is not None else 0)
        except Exception as exc:  # noqa: BLE001 - Redis down: keep what the lease still covers
            log.warning("pool %s -> %s: request failed (%s); keeping %d stream(s) while the lease lasts",
                        self.source, self.destination, exc, self.streams)
            return
        self._valid_until = time.monotonic() + self.pools.ttl_ms / 1000
        if g.streams != self.streams:
            self.streams = g.streams
            if self.on_change is not None:
                self.on_change(g.streams, g.reason)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._ask()

    def close(self) -> None:
        """Stop renewing and give every stream back to the pool."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        try:
            self.pools.give_back(self.source, self.destination, self.client)
        except Exception as exc:  # noqa: BLE001 - the lease lapses on its own
            log.warning("pool %s -> %s: give back failed (%s); the lease lapses by itself", self.source,
                        self.destination, exc)


def open_lease(spec: Any, redis: Any, keys: Any, client: str,
               on_event: Callable[[str, dict], None]) -> PoolLease | None:
    """The transfer's lease when its spec asks for the pool (``pool``), else None (``keys``: the namespace)."""
    if not getattr(spec, "pool", False):
        return None
    if redis is None:
        raise FStreamError("pool: sharing the stream pool needs a Redis (--redis or $FSTREAM_REDIS_URL)")
    import socket

    from fstream_provider.bus.pools import StreamPools

    dest = spec.dest
    source = socket.gethostname()  # the transfer node: every agent on it shares one pool per destination

    def changed(streams: int, why: str) -> None:
        log.info("pool %s -> %s:%s: %d stream(s) granted (%s)", source, dest.host, dest.port, streams, why)
        on_event("log", {"level": "info", "message": f"pool grant: {streams} stream(s) ({why})"})

    return PoolLease(StreamPools(redis, keys), source, f"{dest.host}:{dest.port}", client, changed,
                     klass=getattr(spec, "priority_class", "")).start()


def bounded(tuner: Any, lease: PoolLease | None) -> Any:
    """``tuner`` bounded by the lease's streams (once), or unchanged without a lease."""
    from fstream_provider.tuning.granted import Granted

    if lease is None or isinstance(tuner, Granted):
        return tuner
    granted = Granted(tuner, lease.current)
    lease.want = lambda: granted.wanted
    return granted
