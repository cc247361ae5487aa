"""A transfer: finds files, runs the tuner every interval, keeps the channel pool at the tuned layout.

``Transfer(spec, ...).run()`` is what ``fstream send`` and the agent's job worker both call.
It records one interval record per ``sample_interval_s`` (what ``--json`` reports as
``intervals``, what progress bars and the job's event stream show), consults the tuner every
``profile_interval_s`` (and when new files arrive), and applies the tuner's layout without
stopping the transfer. A retryable failure of the session (network, stall) reconnects and
resumes: the receiver's recorded ranges mean only missing bytes are sent again.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

from fstream_provider.tuning.pacing import paced_block_size
from fstream_provider.tuning.base import ClusterLayout, ClusterStats, Observation, PathInfo, Suggestion, Tuner
from fstream_provider.tuning.registry import make_tuner, tuner_info
from transfer_agent.sending import drain as draining, grant, history_io, intervals, watch_window
from transfer_agent.sending.progress import DeadlineNews, LiveProgress
from transfer_agent.sending.result import TransferResult
from transfer_agent.sending.session_retry import SessionRetries
from transfer_agent.sending.file_retry import RetryQueue, left_over, retry_delay
from transfer_agent.wire.auth import TLSConfig, load_secret
from transfer_agent.sending.channel import MAX_SEALED_BLOCK
from transfer_agent.sending.channels import ChannelPool
from transfer_agent.sending.connector import Connector
from transfer_agent.sending.control import ControlSession
from transfer_agent.sending.host import raise_fd_limit, tcp_buffer_max
from transfer_agent.sending.inflight import InFlight, public_checksum
from transfer_agent.errors import (AuthError, CancelledError, FStreamError, SourceRefusedError,
                                   SourceVanishedError, StallError)
from fstream_provider.watch.landed_journal import journal_path
from fstream_provider.watch.source_watcher import SourceWatcher
from fstream_provider.watch.sources import SrcFile, expand_sources

if TYPE_CHECKING:  # pydantic only where a spec is built from the model (``fstream send`` checks it without)
    from fstream_provider.model.spec import TransferSpec
    from fstream_provider.model.spec_plain import PlainSpec

log = logging.getLogger("fstream.sender")

EventCallback = Callable[[str, dict], None]
# The one retry policy (fstream_provider.model.retry): files (``file_retry``), sessions (``session_retry``).
DEFAULT_BANDWIDTH, PROFILE_EVERY_S = 1e9, 10.0  # a tuner naming no interval (observe_every_s) is consulted every 10 s


class Transfer:
    """Run one transfer described by a ``TransferSpec``.

    :param spec: what to send, where, and how to tune.
    :param job_id: job id (fences stale attempts at the receiver); random if not given.
    :param attempt: attempt number of the job.
    :param on_event: ``callback(kind, data)`` for "interval", "tuning", "file", "log".
    :param cancel: set to stop the transfer (files in flight stay resumable).
    :param drain: set to drain it: open files finish, no new file starts (``sending.drain``).
    :param redis: optional Redis client for the tuners' history (profiling and HARP transfer history).
    :param tuner: a tuner object to use instead of the one the spec names (tests, simulator).
    :param stall_timeout: length of the progress window: if, with work outstanding, fewer than ``progress_floor_bps``
        were moved over it and no file was committed, the session is declared stalled (retryable) despite a trickle.
    :param progress_floor_bps: the progress floor in bits/s (default 64 kbit/s).
    :param max_session_retries: reconnect-and-resume attempts for retryable session failures of one outage when
        the spec gives no budget (``max_attempts``, ``retry_for_s``); a watch stream then retries while it runs.
    :param history: whether and how transfer history rows are recorded (``history_io.HistoryOptions``).
    :param feed: new files from a channel's ``.transfer()`` instead of scanning ``spec.sources``: ``poll()``,
        ``pending_candidates`` (more may come) and ``wake`` (set to an event it sets on news); ``flow.transfer.FlowFeed``.
    """

    def __init__(self, spec: TransferSpec | PlainSpec, *, job_id: str | None = None, attempt: int = 1,
                 on_event: EventCallback | None = None, cancel: threading.Event | None = None,
                 redis: Any = None, log: logging.Logger | None = None, tuner: Tuner | None = None,
                 stall_timeout: float = 60.0, progress_floor_bps: float = 64e3,
                 max_session_retries: int = 4, history: history_io.HistoryOptions | None = None,
                 feed: Any = None, guard: Any = None, drain: threading.Event | None = None) -> None:
        self.spec, self.guard = spec, guard  # guard: an agent's policy (``daemon.authorize.Guard``)
        self.job_id = job_id or uuid.uuid4().hex
        self.attempt = attempt
        self.on_event = on_event or (lambda kind, data: None)
        self.cancel, self.drain, self._held = cancel or threading.Event(), drain or threading.Event(), None
        self.redis, self.log = redis, log or logging.getLogger("fstream.sender")
        self._tuner = tuner
        self.stall_timeout, self.progress_floor_bps = stall_timeout, progress_floor_bps
        self.max_session_retries = max_session_retries
        self.session_retries = SessionRetries(spec, attempts=max_session_retries + 1, log=self.log,
                                              on_event=self.on_event, stop=self.cancel)
        self.result = TransferResult(job_id=self.job_id, tuner=tuner.name if tuner else spec.tuner,
                                     checksum="xxh3_128" if spec.verify else "off (sizes only)")
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._outstanding = 0
        self._last_progress = 0.0
        self._files_total = 0
        self._history_saved_at = time.monotonic()
        self._watcher: SourceWatcher | None = None
        self._feed = feed
        if feed is not None:
            feed.wake = self._wake
        self.history = history or history_io.HistoryOptions()
        self._recorder: history_io.HistoryRecorder | None = None
        self._lease: grant.PoolLease | None = None  # the stream pool's grant (spec.pool), opened by run()
        self.live = LiveProgress.of(spec, fed=feed is not None)
        self._deadline_news = DeadlineNews(spec.on_deadline_risk, self.log, self.on_event)

    # -- public --------------------------------------------------------------------------------
    def wake(self) -> None:
        """Look at ``cancel`` and ``drain`` now rather than at the loop's next tick (up to 0.5 s later)."""
        self._wake.set()

    def run(self) -> TransferResult:
        t0 = time.monotonic()
        self._t0 = t0
        raise_fd_limit()
        spec = self.spec
        dest = spec.dest
        secret = load_secret(spec.secret_file) if spec.secret_file else None
        tls = TLSConfig(spec.tls_cert, spec.tls_key, spec.tls_ca) if spec.tls_cert else None
        if tls is not None and not spec.tls_ca:
            raise FStreamError("TLS: --tls-ca is required with --tls-cert (the receiver's certificate must be checked)")
        ssl_ctx = tls.client_context() if tls else None
        if secret is None and ssl_ctx is None:
            raise AuthError("no shared secret and no TLS certificates: pass --secret-file (or --tls-*)")
        if getattr(spec, "encrypt", False) and secret is None:
            raise AuthError("--encrypt needs a shared secret (--secret-file); with TLS alone the channel is "
                            "already encrypted")
        watcher = self._feed or (SourceWatcher(spec.sources, dest.path, journal=journal_path(spec.sources, spec.destination))
                                 if spec.watch else None)
        self._watcher = watcher
        initial = [] if watcher else expand_sources(spec.sources, dest.path)
        if watcher:
            initial = watch_window.take(watcher, 0, spec, first=True)[0]
        pending: list[SrcFile] = list(initial)
        self._files_total = len(pending)
        self._public_algo = "xxh3_128" if spec.public_checksum else None
        hasher = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fstream-hash")
        try:
            self._lease = grant.open_lease(spec, self.redis, self.history.keys, self.job_id, self.on_event)
            try:
                pending = self.session_retries.call(  # within the spec's budget; a watch stream while it runs
                    lambda: self._session(dest.host, dest.port, secret, ssl_ctx, hasher, pending, watcher),
                    landed=lambda: self.result.verified_files + self.result.skipped_files)
                if self._held is not None:
                    self.result.error = draining.drained_error(len(self._held), self.result.verified_files)
                    self.result.retryable = True
            except FStreamError as exc:
                if self.cancel.is_set() and exc.retryable and not isinstance(exc, CancelledError):
                    raise CancelledError("transfer cancelled") from None  # cancelled while waiting to reconnect
                raise
        except Exception as exc:  # noqa: BLE001 - the result must say what happened, whatever it was
            err = exc if isinstance(exc, FStreamError) else FStreamError(f"internal error: {type(exc).__name__}: {exc}")
            if not isinstance(exc, FStreamError):
                self.log.exception("transfer failed unexpectedly")
            self.result.error = err.describe()
            self.result.cancelled = isinstance(err, CancelledError)
            self.result.retryable = err.retryable and not self.result.cancelled
            if self.result.cancelled and self.drain.is_set():  # a drain cut at the grace: handed back, not failed
                self._held = (self._held or []) + list(pending)
                self.result.error = draining.drained_error(len(self._held), self.result.verified_files) + "; cut"
            else:
                for sf in pending:
                    self._fail_file(sf, err)
        finally:
            self._lease = self._lease and self._lease.close()  # every stream back to the pool
            self._save_history()
            hasher.shutdown(wait=False, cancel_futures=True)
            if watcher:
                watcher.close()
            r = self.result
            r.seconds = time.monotonic() - t0
            r.throughput_bps = r.bytes * 8 / r.seconds if r.seconds > 0 else 0.0
            r.files = r.verified_files + r.skipped_files + r.failed_files
            r.ok = r.error is None and r.failed_files == 0
            r.settle_retryable()
        return self.result

    # -- one session ---------------------------------------------------------------------------
    def _session(self, host: str, port: int, secret: bytes | None, ssl_ctx: Any, hasher: Any,
                 files: list[SrcFile], watcher: SourceWatcher | None) -> list[SrcFile]:
        """Run one connected session; return files still pending when it ends (empty on success)."""
        sid = uuid.uuid4().hex
        encrypt = bool(getattr(self.spec, "encrypt", False))
        hello = {"session": sid, "job": self.job_id, "attempt": self.attempt}
        connector = Connector(host, port, secret, ssl_ctx, hello, encrypt=encrypt, timeout=self.spec.connect_timeout_s,
                              key_id=self.spec.key)
        retry_files = RetryQueue()

        def finished(f: InFlight) -> None:
            self._on_finished(f, pool, retry_files)

        control = ControlSession(connector, finished, hasher, verify=self.spec.verify, public_algo=self._public_algo,
                                 guard=self.guard)
        if self.spec.verify:
            self.result.checksum = control.algo
        block_size = min(self.spec.block_size, MAX_SEALED_BLOCK) if encrypt else self.spec.block_size
        pool, self._block_size = ChannelPool(control, connector, block_size), block_size
        # a scan finds a vanished temp name's final name; a feed's caller hears of the vanished file
        pool.on_unopenable = lambda sf, exc: self._on_unopenable(sf, exc, watching=watcher not in (None, self._feed))
        try:
            rtt = self.spec.rtt_s or control.rtt()
            self.result.rtt_s = rtt
            path = PathInfo(bandwidth_bps=self.spec.bandwidth_bps or DEFAULT_BANDWIDTH, rtt_s=max(rtt, 1e-4),
                            tcp_buffer=self.spec.tcp_buffer or tcp_buffer_max(), max_cc=self.spec.max_cc)
            info, redis = tuner_info(self.spec.tuner), self.redis
            tuner = self._tuner or make_tuner(
                self.spec.tuner, path=path, cc=self.spec.cc, p=self.spec.p, pp=self.spec.pp,
                target_throughput_bps=self.spec.target_throughput_bps, start_time=time.time(), variant=self.spec.tuner_variant(),
                history=history_io.load_profiling(redis, self.log) if redis and info.uses_history else None,
                transfer_history=(history_io.background(redis, self.log, self.history, files, watcher is not None, path)
                                  if redis and info.uses_transfer_history else None))
            if self.spec.deadline is not None and getattr(tuner, "deadline_status", "none") == "none":
                from fstream_provider.tuning.deadline import Deadline  # only a transfer with a deadline runs it
                wall_t0 = time.time() - (time.monotonic() - self._t0)  # observations count from _t0
                tuner = Deadline(tuner, self.spec.deadline - wall_t0, bandwidth_bps=self.spec.bandwidth_bps,
                                 eta=self.live.eta)  # the live ETA's estimator, fed by the interval records
            tuner = grant.bounded(tuner, self._lease)
            if redis is not None and self.history.record and self._recorder is None:
                self._recorder = history_io.HistoryRecorder(redis, self.history, path=path, destination=f"{host}:{port}",
                                                            job_id=self.job_id, log=self.log)
            self._tuner = tuner
            self.result.tuner = getattr(tuner, "name", self.spec.tuner)
            self._loop(tuner, pool, control, files, retry_files, watcher)
        except BaseException as exc:
            pool.shutdown(graceful=False)
            cause = control.failure(exc)  # the receiver's stated reason over what it caused here
            unfinished = control.close(graceful=False)
            self.result.bytes_sent += sum(f.bytes_sent for f in unfinished)  # every session's bytes count
            files[:] = left_over([f.sf for f in unfinished], list(retry_files), pool.drain())
            with self._lock:
                self._outstanding = 0
            if cause is not exc:
                raise cause from exc
            raise
        pool.shutdown(graceful=True)
        control.close(graceful=True)
        return []

    def _loop(self, tuner: Tuner, pool: ChannelPool, control: ControlSession, files: list[SrcFile],
              retry_files: RetryQueue, watcher: SourceWatcher | None) -> None:
        spec = self.spec
        start = time.monotonic()
        self._last_progress = start
        self.session_retries.connected()
        window: collections.deque[tuple[float, int]] = collections.deque()
        last_sample = last_profile = start
        last_bytes, last_cluster = pool.counters()
        prof_bytes, prof_cluster = last_bytes, dict(last_cluster)
        next_scan = start + spec.interval_s
        last_new = start
        pending_reason, self._paced, self._last_busy = "", intervals.PacedCount(pool), False
        watcher = self._hold_back_if_draining(pool, files, retry_files, watcher)  # drained before it started
        self._add_files(tuner, pool, files)
        pending_reason = self._retune(tuner, pool, self._observe(tuner, pool, start, 0.0, 0, {}, files))
        files.clear()
        while True:
            if self.cancel.is_set():
                raise CancelledError("transfer cancelled")
            if control.failed.is_set():
                raise control.error or FStreamError("session failed", retryable=True)
            watcher = self._hold_back_if_draining(pool, files, retry_files, watcher)  # open files finish
            now = time.monotonic()
            if retry_files:
                with self._lock:  # files refused for now wait out their backoff, soonest first (O(log n) each)
                    again = retry_files.due(now)
                if again:
                    pool.add_files(again)
            new: list[SrcFile] = []
            if watcher is not None and (now >= next_scan or watcher is self._feed):
                new, wait = watch_window.take(watcher, self._outstanding, spec)  # a window of a backlog
                next_scan = now + wait
                if new:
                    last_new = now
                    self._files_total += len(new)
                    self._add_files(tuner, pool, new)
            total, per_cluster = pool.counters()
            window.append((now, total))
            while len(window) > 2 and window[1][0] <= now - self.stall_timeout:
                window.popleft()
            if (window[0][0] <= now - self.stall_timeout
                    and (total - window[0][1]) * 8 < self.progress_floor_bps * self.stall_timeout):
                stalled_since = max(self._last_progress, window[0][0])  # commits also count as progress
            else:
                stalled_since = now
            if now - last_sample >= spec.sample_interval_s:  # paced bytes count as earned (intervals.PacedCount)
                earned = self._paced.count(total, floor=last_bytes)
                self._record(now, now - last_sample, earned - last_bytes, per_cluster, last_cluster, pool, pending_reason)
                pending_reason = ""
                last_sample, last_bytes, last_cluster = now, earned, per_cluster
            every = min(spec.profile_interval_s or PROFILE_EVERY_S, getattr(tuner, "observe_every_s", None) or PROFILE_EVERY_S)
            if (new or now - last_profile >= every) and self._held is None:  # a draining transfer keeps its layout
                obs = self._observe(tuner, pool, now, now - last_profile, total - prof_bytes,
                                    {c: b - prof_cluster.get(c, 0) for c, b in per_cluster.items()}, new)
                reason = self._retune(tuner, pool, obs)
                pending_reason = reason or pending_reason
                last_profile, prof_bytes, prof_cluster = now, total, dict(per_cluster)
            with self._lock:
                busy = self._outstanding > 0
            if not busy and not retry_files:
                if watcher is None:
                    break
                idle = watcher is self._feed or spec.idle_exit_s is not None and now - last_new >= spec.idle_exit_s
                if idle and not watcher.pending_candidates:  # a feed ends when its channel has ended
                    break
                if spec.until is not None and time.time() >= spec.until:
                    break
            elif now - stalled_since >= self.stall_timeout:
                moved = (total - window[0][1]) * 8 / self.stall_timeout
                raise StallError(f"stalled: {moved / 1e3:.1f} kbit/s over the last {self.stall_timeout:.0f} s with "
                                 f"files outstanding, below the progress floor of "
                                 f"{self.progress_floor_bps / 1e3:.0f} kbit/s; the path or the receiver is stuck")
            deadline = min(last_sample + spec.sample_interval_s, last_profile + every,
                           next_scan if watcher else float("inf"))
            self._wake.wait(max(0.01, min(0.5, deadline - time.monotonic())))
            self._wake.clear()
        now = time.monotonic()
        total, per_cluster = pool.counters()
        # the last record is the verdict: one taken with commits outstanding said "on-track" for a landed transfer
        if total != last_bytes or not self.result.intervals or pending_reason or self._last_busy:
            self._record(now, max(now - last_sample, 1e-6), max(0, total - last_bytes), per_cluster, last_cluster,
                         pool, pending_reason)

    def _hold_back_if_draining(self, pool: ChannelPool, files: list[SrcFile], retry_files: RetryQueue,
                               watcher: SourceWatcher | None) -> SourceWatcher | None:
        """Once the transfer is asked to drain (``sending.drain``): hold back every file not opened yet (those not
        yet given to the pool, queued in it, or waiting out a retry), stop polling the sources; the watcher to poll.

        Called before the session's first files go to the pool (then nothing is opened) and on every pass of the
        loop (then what is open finishes and nothing new starts)."""
        if not self.drain.is_set() or self._held is not None:
            return watcher
        queued = draining.hold_back(pool, retry_files, self._lock)  # files already counted as outstanding
        with self._lock:
            self._outstanding -= len(queued)
        self._held = list(files) + queued
        files.clear()
        self.on_event("log", {"level": "info", "message": f"draining: {len(self._held)} file(s) held back"})
        return None

    # -- files ---------------------------------------------------------------------------------
    def _add_files(self, tuner: Tuner, pool: ChannelPool, files: list[SrcFile]) -> None:
        if self.guard is not None:  # a listed file outside the job's roots (a link pointing out) fails, unread
            files = self.guard.admit(files, lambda sf, exc: self._fail_file(sf, SourceRefusedError(str(exc))))
        for sf in files:
            sf.cluster = tuner.cluster_of(sf.info)
            if self._recorder is not None:
                self._recorder.note_files(sf.cluster, sf.info.size)
        with self._lock:
            self._outstanding += len(files)
        self.live.added(files)
        pool.add_files(files)

    def _on_finished(self, f: InFlight, pool: ChannelPool, retry_files: RetryQueue) -> None:
        sf = f.sf
        self._last_progress = time.monotonic()
        self.result.resumed_bytes += f.resumed
        self.result.bytes_sent += f.bytes_sent
        if f.outcome == "retry":
            delay = retry_delay(sf, f.error)
            # also while the session is torn down: to the next session, never "failed" without a reason (tests/faults)
            if delay is not None:
                sf.retry_at = time.monotonic() + delay
                with self._lock:
                    retry_files.append(sf)
                self._wake.set()
                if f.error is not None:
                    self.log.warning("retrying %s in %.2f s: %s", sf.rel, delay, f.error)
                return
            outcome = "failed"
        else:
            outcome = f.outcome
        with self._lock:
            self._outstanding -= 1
        self.live.landed(sf, ok=outcome in ("committed", "skipped"), sent=outcome != "skipped")
        if outcome in ("committed", "skipped") and isinstance(self._watcher, SourceWatcher):
            self._watcher.landed(sf)  # a restarted stream skips it without asking the receiver
        if outcome == "committed":
            self.result.verified_files += 1
            self.result.bytes += sf.size
            digest = public_checksum(f, self.result.checksum, self._public_algo)
            self.result.add_landed({"path": sf.rel, "source": sf.src, "size": sf.size, "status": "committed", **digest})
            self.on_event("file", {"path": sf.rel, "source": sf.src, "size": sf.size, "status": "committed",
                                   "resumed": f.resumed, "seconds": round(time.monotonic() - f.opened_at, 6), **digest})
        elif outcome == "skipped":
            self.result.skipped_files += 1
            digest = public_checksum(f, self.result.checksum, self._public_algo)
            self.result.add_landed({"path": sf.rel, "source": sf.src, "size": sf.size, "status": "skipped", **digest})
            self.on_event("file", {"path": sf.rel, "source": sf.src, "size": sf.size, "status": "skipped",
                                   "reason": "already at destination with the same size and checksum", **digest})
        else:
            self._fail_file(sf, f.error or FStreamError("failed"))
        if not self._outstanding:  # the loop wakes for the last file (it ends then), not for each: it looks at its
            self._wake.set()       # deadlines anyway, and a pass of it per file cost the sender ~35 µs a file

    def _on_unopenable(self, sf: SrcFile, err: FStreamError, watching: bool) -> None:
        with self._lock:
            self._outstanding -= 1
        if watching and isinstance(err, SourceVanishedError):
            # write-then-rename producers: the temp name vanished; its final name is picked up by a scan
            self.log.info("%s", err)
            self.on_event("log", {"level": "info", "message": str(err)})
            with self._lock:
                self._files_total -= 1
        else:
            self._fail_file(sf, err)
        self._wake.set()

    def _fail_file(self, sf: SrcFile, err: FStreamError) -> None:
        reason = err.describe() if isinstance(err, FStreamError) else str(err)
        self.result.failed_files += 1
        self.result.failures.append({"path": sf.src, "dest": sf.rel, "reason": reason,
                                     "retryable": bool(getattr(err, "retryable", False))})
        self.on_event("file", {"path": sf.rel, "source": sf.src, "size": sf.size, "status": "failed", "reason": reason})
        self.log.error("%s: %s", sf.src, reason)

    # -- tuning and records --------------------------------------------------------------------
    def _observe(self, tuner: Tuner, pool: ChannelPool, now: float, dt: float, nbytes: int,
                 cluster_bytes: dict[str, int], new: list[SrcFile]) -> Observation:
        pend = pool.pending()
        active = pool.active_layout()
        working = pool.working_channels()  # a cluster whose channels sit idle must not look busy
        clusters = {}
        for c in set(pend) | set(cluster_bytes) | set(active):
            b = cluster_bytes.get(c, 0)
            clusters[c] = ClusterStats(bytes=b, throughput_bps=b * 8 / dt if dt > 0 else 0.0,
                                       active_channels=working.get(c, 0),
                                       pending_files=pend.get(c, (0, 0))[0], pending_bytes=pend.get(c, (0, 0))[1])
        with self._lock:
            done = self._outstanding == 0
        return Observation(t=now - self._t0, dt=dt, bytes=nbytes, throughput_bps=nbytes * 8 / dt if dt > 0 else 0.0,
                           new_files=[sf.info for sf in new], clusters=clusters,
                           layouts=[ClusterLayout(c, *v) for c, v in active.items()], done=done)

    def _retune(self, tuner: Tuner, pool: ChannelPool, obs: Observation) -> str:
        try:
            tuner.update(obs)
            s: Suggestion = tuner.suggest()
        except Exception as exc:  # noqa: BLE001 - a tuner's bug must not lose a running transfer
            if not pool.channels:
                raise
            self.log.exception("tuner %s failed at %.1f s; keeping the current layout", tuner.name, obs.t)
            return f"tuner error, layout kept: {type(exc).__name__}: {exc}"
        if not s.changed and pool.channels:
            return ""
        layouts = {l.cluster: (max(1, min(l.cc, self.spec.max_cc)), max(1, l.p), max(0, l.pp))
                   for l in s.layouts if l.cc > 0}
        for c, (n, _b) in pool.pending().items():
            if n and c not in layouts and c not in s.held:  # never strand files a tuner did not hold on purpose
                self.log.warning("tuner %s gave no layout for cluster %r with %d files; using cc=1 p=1 pp=4",
                                 getattr(tuner, "name", "?"), c, n)
                layouts[c] = (1, 1, 4)
        if not layouts:
            return ""
        rates = {l.cluster: getattr(l, "rate_bps", None) for l in s.layouts if l.cluster in layouts}
        pool.set_rates(rates)  # before channels open, so their first blocks are paced too
        pool.block_size = paced_block_size(self._block_size, pool.bucket.rate_bps if pool.bucket else None)
        self._paced.watch()
        done = pool.apply(layouts, halt=lambda: self.cancel.is_set() or self.drain.is_set())
        decision = {"t": round(obs.t, 3), "reason": s.reason,
                    "layouts": {c: {"cc": v[0], "p": v[1], "pp": v[2], "rate_bps": rates.get(c)}
                                for c, v in layouts.items()}, **done}
        self.result.tuning.append(decision)
        self.log.info("tuning at %.1f s: %s -> %s", obs.t, s.reason,
                      ", ".join(f"{c}: cc={v[0]} p={v[1]} pp={v[2]}" for c, v in layouts.items()))
        self.on_event("tuning", decision)
        if time.monotonic() - self._history_saved_at > 10.0:  # long streams persist as they learn
            self._history_saved_at = time.monotonic()
            self._save_history()
        return s.reason

    def _save_history(self) -> None:
        """Persist what the tuner learned (profiling history) and the transfer history rows not yet written."""
        if self._recorder is not None:
            self._recorder.flush()
        history = getattr(self._tuner, "history", None) if tuner_info(self.spec.tuner).uses_history else None
        if self.redis is not None and history is not None:
            history_io.save_profiling(self.redis, history, self.log)

    def _record(self, now: float, dt: float, nbytes: int, per_cluster: dict[str, int], last_cluster: dict[str, int],
                pool: ChannelPool, reason: str) -> None:
        with self._lock:
            outstanding = self._outstanding
        tuned = bool(self.result.tuning) and self.result.tuning[-1]["reason"] == reason  # a tuning event said it
        rec = intervals.interval_record(pool, t=now - self._t0, dt=dt, nbytes=nbytes, per_cluster=per_cluster,
                                        last_cluster=last_cluster, outstanding=outstanding, result=self.result,
                                        files_total=self._files_total, target_bps=self.spec.target_throughput_bps,
                                        reason=reason, tuning_event=tuned)
        if self._watcher is not None:  # streaming: what the last scan of the sources cost
            rec["scan_seconds"] = round(self._watcher.last_scan_seconds, 6)
            rec["scan_listed"] = self._watcher.last_scan_listed
        self.result.intervals.append(rec)
        status = getattr(self._tuner, "deadline_status", None)
        rec.update(self.live.fields(rec, busy=outstanding > 0, deadline=status))
        self._last_busy = outstanding > 0
        if self._recorder is not None:
            self._recorder.interval(rec)
        self.on_event("interval", rec)
        self._deadline_news(status, self.spec.deadline)
