"""Who submitted a job: an HMAC tag over the job as stored, with a timestamp and a nonce (issue 32).

Anyone who can write to the Redis bus can add a job; an agent acts only on jobs a configured
submitter signed. The tag is HMAC-SHA256, under the submitter's key, of

    ``["fstream-job-v1", namespace, job id, submitter, timestamp, nonce, spec JSON]``

(a JSON array, so fields cannot run into each other; the spec is the exact JSON string stored on
the job, so nothing is re-serialised before it is checked). Binding the namespace and job id means a signed job cannot be
copied under another id or into another namespace; the timestamp bounds how long a signed job
stays valid and the nonce, recorded by the agent on first use (``fstream_provider.bus.audit``),
makes a second delivery of a copied job a replay. The signature is the submitter's statement of
what it asked for; whether that is allowed is the agent's policy (``transfer_agent.daemon.authorize``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fstream_provider.model.keyfile import read_key_file
from fstream_provider.model.statedir import state_dir

VERSION = "fstream-job-v1"
NONCE_BYTES = 16
SUBMITTER_ID = re.compile(r"[A-Za-z0-9._@-]{1,64}")  # fullmatch: "$" would admit a trailing newline
NONCE = re.compile(r"[0-9a-f]{%d}" % (2 * NONCE_BYTES))
TAG = re.compile(r"[0-9a-f]{64}")


def check_submitter_id(value: str) -> str:
    """A submitter id: 1-64 of letters, digits and ``._@-``; ``ValueError`` naming the value otherwise."""
    if not isinstance(value, str) or not SUBMITTER_ID.fullmatch(value):
        raise ValueError(f"submitter id {value!r}: use 1-64 letters, digits, '.', '_', '@' or '-'")
    return value


@dataclass(frozen=True)
class JobAuth:
    """The authentication envelope stored next to a job's spec (job hash field ``auth``).

    :param submitter: the submitter's id (configured on the agents with its key and roots).
    :param ts: UNIX time of signing (seconds).
    :param nonce: random hex, unique per job.
    :param tag: hex HMAC-SHA256 over the canonical job (module docstring).
    """

    submitter: str
    ts: float
    nonce: str
    tag: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> "JobAuth | None":
        """The envelope, or None when the job carries none or it is malformed (both refused by agents)."""
        if not text:
            return None
        try:
            d = json.loads(text)
            auth = cls(submitter=d["submitter"], ts=float(d["ts"]), nonce=d["nonce"], tag=d["tag"])
        except (ValueError, TypeError, KeyError):
            return None
        fields = (auth.submitter, auth.nonce, auth.tag)
        if (not all(isinstance(f, str) for f in fields) or not SUBMITTER_ID.fullmatch(auth.submitter)
                or not NONCE.fullmatch(auth.nonce) or not TAG.fullmatch(auth.tag) or not math.isfinite(auth.ts)):
            return None  # anything else could not have come from Signer.sign (and must not reach hmac or Redis)
        return auth


def canonical(namespace: str, job_id: str, submitter: str, ts: float, nonce: str, spec_json: str) -> bytes:
    """The bytes the tag covers: a JSON array, so no field can run into the next whatever it contains."""
    return json.dumps([VERSION, namespace, job_id, submitter, repr(float(ts)), nonce, spec_json]).encode()


def _tag(key: bytes, message: bytes) -> str:
    return hmac.new(key, message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Signer:
    """A submitter's identity and key: signs the jobs it submits.

    :param submitter: its id.
    :param key: its secret (at least 16 bytes).
    """

    submitter: str
    key: bytes

    def __post_init__(self) -> None:
        check_submitter_id(self.submitter)
        if len(self.key) < 16:
            raise ValueError(f"submitter {self.submitter!r}: key too short ({len(self.key)} bytes; need 16)")

    def __repr__(self) -> str:  # never the key
        return f"Signer(submitter={self.submitter!r})"

    @classmethod
    def from_file(cls, submitter: str, key_file: str) -> "Signer":
        """Load the key from a 0600 file (``model.keyfile``)."""
        return cls(submitter, read_key_file(key_file, f"submitter {submitter!r} key file"))

    def sign(self, namespace: str, job_id: str, spec_json: str, *, now: float | None = None,
             nonce: str | None = None) -> JobAuth:
        ts = float(time.time() if now is None else now)
        if not math.isfinite(ts):
            raise ValueError(f"sign: time {ts!r} is not a finite number")
        nonce = nonce or secrets.token_hex(NONCE_BYTES)
        return JobAuth(self.submitter, ts, nonce,
                       _tag(self.key, canonical(namespace, job_id, self.submitter, ts, nonce, spec_json)))


def verify(key: bytes, auth: JobAuth, namespace: str, job_id: str, spec_json: str) -> bool:
    """True iff ``auth.tag`` is the tag of this job under ``key`` (constant-time comparison)."""
    expected = _tag(key, canonical(namespace, job_id, auth.submitter, auth.ts, auth.nonce, spec_json))
    return hmac.compare_digest(expected, auth.tag)


LOCAL_SUBMITTER = "local"
ENV_SUBMITTER, ENV_SUBMITTER_KEY = "FSTREAM_SUBMITTER", "FSTREAM_SUBMITTER_KEY_FILE"


def local_key_file() -> Path:
    """The single-user submitter key, ``<state dir>/submitter.key``: ``fstream submit`` signs with it and an
    agent started with ``--root`` (no policy file) by the same user trusts it, as submitter ``local``."""
    return state_dir() / "submitter.key"


def ensure_local_key() -> Path:
    """Create the local submitter key (random, mode 0600) if it does not exist; return its path."""
    p = local_key_file()
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return p
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return p


def resolve_signer(submitter: str | None = None, key_file: str | None = None) -> Signer:
    """The submitter a client signs as: the arguments, else ``$FSTREAM_SUBMITTER`` and
    ``$FSTREAM_SUBMITTER_KEY_FILE``, else the local submitter (its key created on first use)."""
    submitter = submitter or os.environ.get(ENV_SUBMITTER) or None
    key_file = key_file or os.environ.get(ENV_SUBMITTER_KEY) or None
    if bool(submitter) != bool(key_file) and not (submitter == LOCAL_SUBMITTER and not key_file):
        raise ValueError("submitter: give both the submitter id and its key file "
                         f"(--submitter and --submitter-key, or ${ENV_SUBMITTER} and ${ENV_SUBMITTER_KEY})")
    if not key_file:
        return Signer.from_file(LOCAL_SUBMITTER, str(ensure_local_key()))
    return Signer.from_file(str(submitter), key_file)
