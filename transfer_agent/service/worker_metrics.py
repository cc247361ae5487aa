"""One ``/metrics`` and ``/readyz`` for ``fstream receive --workers N`` (issue 43): the router serves its workers'.

Each worker serves its own metrics on a loopback port (the router starts it with ``--metrics-listen 127.0.0.1:0``
and reads the bound address from the line the worker prints on its stderr, ``WORKER_LINE``; the router forwards
the workers' stderr to its own). When Prometheus scrapes the router's
``--metrics-listen`` address, the router reads every worker's ``/metrics`` at once (each within ``timeout``), adds
the label ``worker="I"`` to every sample and serves them as one exposition, beside its own families
(``fstream_router_*``: connections handed to each worker or closed before a worker took them, restarts, and
whether each worker answered this scrape). A worker that did not answer (dead, or being restarted) has
``fstream_router_worker_up{worker="I"} 0`` and none of its samples in that scrape; a restarted worker's counters
start again from zero, a counter reset that ``rate()`` and ``increase()`` allow for. ``/readyz`` is ready when every
worker's ``/readyz`` is, each worker a check of its own.

The workers' ports are on loopback only and serve what the router serves (read-only, bounded:
``service.endpoint``).
"""

from __future__ import annotations

import re
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from transfer_agent.service.attach import ReceiverService
from transfer_agent.service.health import Check

#: the line a receiver prints on stderr when its metrics are served (``service.attach``): its address, for the router
WORKER_LINE = re.compile(r"^fstream receive: metrics on (http://\S+)/metrics ")
Workers = Callable[[], list[tuple[int, str | None, int]]]  # (index, metrics URL or None, restarts) per worker


def _get(url: str, timeout: float) -> tuple[int, str]:
    """(status, body) of one GET; status 0 and the reason when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(getattr(exc, "reason", exc))


def fetch_all(workers: list[tuple[int, str | None, int]], path: str, timeout: float) -> dict[int, tuple[int, str]]:
    """``path`` from every worker at once: index -> (status, body); a worker without an address: (0, why)."""
    out: dict[int, tuple[int, str]] = {}

    def one(index: int, url: str) -> None:
        out[index] = _get(url + path, timeout)

    threads = []
    for index, url, _ in workers:
        if url is None:
            out[index] = (0, "not started (no metrics address yet)")
            continue
        t = threading.Thread(target=one, args=(index, url), name=f"fstream-scrape-w{index}", daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(timeout + 1.0)
    for index, _url, _ in workers:
        out.setdefault(index, (0, f"no answer within {timeout:g} s"))
    return out


class WorkersCollector:
    """The workers' metrics, labelled by worker, and the router's own (see the module).

    :param workers: the workers now: (index, metrics URL or None, restarts).
    :param router: the running ``receiving.router.Router`` (``handed``, ``dropped``).
    :param timeout: seconds each worker has to answer a scrape.
    """

    def __init__(self, workers: Workers, router: Any, timeout: float = 2.0) -> None:
        self.workers, self.router, self.timeout = workers, router, timeout

    def describe(self) -> list[Metric]:
        return []  # nothing is read from the workers when the collector is registered

    def collect(self) -> Iterator[Metric]:
        workers = self.workers()
        got = fetch_all(workers, "/metrics", self.timeout)
        families: dict[str, Metric] = {}
        up = GaugeMetricFamily("fstream_router_worker_up", "1 when the worker answered this scrape (its samples, "
                               "labelled worker, are in it), else 0.", labels=["worker"])
        for index, _url, _ in workers:
            status, text = got[index]
            ok = status == 200
            if ok:
                try:
                    parsed = list(text_string_to_metric_families(text))
                except ValueError:  # a worker's exposition that does not parse counts as no answer
                    parsed, ok = [], False
                for fam in parsed:
                    out = families.get(fam.name)
                    if out is None:
                        out = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                    for s in fam.samples:
                        out.add_sample(s.name, {**s.labels, "worker": str(index)}, s.value, s.timestamp, s.exemplar)
            up.add_metric([str(index)], 1.0 if ok else 0.0)
        yield from families.values()
        yield up
        handed = CounterMetricFamily("fstream_router_connections_handed", "Connections the router handed to each "
                                     "worker, unread (SCM_RIGHTS).", labels=["worker"])
        restarts = CounterMetricFamily("fstream_router_worker_restarts", "Times the router restarted a worker that "
                                       "had exited.", labels=["worker"])
        for index, _url, n in workers:
            handed.add_metric([str(index)], float(self.router.handed[index]))
            restarts.add_metric([str(index)], float(n))
        yield handed
        yield restarts
        yield CounterMetricFamily("fstream_router_connections_dropped", "Connections the router closed before a "
                                  "worker took them: over the pre-auth caps, past the handshake time, or a worker "
                                  "that could not take them.", value=float(self.router.dropped))


def readiness(workers: Workers, timeout: float = 2.0) -> Callable[[], list[Check]]:
    """The router's ``/readyz``: one check per worker, from that worker's own ``/readyz``."""

    def checks() -> list[Check]:
        now = workers()
        got = fetch_all(now, "/readyz", timeout)
        out = []
        for index, _url, _ in now:
            status, body = got[index]
            lines = body.strip().splitlines()
            detail = "; ".join(lines[1:]) if status in (200, 503) and lines else (body.strip() or f"HTTP {status}")
            out.append(Check(f"worker {index}", status == 200, detail))
        return out
    return checks


class RouterService(ReceiverService):
    """``receive --workers N`` with ``--metrics-listen``: the router serves ``/metrics`` and ``/readyz`` for its
    workers (see the module). ``start()`` serves on ``listen`` (again after a reload moved it).

    :param router: the running ``receiving.router.Router``; :param workers: the workers now (``Workers``).
    """

    command = "receive --workers"

    def __init__(self, args: Any, router: Any, workers: Workers) -> None:
        super().__init__(args)
        self.router, self.workers = router, workers

    def start(self) -> None:  # type: ignore[override]
        if self.listen is None:
            return
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry()
        registry.register(WorkersCollector(self.workers, self.router))
        self._serve(registry, readiness(self.workers))
