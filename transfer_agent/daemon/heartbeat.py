"""The agent's heartbeat: a key with a TTL, the running job's entry kept un-idle, and the fence it reports."""

from __future__ import annotations

import os
import socket
import threading
import time

from fstream_provider.bus.client import REDIS_UNREACHABLE
from transfer_agent.daemon.jobrun import JobRun


class HeartbeatMixin:
    """The heartbeat thread of ``transfer_agent.daemon.worker.Agent`` and what it learns about the running job.

    Uses the agent's ``name``, ``keys``, ``heartbeat_ttl``, ``poll_interval``, ``counters``, ``log``,
    ``_client``, ``_store``, ``_current`` and ``_started_at``.
    """

    def _beat(self) -> None:
        run = self._current
        fields = {"name": self.name, "host": socket.gethostname(), "pid": os.getpid(),
                  "started_at": repr(self._started_at), "seen": repr(time.time()),
                  "job_id": run.job_id if run else "", "attempt": run.attempt if run else 0}
        pipe = self._client.pipeline(transaction=True)
        pipe.hset(self.keys.agent(self.name), mapping=fields)
        pipe.pexpire(self.keys.agent(self.name), int(self.heartbeat_ttl * 1000))
        pipe.sadd(self.keys.agents(), self.name)
        authorizer = getattr(self, "authorizer", None)
        owners = list(authorizer.policy.submitters) if authorizer is not None else []
        if owners:  # whose own indexes hold jobs no agent claimed yet (``JobStore.list`` for viewers; issue 40)
            pipe.sadd(self.keys.job_owners(), *owners)
        pipe.execute()

    def _heartbeat_loop(self, hb_stop: threading.Event) -> None:
        period = min(self.heartbeat_ttl / 3.0, self.poll_interval)
        while True:
            try:
                self._beat()
                run = self._current
                if run is not None and not run.lost:
                    owner, cancel = self._store.touch(run.job_id, run.attempt, run.entry_id, self.name)
                    self._note_fence(run, owner, cancel)
                    if self._board is not None and not run.lost:
                        self._sched_beat(run)
            except REDIS_UNREACHABLE as exc:
                self.counters["heartbeat_errors"] += 1
                self.log.warning("heartbeat: Redis unreachable (%s); retrying in %.1f s", exc, period)
            except Exception:
                self.counters["heartbeat_errors"] += 1
                self.log.exception("heartbeat failed; retrying in %.1f s", period)
            if hb_stop.wait(period):
                return

    def _note_fence(self, run: JobRun, owner: bool, cancel: bool) -> None:
        if not owner and not run.lost:
            run.lost = True
            run.cancel.set()
            if not self._client.exists(self.keys.job(run.job_id)):
                # not superseded: the state is gone (Redis flushed, or restarted without its data)
                self.counters["vanished"] += 1
                self.log.error("job %s attempt %d: its state vanished from Redis (flushed or restarted without "
                               "its data); stopping the transfer (committed files stay, parts stay resumable); "
                               "`fstream reconcile` reports what is left, resubmitting finishes it",
                               run.job_id, run.attempt)
                return
            self.counters["fenced_out"] += 1
            self.log.warning("job %s attempt %d: another agent took it over; stopping without writing",
                             run.job_id, run.attempt)
        elif cancel and not run.cancel_requested:
            run.cancel_requested = True
            run.cancel.set()
            self.log.info("job %s: cancel requested", run.job_id)
