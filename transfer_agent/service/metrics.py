"""Prometheus metrics of ``fstream receive`` and ``fstream agent`` (issue 30, "Prometheus metrics").

Each daemon has its own ``CollectorRegistry`` (never the global one: two daemons, or a daemon and a test,
share a process without sharing series). Metrics are off unless ``--metrics-listen`` is given; nothing here
is imported otherwise.

- The receiver's counters are the ones it already keeps (``Receiver.stats``, its pre-authentication limits
  and deadlines), read when Prometheus scrapes; free space is computed at scrape; its only per-file hook is
  ``on_commit``, which observes each file's seconds from OPEN to commit.
- The agent's come from the events its transfers already emit (``JobRun.add``: ``interval``, ``file``,
  ``tuning``, ``retry``): one call per event, no Redis round trip; the live gauges (throughput, layout, lag)
  are the last interval's, zero once no interval came for ``STALE_S``; the queue depth is read from Redis at
  scrape (``queue_depth``), its job outcomes from the agent's counters.

Every label is bounded (``labels``). ``docs/metrics.md`` lists each metric, its labels and their bounds.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from transfer_agent.service import labels
from transfer_agent.service.queue_depth import QueueDepth

log = logging.getLogger("fstream.service")

# seconds from OPEN to commit (receiver) or as the sender saw it (agent): small files in milliseconds, large
# ones over a WAN in minutes
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
STALE_S = 10.0  # the agent's live gauges read zero once no interval record came for this long


# -- the receiver ----------------------------------------------------------------------------------------
class ReceiverMetrics:
    """The metrics of one ``Receiver``, on a private registry.

    :param receiver: the running receiver (its ``stats``, ``_sessions``, ``_preauth``, ``_deadlines``).
    :param roots: directories whose free space is reported (default: the receiver's root).
    :param registry: where to register (default: a new private ``CollectorRegistry``).
    """

    def __init__(self, receiver: Any, roots: list[str] | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.receiver = receiver
        self.roots = list(roots) if roots else [receiver.root]
        self.registry = registry if registry is not None else CollectorRegistry()
        self.latency = Histogram("fstream_receiver_file_latency_seconds",
                                 "Seconds from a file's OPEN to its commit (verified, durable, renamed) at this "
                                 "receiver, per committed file.", buckets=LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_ReceiverCollector(self))
        receiver.on_commit = self.latency.observe

    def close(self) -> None:
        """Stop timing commits (the receiver keeps running without metrics)."""
        if self.receiver.on_commit == self.latency.observe:
            self.receiver.on_commit = None


class _ReceiverCollector:
    """Reads the receiver's own counters when Prometheus scrapes."""

    def __init__(self, owner: ReceiverMetrics) -> None:
        self.owner = owner

    def collect(self) -> Iterator[Metric]:
        rcv = self.owner.receiver
        stats = rcv.stats
        yield _counter("fstream_receiver_received_bytes_total",
                       "Bytes of file data received and written (resent ranges count again; resumed ones not).",
                       stats.get("bytes_received", 0))
        files = CounterMetricFamily("fstream_receiver_files_total",
                                    "Files that ended at this receiver, by outcome: ok (committed), "
                                    "checksum_mismatch, aborted (by the sender), skipped (already there, same "
                                    "digest), refused (OPEN refused), stale (an older attempt's commit), "
                                    "write_failed, commit_failed.", labels=["outcome"])
        for outcome, key in labels.RECEIVER_OUTCOMES.items():
            files.add_metric([outcome], stats.get(key, 0))
        yield files
        yield _counter("fstream_receiver_checksum_mismatches_total",
                       "Files whose end-to-end checksum did not match at commit (the sender resends them).",
                       stats.get("files_checksum_mismatch", 0))
        yield _counter("fstream_receiver_sessions_total", "Sender sessions opened (authenticated control "
                       "connections).", stats.get("sessions", 0))
        yield _gauge("fstream_receiver_sessions_open", "Sender sessions open now.", len(rcv._sessions))
        yield _counter("fstream_receiver_errors_total", "Connections that ended with an error (before or after "
                       "authentication).", stats.get("errors", 0))
        yield self._refusals(rcv, stats)
        gate = rcv._gate.snapshot()  # issue 43: open parts within the descriptor limit, OPENs waiting for room
        yield _gauge("fstream_receiver_open_parts", "Files open for writing now (each holds two descriptors).",
                     gate["open"])
        yield _gauge("fstream_receiver_open_parts_budget", "Files that may be open at once: from the descriptor "
                     "limit, less a reserve and the descriptors held for anything else.", gate["budget"])
        yield _gauge("fstream_receiver_opens_waiting", "OPENs parked until open files are released "
                     "(backpressure: the senders wait).", gate["parked"])
        yield _gauge("fstream_receiver_sessions_waiting", "Sessions with OPENs parked (a freed slot goes to the one "
                     "holding the fewest open files).", gate["sessions_waiting"])
        yield _counter("fstream_receiver_opens_parked_total", "OPENs that waited for open files to be released.",
                       gate["parked_total"])
        preauth = getattr(rcv, "_preauth", None)
        yield _gauge("fstream_receiver_unauthenticated_connections", "Connections accepted and not yet "
                     "authenticated (capped by --max-unauth).", preauth.total if preauth is not None else 0)
        free = GaugeMetricFamily("fstream_receiver_disk_free_bytes", "Bytes free for this receiver under each "
                                 "configured root (statvfs f_bavail, read at scrape).", labels=["root"])
        for root in self.owner.roots:
            try:
                st = os.statvfs(root)
            except OSError:
                continue  # /readyz names the root and the reason
            free.add_metric([root], st.f_bavail * st.f_frsize)
        yield free

    @staticmethod
    def _refusals(rcv: Any, stats: Any) -> Metric:
        fam = CounterMetricFamily("fstream_receiver_auth_refusals_total",
                                  "Connections refused before or while authenticating, by reason: auth_failed "
                                  "(wrong or missing proof, unknown key, TLS or encryption required), "
                                  "disconnected (the peer hung up first: a sender whose secret this receiver does "
                                  "not know gives up on its proof), protocol_error, "
                                  "handshake_failed (TLS or other), handshake_timeout (--handshake-timeout), "
                                  "too_many_unauthenticated (--max-unauth caps), evicted (by a newcomer from a "
                                  "quieter address).", labels=["reason"])
        counts = dict.fromkeys(labels.PREAUTH_REASONS, 0)
        for key, n in list(stats.items()):
            if key.startswith("preauth_"):
                counts[labels.PREAUTH_KINDS.get(key[len("preauth_"):], "handshake_failed")] += n
        deadlines, preauth = getattr(rcv, "_deadlines", None), getattr(rcv, "_preauth", None)
        counts["handshake_timeout"] = deadlines.expired if deadlines is not None else 0
        if preauth is not None:
            counts["too_many_unauthenticated"], counts["evicted"] = preauth.refused, preauth.evicted
        for reason in labels.PREAUTH_REASONS:
            fam.add_metric([reason], counts[reason])
        return fam


# -- the agent -------------------------------------------------------------------------------------------
class AgentMetrics:
    """The metrics of one agent, on a private registry; the agent calls ``job(spec)`` for each job it runs.

    :param agent: the agent (its ``counters``; set ``agent.observer`` to this object to feed it).
    :param queue: the jobs stream's depth reader (``queue_depth.QueueDepth``), or None.
    :param registry: where to register (default: a new private ``CollectorRegistry``).
    :param path_cap: destinations labelled on their own; more are ``other``.
    """

    def __init__(self, agent: Any = None, queue: QueueDepth | None = None,
                 registry: CollectorRegistry | None = None, path_cap: int = labels.PATH_CAP) -> None:
        self.agent, self.queue = agent, queue
        self.registry = registry if registry is not None else CollectorRegistry()
        self.path = labels.CappedLabel(path_cap)
        reg = self.registry
        self.sent = Counter("fstream_agent_sent_bytes_total", "Bytes sent to receivers, by destination path "
                            "(host:port), counted per interval record (rate() of it is the throughput).",
                            ["path"], registry=reg)
        self.file_bytes = Counter("fstream_agent_file_bytes_total", "Bytes of the files that ended, by "
                                  "destination path and outcome (committed: landed and verified; skipped: "
                                  "already there; failed).", ["path", "outcome"], registry=reg)
        self.files = Counter("fstream_agent_files_total", "Files that ended, by destination path and outcome "
                             "(committed, skipped, failed).", ["path", "outcome"], registry=reg)
        self.retries = Counter("fstream_agent_retries_total", "Retries of a job's transfer after a retryable "
                               "failure, by destination path.", ["path"], registry=reg)
        self.decisions = Counter("fstream_agent_tuning_decisions_total", "Layout changes the tuners made, by "
                                 "tuner and reason kind (the first word of the reason).", ["tuner", "reason"],
                                 registry=reg)
        self.latency = Histogram("fstream_agent_file_latency_seconds", "Seconds from a file's OPEN to its commit "
                                 "as the sender saw it, per committed file.", buckets=LATENCY_BUCKETS, registry=reg)
        self.live: dict[str, Any] = {"at": -float("inf"), "bps": 0.0, "lag": 0.0, "clusters": {}}
        self.observer_errors = 0
        reg.register(_AgentCollector(self))

    def job(self, spec: Any) -> "JobObserver":
        """The observer of one job's events (``JobRun.observe``)."""
        from fstream_provider.tuning.registry import TUNERS

        tuner = getattr(spec, "tuner", "")
        return JobObserver(self, self.path(labels.destination(spec)), tuner if tuner in TUNERS else labels.OTHER)

    def close(self) -> None:
        if self.queue is not None:
            self.queue.close()


class JobObserver:
    """One job's events into its agent's metrics: one call per event, children of each labelled metric
    resolved once. Never raises into the transfer (a failure is logged once and counted)."""

    def __init__(self, owner: AgentMetrics, path: str, tuner: str) -> None:
        self.owner, self.path, self.tuner = owner, path, tuner
        self.sent = owner.sent.labels(path)
        self.retries = owner.retries.labels(path)
        self._files: dict[str, tuple[Any, Any]] = {}
        self._kinds: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, kind: str, data: dict) -> None:
        try:
            if kind == "file":
                self._file(data)
            elif kind == "interval":
                self._interval(data)
            elif kind == "tuning":
                self._decision(data)
            elif kind == "retry":
                self.retries.inc()
        except Exception:  # noqa: BLE001 - metrics must never fail a transfer
            self.owner.observer_errors += 1
            if self.owner.observer_errors == 1:
                log.exception("metrics: an event could not be counted (%s); counting goes on", kind)

    def _file(self, data: dict) -> None:
        outcome = labels.one_of(data.get("status"), labels.AGENT_OUTCOMES)
        pair = self._files.get(outcome)
        if pair is None:
            with self._lock:
                pair = self._files.setdefault(outcome, (self.owner.files.labels(self.path, outcome),
                                                        self.owner.file_bytes.labels(self.path, outcome)))
        pair[0].inc()
        pair[1].inc(max(0, int(data.get("size") or 0)))
        seconds = data.get("seconds")
        if seconds is not None and outcome == "committed":
            self.owner.latency.observe(float(seconds))

    def _interval(self, data: dict) -> None:
        self.sent.inc(max(0, int(data.get("bytes") or 0)))
        clusters: dict[str, tuple[int, int, int]] = {}
        for name, c in (data.get("clusters") or {}).items():
            label = labels.one_of(name, labels.CLUSTERS)
            cc, p, pp = int(c.get("cc") or 0), int(c.get("p") or 0), int(c.get("pp") or 0)
            old = clusters.get(label, (0, 0, 0))
            clusters[label] = (old[0] + cc, max(old[1], p), max(old[2], pp))
        lag = data.get("lag") or {}
        self.owner.live = {"at": time.monotonic(), "bps": float(data.get("throughput_bps") or 0.0) / 8,
                           "lag": float(lag.get("oldest_s") or 0.0), "clusters": clusters}

    def _decision(self, data: dict) -> None:
        kind = labels.reason_kind(str(data.get("reason") or ""))
        child = self._kinds.get(kind)
        if child is None:
            with self._lock:
                child = self._kinds.setdefault(kind, self.owner.decisions.labels(self.tuner, kind))
        child.inc()


