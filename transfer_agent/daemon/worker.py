"""The ``fstream agent`` daemon: its lifecycle (run/stop, SIGTERM) and main loop; the rooms next to it do the rest.

``intake`` finds the next entry (own pending, reclaimed, new), ``runner`` takes one job to its end,
``heartbeat`` keeps the agent and its job alive in Redis, ``jobrun`` is one job while it runs.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from fstream_provider.bus.audit import AuditLog
from fstream_provider.bus.client import REDIS_UNREACHABLE, connect, describe
from fstream_provider.bus.jobs import JobStore, check_retention
from fstream_provider.bus.keys import JOB_RETENTION_S, Keys
from fstream_provider.bus.server_floor import UnsupportedServerError
from fstream_provider.authz.outcome import OutcomeSigner, default_agent_key, load_signer
from fstream_provider.authz.policy import KeyEntry
from transfer_agent.daemon.authorize import AgentPolicy, Authorizer
from transfer_agent.daemon.heartbeat import HeartbeatMixin
from transfer_agent.daemon.intake import RECLAIM_EVERY_S, IntakeMixin
from transfer_agent.daemon.jobrun import JobRun, PrefixedLog
from fstream_provider.model.retry import RetryPolicy
from transfer_agent.daemon.runner import REDIS_BACKOFF, JobRunnerMixin
from transfer_agent.daemon.scheduled import SchedulingMixin
from transfer_agent import faultpoints
from transfer_agent.service import sdnotify

log = logging.getLogger(__name__)

# An iteration that failed for another reason: 1 s doubling to 30 s (times [0.5, 1]); the loop goes on.
ITERATION_BACKOFF = RetryPolicy(base_s=1.0, cap_s=30.0)


def default_agent_name() -> str:
    """``<host>-<pid>``: unique per process, so a restarted agent's leftovers are reclaimed by heartbeat."""
    return f"{socket.gethostname()}-{os.getpid()}"


SCHEDULERS = ("fifo", "seal", "steal", "seal-share", "steal-share")  # ``-share``: ``tuning.seal_share`` (issue 44)


