"""The job model: its states and event kinds, ``JobState`` (the job hash), ``Claim``, event decoding, lost/unknown jobs."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from fstream_provider.bus.keys import Keys
from fstream_provider.authz.outcome import SIGNED_FIELDS
from fstream_provider.authz.signing import JobAuth
from fstream_provider.model.spec import TransferSpec

TERMINAL_STATES = ("succeeded", "failed", "cancelled")
# preempted: stopped at its checkpoint by the agents' scheduler for a job it ranks higher; it runs again
# (from its committed ranges) when the scheduler picks it (issue #11, ``docs/scheduling.md``)
STATES = ("queued", "running", "preempted") + TERMINAL_STATES
EVENT_KINDS = ("queued", "claimed", "interval", "tuning", "file", "log", "error", "retry", "cancel",
               "released", "requeued", "scheduled", "preempted", "deadline", "drained", "done")


class JobLostError(LookupError):
    """A job's state vanished from Redis while someone waited for it (Redis flushed, or restarted without
    its data): the wait ends at once with this reason instead of waiting for ever. ``fstream reconcile``
    reports what is left of it (stream entries without state, destination part files)."""

    def __init__(self, job_id: str, detail: str = "") -> None:
        self.job_id = job_id
        msg = (f"job {job_id}: its state vanished from Redis while waiting for it"
               f"{' (' + detail + ')' if detail else ''}; Redis was flushed or restarted without its data "
               "(not a normal expiry: a running job has no TTL); run `fstream reconcile` to see orphans, "
               "resubmit to finish it (files already committed are skipped)")
        super().__init__(msg)

    def __str__(self) -> str:
        return str(self.args[0])


class JobNotFoundError(KeyError):
    """A job someone wants to follow is not on the bus: an unknown id, expired after its retention, or
    another Redis or namespace."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"job {job_id}: not found (unknown id, expired after its retention, or another "
                         "Redis/namespace)")

    def __str__(self) -> str:
        return str(self.args[0])


def now_text() -> str:
    """The current UNIX time as the scripts store it (``repr`` of a float)."""
    return repr(time.time())


def _num(value: str | None, kind: type = float, default: Any = 0) -> Any:
    if value in (None, ""):
        return default
    try:
        return kind(value)
    except ValueError:
        return default


def _submitter(auth: str | None) -> str | None:
    parsed = JobAuth.from_json(auth)
    return parsed.submitter if parsed else None


@dataclass
class JobState:
    """A job as stored in its Redis hash.

    :param job_id: the job id (16 hex digits).
    :param state: queued, running, preempted, succeeded, failed or cancelled.
    :param attempt: the fencing number: incremented on every claim by a worker.
    :param spec: the transfer specification.
    :param worker: the agent that holds (or last held) the job.
    :param created_at: UNIX time of submission.
    :param updated_at: UNIX time of the last write.
    :param error: the failure or cancellation reason, naming the file/peer and the cause.
    :param result: the transfer result (``TransferResult.to_dict()``) once finished.
    :param idempotency_key: the key given at submission, if any.
    :param deliveries: how many times an agent took the job off the stream.
    :param cancel_requested: a cancel was asked for (the running worker stops).
    :param progress: the latest interval record, while running.
    :param preemptions: how many times the scheduler preempted it.
    :param preempt_reason: why it was last preempted (the scheduler's reason).
    :param submitter: the submitter its signature names (as stored: an agent verifies it before running the job;
        None for an unsigned job).
    :param stored: the hash's fields an agent's outcome signature covers, as stored (``authz.outcome``).
    :param outcome_agent: the trusted agent whose signature a client checked (``authz.outcome.trusted_view``).
    :param unverified: why a client does not believe the stored outcome (state ``unverified``: a success no trusted
        agent signed; or an unsigned failure, whose result is dropped).
    """

    job_id: str
    state: str
    attempt: int
    spec: TransferSpec
    worker: str | None
    created_at: float
    updated_at: float
    error: str | None
    result: dict | None
    idempotency_key: str | None
    deliveries: int
    cancel_requested: bool = False
    progress: dict | None = None
    preemptions: int = 0
    preempt_reason: str | None = None
    submitter: str | None = None
    stored: dict[str, str] | None = field(default=None, repr=False, compare=False)
    outcome_agent: str | None = None
    unverified: str | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @classmethod
    def from_hash(cls, h: dict[str, str]) -> "JobState":
        def js(name: str) -> Any:
            raw = h.get(name)
            return json.loads(raw) if raw else None

        return cls(
            job_id=h["job_id"],
            state=h.get("state", "queued"),
            attempt=_num(h.get("attempt"), int),
            spec=TransferSpec.from_json(h["spec"]),
            worker=h.get("worker") or None,
            created_at=_num(h.get("created_at")),
            updated_at=_num(h.get("updated_at")),
            error=h.get("error") or None,
            result=js("result"),
            idempotency_key=Keys.unowned(h.get("idempotency_key")) or None,  # as given (stored as <submitter>:<key>)
            deliveries=_num(h.get("deliveries"), int),
            cancel_requested=h.get("cancel_requested") == "1",
            progress=js("progress"),
            preemptions=_num(h.get("preemptions"), int),
            preempt_reason=h.get("preempt_reason") or None,
            submitter=_submitter(h.get("auth")),
            stored={name: h.get(name) or "" for name in SIGNED_FIELDS},
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "state": self.state, "attempt": self.attempt, "spec": self.spec.to_dict(),
            "worker": self.worker, "created_at": self.created_at, "updated_at": self.updated_at,
            "error": self.error, "result": self.result, "idempotency_key": self.idempotency_key,
            "deliveries": self.deliveries,
            "cancel_requested": self.cancel_requested, "progress": self.progress,
            "preemptions": self.preemptions, "preempt_reason": self.preempt_reason, "submitter": self.submitter,
            **({"outcome_agent": self.outcome_agent} if self.outcome_agent else {}),
            **({"unverified": self.unverified} if self.unverified else {}),
        }


@dataclass
class Claim:
    """What a worker learns when it takes a stream entry.

    :param outcome: ``claimed`` (run it), ``terminal``/``missing`` (acked, nothing to do),
        ``cancelled`` (cancel was requested before it ran; acked), ``dead`` (dead-lettered; acked).
    :param attempt: the fencing number to pass to every later write (``claimed`` only).
    :param spec: the transfer spec (``claimed`` only; None if the stored spec is not valid: ``message`` says why).
    :param message: reason for the other outcomes.
    :param spec_json: the spec exactly as stored (what the submitter signed).
    :param auth: the submitter's signature envelope as stored (``authz.signing.JobAuth``; "" if unsigned).
    """

    outcome: str
    attempt: int = 0
    spec: TransferSpec | None = None
    message: str = ""
    spec_json: str = ""
    auth: str = ""


def decode_event(entry_id: str, fields: dict[str, str]) -> tuple[str, dict]:
    """``(id, {"kind", "ts", **data})`` from a raw event-stream entry."""
    data: dict[str, Any] = {}
    raw = fields.get("data")
    if raw:
        try:
            loaded = json.loads(raw)
        except ValueError:
            loaded = {"raw": raw}
        data = loaded if isinstance(loaded, dict) else {"value": loaded}
    return entry_id, {**data, "kind": fields.get("kind", ""), "ts": _num(fields.get("ts"))}