class _AgentCollector:
    """The agent's live gauges, job outcomes and queue depth, when Prometheus scrapes."""

    def __init__(self, owner: AgentMetrics) -> None:
        self.owner = owner

    def collect(self) -> Iterator[Metric]:
        owner = self.owner
        live = owner.live
        fresh = time.monotonic() - live["at"] < STALE_S
        yield _gauge("fstream_agent_throughput_bytes_per_second", "Bytes per second the running job moved in its "
                     "last interval (0 when no job reported for 10 s).", live["bps"] if fresh else 0.0)
        yield _gauge("fstream_agent_streaming_lag_seconds", "Age of the oldest file a streaming (watch) job has "
                     "seen and not yet landed (0 when none).", live["lag"] if fresh else 0.0)
        layout = {"channels": ("fstream_agent_channels", "Channels (cc) open per file-size cluster."),
                  "streams": ("fstream_agent_streams_per_channel", "TCP streams per channel (p) per cluster."),
                  "pipelining": ("fstream_agent_pipelining_depth", "Files pipelined per channel (pp) per cluster.")}
        fams = {k: GaugeMetricFamily(name, text, labels=["cluster"]) for k, (name, text) in layout.items()}
        for cluster in (*labels.CLUSTERS, labels.OTHER):
            cc, p, pp = live["clusters"].get(cluster, (0, 0, 0)) if fresh else (0, 0, 0)
            fams["channels"].add_metric([cluster], cc)
            fams["streams"].add_metric([cluster], p)
            fams["pipelining"].add_metric([cluster], pp)
        yield from fams.values()
        jobs = CounterMetricFamily("fstream_agent_jobs_total", "Jobs this agent finished, by outcome (succeeded, "
                                   "failed, cancelled; refused by its policy; preempted by the scheduler).",
                                   labels=["outcome"])
        counters = getattr(owner.agent, "counters", {}) or {}
        for outcome in labels.JOB_OUTCOMES:
            jobs.add_metric([outcome], counters.get(f"jobs_{outcome}", 0))
        yield jobs
        if owner.queue is not None:
            depth = owner.queue.read()
            if depth is not None:
                yield _gauge("fstream_agent_jobs_waiting", "Jobs in the Redis jobs stream not yet delivered to any "
                             "agent (the consumer group's lag; read at scrape, cached 1 s).", depth[0])
                yield _gauge("fstream_agent_jobs_pending", "Jobs delivered to an agent and not yet acknowledged "
                             "(running, or left by a dead agent).", depth[1])
            yield _counter("fstream_agent_queue_read_errors_total", "Reads of the queue depth from Redis that "
                           "failed or timed out (the last value is kept).", owner.queue.errors)


def _counter(name: str, text: str, value: float) -> Metric:
    fam = CounterMetricFamily(name, text)
    fam.add_metric([], value)
    return fam


def _gauge(name: str, text: str, value: float) -> Metric:
    return GaugeMetricFamily(name, text, value=value)