class Agent(IntakeMixin, SchedulingMixin, JobRunnerMixin, HeartbeatMixin):
    """A transfer agent that consumes FStream jobs from Redis.

    Shape of Rucio's daemons: ``run(once=False)`` / ``stop()``, waits on ``threading.Event``,
    SIGTERM sets the stop event, a heartbeat key with a TTL, exceptions counted and logged with
    context while the loop continues. Data safety (DESIGN.md): a job's stream entry is
    acknowledged only after its transfer returned with every file committed, or after a
    terminal state was recorded; the attempt number from the claim fences every write.

    :param redis_url: where the bus is (``fstream_provider.bus.embedded.resolve_redis_url`` resolves defaults).
    :param name: consumer name in the ``agents`` group and heartbeat key (default ``<host>-<pid>``).
    :param policy: the authority this agent acts within (``transfer_agent.daemon.authorize.AgentPolicy``:
        source roots, destinations, its keyring, the submitters it serves). None: serves nothing (default deny).
    :param secret_file: the keyring's ``default`` key, unless the policy defines one.
    :param heartbeat_ttl: seconds the heartbeat key lives; refreshed every third of it.
    :param claim_idle_ms: a pending job idle this long whose agent's heartbeat is gone is reclaimed.
    :param orphan_idle_ms: a pending job idle this long is reclaimed whatever the heartbeats say
        (``XAUTOCLAIM``; live agents touch their job's entry, so only orphans get this idle).
    :param reclaim_interval: seconds between an idle agent's looks for dead agents' jobs (XPENDING, XAUTOCLAIM)
        and at its own pending list (default: a quarter of ``claim_idle_ms``, at most 5 s; ``intake``).
    :param max_deliveries: a job taken this many times without finishing is dead-lettered next time.
    :param max_retries: in-process retries of retryable failures per claim.
    :param retry_base_s: first backoff delay.
    :param retry_cap_s: backoff cap.
    :param block_ms: how long one read of the stream blocks (also bounds stop latency).
    :param poll_interval: seconds between checks of the job's cancel flag and fence.
    :param flush_interval: seconds between batched event writes.
    :param trim_interval: seconds between trims of acknowledged stream entries.
    :param redis_outage_s: how long a finished job's last writes are retried while Redis is unreachable.
    :param keys: the key schema (namespace).
    :param history: how each job's transfer records HARP's transfer history
        (``sending.history_io.HistoryOptions``; default: recorded in this namespace, named after this agent).
    :param transfer_factory: builds the transfer; default ``transfer_agent.sending.sender.Transfer``.
    :param rng: randomness for backoff jitter.
    :param scheduler: ``fifo`` (jobs in arrival order, one per free agent) or ``seal``/``steal``: every agent
        on the namespace admits jobs to one shared board and runs what SEAL/STEAL gives it
        (``transfer_agent.daemon.scheduled``; all agents of a namespace should use the same); ``seal-share``/
        ``steal-share``: the same, sharing below the knee (``tuning.seal_share``, issue 44).
    :param sched_config: SEAL/STEAL parameters (``tuning.scheduler.SealConfig``; ``steal`` is set from
        ``scheduler``).
    :param sched_interval: seconds between an idle agent's scheduling cycles.
    :param preempt_wait_s: a preempted job stops at the latest this long after it was marked, even if its
        preemptor has not moved bytes yet.
    :param drain_grace: seconds ``drain()`` (SIGTERM) gives the running job before it is cut at its checkpoint.
    :param job_retention_s: how long the jobs this agent finishes (succeeded, failed, refused, cancelled,
        dead-lettered) keep their hash, events and idempotency key (the TTL its terminal writes set).
    :param watchdog: systemd's watchdog (``service.sdnotify.Watchdog``, from ``WatchdogSec=``): pinged from the
        thread that runs ``run()``, on every pass of its loop, while it waits out a backoff, and at each event
        of the job it runs (its interval records, its retries); so a main loop that hangs stops the pings.
    :param signing_key: the agent's Ed25519 private key file for signing job outcomes (``authz.outcome``; issue 40);
        None: ``<state dir>/agent.key``, made with its ``.pub`` on first start (what clients trust by default).
    """

    def __init__(self, redis_url: str, *, name: str | None = None, policy: AgentPolicy | None = None,
                 secret_file: str | None = None,
                 heartbeat_ttl: float = 10, claim_idle_ms: int = 30000, orphan_idle_ms: int | None = None,
                 reclaim_interval: float | None = None,
                 max_deliveries: int = 5, max_retries: int = 3, retry_base_s: float = 1.0,
                 retry_cap_s: float = 60.0, block_ms: int = 1000, poll_interval: float = 1.0,
                 flush_interval: float = 0.2, trim_interval: float = 60.0, redis_outage_s: float = 600.0,
                 keys: Keys | None = None, history: Any = None,
                 transfer_factory: Callable[..., Any] | None = None, rng: random.Random | None = None,
                 scheduler: str = "fifo", sched_config: Any = None, sched_interval: float = 0.5,
                 preempt_wait_s: float = 30.0, drain_grace: float = 30.0,
                 job_retention_s: float = JOB_RETENTION_S, watchdog: sdnotify.Watchdog | None = None,
                 signing_key: str | None = None) -> None:
        if scheduler not in SCHEDULERS:
            raise ValueError(f"agent scheduler {scheduler!r}: must be one of {', '.join(SCHEDULERS)}")
        self.redis_url = redis_url
        self.name = name or default_agent_name()
        policy = policy or AgentPolicy()
        if secret_file and "default" not in policy.keyring:
            policy = dataclasses.replace(policy, keyring={**policy.keyring, "default": KeyEntry(secret_file=secret_file)})
        self.policy = policy
        self.authorizer: Authorizer | None = None
        self.audit: AuditLog | None = None
        self.heartbeat_ttl = heartbeat_ttl
        self.claim_idle_ms = int(claim_idle_ms)
        self.orphan_idle_ms = int(orphan_idle_ms if orphan_idle_ms is not None else 10 * claim_idle_ms)
        self.reclaim_interval = float(reclaim_interval if reclaim_interval is not None
                                      else min(RECLAIM_EVERY_S, self.claim_idle_ms / 4000))
        self.max_deliveries = int(max_deliveries)
        self.max_retries = int(max_retries)
        self.retry_base_s = retry_base_s
        self.retry_cap_s = retry_cap_s
        self.block_ms = int(block_ms)
        self.poll_interval = poll_interval
        self.flush_interval = flush_interval
        self.trim_interval = trim_interval
        self.redis_outage_s = redis_outage_s
        self.keys = keys or Keys()
        if history is None:
            from transfer_agent.sending.history_io import HistoryOptions
            history = HistoryOptions(keys=self.keys, source=self.name)
        self.history = history
        self.transfer_factory = transfer_factory
        self.rng = rng or random.Random()
        self.scheduler = scheduler
        self.sched_config = sched_config
        self.sched_interval = sched_interval
        self.preempt_wait_s = preempt_wait_s
        self.drain_grace = drain_grace
        self.job_retention_s = check_retention(job_retention_s, "agent job_retention_s")
        self.watchdog = watchdog
        self.signing_key = signing_key
        self.outcome_signer: OutcomeSigner | None = None
        self._drain_timer: threading.Timer | None = None
        self._board: Any = None
        self.observer: Any = None  # the agent's metrics (transfer_agent.service.metrics): ``job(spec)`` per job
        self.counters: collections.Counter[str] = collections.Counter()
        self.log = PrefixedLog(log, {"name": self.name})
        self._stop = threading.Event()  # no new job (set by ``drain`` and ``stop``)
        self._halt = threading.Event()  # stop at once (``stop`` only): Redis writes are no longer retried
        self._drain_ends: float | None = None  # a drain's end (monotonic): Redis writes are retried until then
        self._current: JobRun | None = None
        self._client: redis.Redis | None = None
        self._store: JobStore | None = None
        self._autoclaim_cursor = "0-0"
        # when the intake next reads our own pending list / looks for dead agents' jobs (``intake``)
        self._intake_due: dict[str, Any] = {"own": 0.0, "own_dirty": True, "own_from": "0", "reclaim": 0.0}
        self._last_trim = 0.0
        self._started_at = 0.0

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        """Ask the agent to stop: the loop exits, a running transfer is cancelled and its job released."""
        self._stop.set()
        self._halt.set()
        run = self._current
        if run is not None:
            self._hand_back(run, cut=True)

    def drain(self, grace: float | None = None) -> None:
        """Stop gracefully (SIGTERM; issue 30): take no new job; the running one finishes the files it has open
        and starts no other (``sending.drain``); its job is handed back (released) for another agent to send the
        rest, unless everything landed. Files still open ``grace`` seconds on (less a reserve for the checkpoint
        and the release) are cut at their last flushed ranges. A second call stops at once (``stop``)."""
        if self._stop.is_set():
            self.log.warning("asked to stop again while draining: stopping now")
            self.stop()
            return
        grace = self.drain_grace if grace is None else grace
        self._drain_ends = time.monotonic() + grace
        self._stop.set()
        run = self._current
        if run is not None:
            self._hand_back(run, cut=False)
        cut = max(0.0, grace - min(5.0, max(1.0, 0.4 * grace)))  # the reserve: cancel, checkpoint, release, exit
        sdnotify.stopping(f"draining (up to {grace:.0f} s)", grace)
        self.log.info("draining: no new jobs; %s; open files are cut at their checkpoint in %.1f s",
                      f"job {run.job_id} finishes its open files" if run is not None else "no job running", cut)
        self._drain_timer = threading.Timer(cut, self._drain_deadline, args=(run,))
        self._drain_timer.daemon = True
        self._drain_timer.start()

    def _drain_deadline(self, run: JobRun | None) -> None:
        current = self._current
        if current is not None and (run is None or current is run):
            self.log.warning("drain grace over: job %s cut at its checkpoint (its parts resume from their ranges)",
                             current.job_id)
            self._hand_back(current, cut=True)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _alive(self) -> None:
        """Ping systemd's watchdog if one is due (only the loop's own thread counts: ``Watchdog.kick``)."""
        if self.watchdog is not None:
            self.watchdog.kick()

    def _pause(self, seconds: float) -> bool:
        """Wait ``seconds``, or until stopped (True), pinging the watchdog meanwhile: a backoff is not a hang."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            step = left if self.watchdog is None else min(left, max(0.001, self.watchdog.due_in()))
            if self._stop.wait(step):
                return True
            self._alive()
        return self._stop.is_set()

    def _block_ms(self, block_ms: int) -> int:
        """A blocking read's time, cut to when the watchdog's next ping is due (at least 1 ms: 0 blocks for ever)."""
        if self.watchdog is None:
            return block_ms
        return max(1, min(block_ms, int(self.watchdog.due_in() * 1000) + 1))

    def _first_start(self) -> None:
        """Make the jobs stream and its ``agents`` group if missing (the first agent on a bus, or Redis lost its
        data: what ``--check`` said the agent would do), before telling systemd it is ready. Redis unreachable
        now is left to the loop, which retries and makes them on its first read."""
        try:
            self._store.ensure_group()
        except REDIS_UNREACHABLE:
            pass
        except redis.ResponseError as exc:  # e.g. NOPERM: the loop's reads will fail and be logged the same way
            self.log.error("cannot create the consumer group %r on %s: %s", self.keys.jobs_group(),
                           self.keys.jobs_stream(), exc)

    def run(self, once: bool = False) -> None:
        """Consume jobs until ``stop()`` (or SIGTERM); with ``once``, one iteration that re-raises errors."""
        if self.transfer_factory is None:
            from transfer_agent.sending.sender import Transfer

            self.transfer_factory = Transfer
        self._client = connect(self.redis_url)
        if self.outcome_signer is None:  # issue 40: every outcome this agent writes is signed with its own key
            self.outcome_signer = load_signer(self.signing_key, self.name)
        self.log.info("signing job outcomes with key %s (%s)", self.outcome_signer.key.key_id,
                      self.signing_key or default_agent_key())
        self._store = JobStore(self._client, keys=self.keys, retention_s=self.job_retention_s,
                               outcome_signer=self.outcome_signer)
        self.authorizer = Authorizer(self.policy, self._client, self.keys)
        self.audit = AuditLog(self._client, self.keys)
        if self.scheduler != "fifo":
            from fstream_provider.bus.sched_board import SchedBoard
            from fstream_provider.tuning.scheduler import SealConfig

            # the transfers retune live within their pool grants: the cycle does not raise running tasks' cc
            # and "small" is relative to the path (a second at the slower end's known maximum), not 1 GB
            cfg = self.sched_config or SealConfig(small_s=1.0)
            cfg = dataclasses.replace(cfg, steal=self.scheduler.startswith("steal"), resize_running=False)
            self._board = SchedBoard(self._client, self.keys, cfg, share=self.scheduler.endswith("-share"))
        self._started_at = time.time()
        if self.watchdog is not None:
            self.watchdog.own()  # this thread's loop keeps the daemon alive
        self._first_start()
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, lambda *_: self.drain())
        hb_stop = threading.Event()
        heartbeat = threading.Thread(target=self._heartbeat_loop, args=(hb_stop,), name=f"heartbeat-{self.name}",
                                     daemon=True)
        try:
            heartbeat.start()  # beats at once, then every period; Redis being down is retried there and below
            self.log.info("consuming %s on %s; serving %s", self.keys.jobs_stream(), describe(self.redis_url),
                          self.policy.describe())
            sdnotify.ready(f"agent {self.name} consuming {self.keys.jobs_stream()} on {describe(self.redis_url)}")
            if self.watchdog is not None:
                self.log.info("systemd watchdog: %s, from the main loop", self.watchdog.describe())
            if not self.policy.roots.roots:
                self.log.warning("no source roots configured: every job will be refused (default deny); give "
                                 "--root DIR or a policy file")
            failures = 0
            while not self._stop.is_set():
                self._alive()
                faultpoints.stall("agent.loop")
                try:
                    self._iteration()
                    failures = 0
                except REDIS_UNREACHABLE as exc:
                    self.counters["redis_unreachable"] += 1
                    failures += 1
                    if once:
                        raise
                    delay = REDIS_BACKOFF.delay(failures - 1, self.rng)
                    self.log.warning("Redis unreachable (%s); reconnecting in %.1f s", exc, delay)
                    self._pause(delay)
                except UnsupportedServerError:
                    raise  # not an outage: a server below the floor (a failover to an old one); the agent stops
                except Exception:
                    self.counters["exceptions"] += 1
                    failures += 1
                    self.log.exception("iteration failed (%d in a row, %d in total); continuing",
                                       failures, self.counters["exceptions"])
                    if once:
                        raise
                    self._pause(ITERATION_BACKOFF.delay(failures - 1, self.rng))
                if once:
                    break
        finally:
            if self._drain_timer is not None:
                self._drain_timer.cancel()
            hb_stop.set()
            if heartbeat.is_alive():
                heartbeat.join()
            try:
                self._client.delete(self.keys.agent(self.name))
                self._client.srem(self.keys.agents(), self.name)
            except redis.RedisError as exc:
                self.log.warning("could not remove heartbeat key on exit: %s", exc)
            self._client.close()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            self.log.info("stopped: %s", dict(self.counters))

    # ------------------------------------------------------------------ main loop
    def _iteration(self) -> bool:
        if self._board is not None:
            return self._scheduled_iteration()
        # our own pending entries, dead agents' jobs, new jobs (``intake``: the first two when due)
        entries = self._intake(self._block_ms(self.block_ms), count=1)
        for entry_id, fields in entries:
            if self._stop.is_set():
                break
            self._handle(entry_id, fields)
        if time.monotonic() - self._last_trim >= self.trim_interval:
            self._last_trim = time.monotonic()
            self._housekeeping()
        return bool(entries)
