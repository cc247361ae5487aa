"""The agent's intake under the shared SEAL/STEAL scheduler (``fstream agent --scheduler seal|steal``).

In place of first come, first served: every entry the agent reads from the jobs stream is admitted to the
board (``fstream_provider.bus.sched_board``); each iteration the idle agent runs one scheduling cycle over
all agents' jobs and runs the job the cycle gives it. The cycle's concurrency is the model's, not a cap on
the transfer: FStream's tuner retunes a running job live within its stream-pool grant, where the paper's
GridFTP could change cc only by a restart, and a cap fixed at the start froze a job that started while
another took the room at one channel (on the WAN: 9 s of tail at 134 Mbit/s, Jain 0.72 between two equal
jobs; BENCHMARKS §10). The job's load in the model is the streams it reports moving data. While a job runs, the
heartbeat reports its progress to the board and watches for a preemption mark: once the preempting job
moved bytes (SEAL §4.5: "the old task keeps running until the new one starts moving data"), or
``preempt_wait_s`` passed, the transfer stops at its checkpoint and the job becomes ``preempted``; a later
cycle runs it again from its committed ranges.

Idle agents are the scheduler's hands: a job that should preempt another starts on an idle agent, so
run more agents than the path should carry jobs at once (``docs/scheduling.md``).
"""

from __future__ import annotations

import socket
import time

from fstream_provider.bus.job_state import TERMINAL_STATES
from fstream_provider.bus.sched_board import Decision
from fstream_provider.model.spec import TransferSpec
from fstream_provider.watch.sources import listing_progress
from transfer_agent.daemon.jobrun import JobRun

# a job whose size cannot be known when it is admitted (remote sources, a stream still being written)
UNKNOWN_SIZE = 1e9


def task_ends(spec: TransferSpec) -> tuple[str, str]:
    """The scheduler's endpoints of a job: this transfer node, and the receiver it sends to."""
    return socket.gethostname(), f"{spec.dest.host}:{spec.dest.port}"


def task_size(spec: TransferSpec) -> tuple[float, str]:
    """Bytes the job will move as its sources stand now, or ``UNKNOWN_SIZE`` and why."""
    from fstream_provider.watch.sources import expand_sources

    if any(s.startswith("sftp://") for s in spec.sources):
        return UNKNOWN_SIZE, "remote sources: size not known before the transfer"
    try:
        size = float(sum(f.size for f in expand_sources(spec.sources, spec.dest.path)))
    except (OSError, ValueError) as exc:
        return UNKNOWN_SIZE, f"sources not readable now ({exc})"
    if spec.watch and size < UNKNOWN_SIZE:
        return UNKNOWN_SIZE, "a stream (--watch): its size is not known yet"
    return size, ""


class SchedulingMixin:
    """Scheduled intake for ``transfer_agent.daemon.worker.Agent`` (uses its ``_board``, ``sched_interval``,
    ``preempt_wait_s``, ``_block_ms`` and what ``IntakeMixin`` and ``JobRunnerMixin`` use)."""

    def _scheduled_iteration(self) -> bool:
        # own pending entries read but not admitted (a crash between), dead agents' jobs, new ones (``intake``)
        entries = self._intake(self._block_ms(max(1, int(self.sched_interval * 1000))), count=50)
        admitted = [self._admit(entry_id, fields) for entry_id, fields in entries]
        if self._stop.is_set():
            return bool(entries)
        # one cycle per turn, facility-wide (``SchedBoard.take_turn``); the agent that just admitted a job
        # cycles at once: the new job may be one to start now
        if not any(admitted) and not self._board.take_turn(self.name, self.sched_interval):
            return bool(entries)
        decision = self._board.plan(self.name)
        self._note_decision(decision)
        if decision.job_id:
            self._board.end_turn(self.name)  # the next idle agent may start the next job without waiting
            self._run_scheduled(decision)
        if time.monotonic() - self._last_trim >= self.trim_interval:
            self._last_trim = time.monotonic()
            self._housekeeping()
        return bool(entries) or bool(decision.job_id)

    def _admit(self, entry_id: str, fields: dict | None) -> bool:
        """Put the entry's job on the board; True if this call admitted it."""
        stream, group = self.keys.jobs_stream(), self.keys.jobs_group()
        job_id = (fields or {}).get("job_id")
        state, worker, created, sid = (self._client.hmget(self.keys.job(job_id), "state", "worker", "created_at",
                                                          "stream_id") if job_id else (None, None, None, None))
        if state and sid and sid != entry_id:
            self._client.xack(stream, group, entry_id)
            self._foreign_entry(job_id, entry_id, sid)
            return False
        if not state or state in TERMINAL_STATES:
            self._client.xack(stream, group, entry_id)
            self.log.info("entry %s: %s; acknowledged", entry_id,
                          f"job {job_id} already {state}" if state else "no job state")
            return False
        if state == "running" and worker and self._client.exists(self.keys.agent(worker)):
            # a live agent without the scheduler runs it: not ours to queue (a dead one's is admitted below;
            # the next claim raises the attempt and fences it out)
            self.log.warning("job %s (entry %s) is running on %s outside the scheduler; left alone", job_id,
                             entry_id, worker)
            return False
        if self._board.task(job_id) is not None:
            self._client.xack(stream, group, entry_id)  # on the board already (as admit would)
            return False
        spec = self._admissible(job_id, entry_id)
        if spec is None:
            return False
        src, dst = task_ends(spec)
        with listing_progress(self._alive):  # sizing lists the sources on the main loop: it feeds the watchdog
            size, why = task_size(spec)  # the spec the policy accepted, not a copy read before or after
        if not self._board.admit(job_id, entry_id, src=src, dst=dst, size=size, klass=spec.priority_class,
                                 arrival=float(created or 0)):
            return False
        self.counters["admitted"] += 1
        self.log.info("job %s: waiting for the scheduler (%s -> %s, %.0f MB, %s)%s", job_id, src, dst,
                      size / 1e6, spec.priority_class, f"; {why}" if why else "")
        return True

    def _admissible(self, job_id: str, entry_id: str) -> TransferSpec | None:
        """The job's spec if the policy accepts it; a job it refuses never reaches the board (whose size
        estimate lists the sources): it is claimed and dead-lettered at once, with the reason (None)."""
        spec_json, auth = self._client.hmget(self.keys.job(job_id), "spec", "auth")
        try:
            spec = TransferSpec.from_json(spec_json or "")
        except ValueError:
            spec = None
        first = self.authorizer.decide(job_id, entry_id, spec, spec_json or "", auth or "")
        if first.accepted:
            return spec
        claim = self._store.claim(job_id, entry_id, worker=self.name, max_deliveries=self.max_deliveries)
        if claim.outcome == "claimed" and self._authorize(job_id, entry_id, claim) is not None:
            # accepted on the second look (a key file fixed meanwhile): give it back for the next admission
            self._store.release(job_id, claim.attempt, f"agent {self.name}: policy decision changed while admitting")
        return None

    def _note_decision(self, d: Decision) -> None:
        """The cycle's decisions this agent wrote: its start, the preemptions for it, changed concurrency."""
        marked = {victim for victim, _ in d.preempted}
        mine = [a for a in d.actions if (a.kind == "start" and a.task == d.job_id)
                or (a.kind == "preempt" and a.by == d.job_id and a.task in marked)]
        for a in mine + d.resized:
            self.log.info("scheduler: %s", a.reason)

    def _run_scheduled(self, d: Decision) -> None:
        job_id = d.job_id
        self._store.append_event(job_id, "scheduled", {"reason": d.reason, "cc": d.cc, "agent": self.name,
                                                       "preempts": [v for v, _ in d.preempted]})
        for victim, why in d.preempted:
            self._store.append_event(victim, "scheduled", {"reason": f"to stop for {job_id} once it moves bytes: "
                                                                     f"{why}", "preempt_by": job_id})
        claim = self._store.claim(job_id, d.entry_id, worker=self.name, max_deliveries=self.max_deliveries)
        if claim.outcome != "claimed":
            self._board.remove(job_id)
            self.counters[f"claim_{claim.outcome}"] += 1
            self.log.info("job %s: %s %s; off the board", job_id, claim.outcome, claim.message)
            return
        decision = self._authorize(job_id, d.entry_id, claim)
        if decision is not None:
            self._run_claimed(job_id, d.entry_id, claim, decision)

    def _sched_beat(self, run: JobRun) -> None:
        """From the heartbeat: the running job's progress to the board, and its preemption when due."""
        board = self._board
        board.report(run.job_id, run.moved, run.rate_bps, run.streams)
        task = board.task(run.job_id)
        by = (task or {}).get("preempt_by")
        if not by or run.preempt_reason or task.get("agent") != self.name:
            return
        rival, moved = board.task(by), board.progress(by)
        if rival is None or rival.get("state") != "running":
            board.cancel_preemption(run.job_id)
            self.log.info("job %s: its preemptor %s stopped before moving data; it keeps running", run.job_id, by)
            return
        if not run.preempt_seen:
            run.preempt_seen = time.monotonic()
        waited = time.monotonic() - run.preempt_seen
        if (moved or {}).get("done", 0) > 0 or waited >= self.preempt_wait_s:
            run.preempt_reason = task.get("preempt_reason") or f"preempted for {by}"
            run.preempt_by = by
            run.stopping = True
            run.cancel.set()
            self.log.info("job %s: stopping at its checkpoint for %s (%s)", run.job_id, by,
                          "it moves data" if waited < self.preempt_wait_s else f"waited {waited:.0f} s")
