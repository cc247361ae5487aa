"""Who submitted a job: an Ed25519 signature over the job as stored, with a timestamp and a nonce (issues 32, 40).

Anyone who can write to the Redis bus can add a job; an agent acts only on jobs a configured submitter signed.
The signature is Ed25519 (``authz.ed25519``), by the submitter's private key, of

    ``["fstream-job-v2", namespace, job id, submitter, timestamp, nonce, key id, spec JSON]``

(a JSON array, so fields cannot run into each other; the spec is the exact JSON string stored on the job, so
nothing is re-serialised before it is checked). Binding the namespace and job id means a signed job cannot be
copied under another id or into another namespace; the timestamp bounds how long a signed job stays valid and
the nonce, recorded by the agent on first use (``fstream_provider.bus.audit``), makes a second delivery of a
copied job a replay. The key id names which of the submitter's public keys signed (several are accepted while a
key is rotated). The signature is the submitter's statement of what it asked for; whether that is allowed is the
agent's policy (``transfer_agent.daemon.authorize``).

Agents hold only submitters' *public* keys, so reading an agent's configuration does not let anyone sign a job.
Issue 32's ``fstream-job-v1`` envelopes (HMAC-SHA256 under a key every agent held) are refused: keeping them
would keep that forgery (``hmac_envelope_submitter``; docs/authorization.md).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fstream_provider.authz.ed25519 import KEY_ID_HEX, SIG_HEX, PrivateKey, PublicKey, ensure_pair, load_private
from fstream_provider.model.statedir import state_dir

VERSION = "fstream-job-v2"
HMAC_VERSION = "fstream-job-v1"  # issue 32's envelope: refused (module docstring)
NONCE_BYTES = 16
SUBMITTER_ID = re.compile(r"[A-Za-z0-9._@-]{1,64}")  # fullmatch: "$" would admit a trailing newline
NONCE = re.compile(r"[0-9a-f]{%d}" % (2 * NONCE_BYTES))


def check_submitter_id(value: str) -> str:
    """A submitter id: 1-64 of letters, digits and ``._@-``; ``ValueError`` naming the value otherwise."""
    if not isinstance(value, str) or not SUBMITTER_ID.fullmatch(value):
        raise ValueError(f"submitter id {value!r}: use 1-64 letters, digits, '.', '_', '@' or '-'")
    return value


@dataclass(frozen=True)
class JobAuth:
    """The authentication envelope stored next to a job's spec (job hash field ``auth``).

    :param submitter: the submitter's id (configured on the agents with its public keys and roots).
    :param ts: UNIX time of signing (seconds).
    :param nonce: random hex, unique per job.
    :param key_id: the id of the submitter's key that signed (``authz.ed25519``: 16 hex digits).
    :param sig: hex Ed25519 signature over the canonical job (module docstring).
    """

    submitter: str
    ts: float
    nonce: str
    key_id: str
    sig: str
    v: str = field(default=VERSION)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> "JobAuth | None":
        """The envelope, or None when the job carries none or it is malformed (both refused by agents; a v1 HMAC
        envelope is None too: ``hmac_envelope_submitter`` tells it apart for the refusal's reason)."""
        if not text:
            return None
        try:
            d = json.loads(text)
            auth = cls(submitter=d["submitter"], ts=float(d["ts"]), nonce=d["nonce"], key_id=d["key_id"],
                       sig=d["sig"], v=d["v"])
        except (ValueError, TypeError, KeyError):
            return None
        fields = (auth.submitter, auth.nonce, auth.key_id, auth.sig)
        if (auth.v != VERSION or not all(isinstance(f, str) for f in fields)
                or not SUBMITTER_ID.fullmatch(auth.submitter) or not NONCE.fullmatch(auth.nonce)
                or not KEY_ID_HEX.fullmatch(auth.key_id) or not SIG_HEX.fullmatch(auth.sig)
                or not math.isfinite(auth.ts)):
            return None  # anything else could not have come from Signer.sign (and must not reach Ed25519 or Redis)
        return auth


def hmac_envelope_submitter(text: str | None) -> str | None:
    """The submitter an issue-32 envelope (``tag``: an HMAC, no ``sig``) claims ("" if it names no valid id), or None
    when ``text`` is not one: agents refuse it by name, so a submitter not yet migrated shows in the audit."""
    try:
        d = json.loads(text or "")
    except ValueError:
        return None
    if not (isinstance(d, dict) and "tag" in d and "sig" not in d):
        return None
    sub = d.get("submitter")
    return sub if isinstance(sub, str) and SUBMITTER_ID.fullmatch(sub) else ""


def canonical(namespace: str, job_id: str, submitter: str, ts: float, nonce: str, key_id: str,
              spec_json: str) -> bytes:
    """The bytes the signature covers: a JSON array, so no field can run into the next whatever it contains."""
    return json.dumps([VERSION, namespace, job_id, submitter, repr(float(ts)), nonce, key_id, spec_json]).encode()


@dataclass(frozen=True)
class Signer:
    """A submitter's identity and private key: signs the jobs it submits.

    :param submitter: its id.
    :param key: its Ed25519 private key (``authz.ed25519.PrivateKey``).
    """

    submitter: str
    key: PrivateKey = field(repr=False)

    def __post_init__(self) -> None:
        check_submitter_id(self.submitter)
        if not isinstance(self.key, PrivateKey):
            raise ValueError(f"submitter {self.submitter!r}: the key must be an Ed25519 private key "
                             f"(authz.ed25519.PrivateKey), not {type(self.key).__name__}; HMAC keys are no longer "
                             "accepted: make a pair with `fstream keys new submitter NAME --out DIR`")

    def __repr__(self) -> str:  # never the key
        return f"Signer(submitter={self.submitter!r}, key_id={self.key.key_id})"

    @classmethod
    def generate(cls, submitter: str) -> "Signer":
        """A signer with a fresh key (tests and benchmarks that give agents ``signer.public``)."""
        return cls(submitter, PrivateKey.generate(submitter))

    @classmethod
    def from_file(cls, submitter: str, key_file: str | os.PathLike[str]) -> "Signer":
        """Load the private key from a 0600 PKCS#8 file (``fstream keys new submitter``); ``KeyFileError`` naming
        the file and the reason (an issue-32 HMAC key file: not a PEM private key)."""
        return cls(submitter, load_private(key_file, f"submitter {submitter!r} private key file", name=submitter))

    @classmethod
    def from_pem(cls, submitter: str, text: str) -> "Signer":
        """A private key given inline (a connection's masked extra): the PEM, or only its base64 body on one line."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        body = text.strip()
        if not body.startswith("-----BEGIN"):
            body = "-----BEGIN PRIVATE KEY-----\n" + body + "\n-----END PRIVATE KEY-----\n"
        try:
            key = serialization.load_pem_private_key(body.encode(), password=None)
        except (ValueError, TypeError):
            key = None
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"submitter {submitter!r}: the inline key is not an Ed25519 private key (PKCS#8 PEM, "
                             "as `fstream keys new submitter` writes); HMAC secrets are no longer accepted")
        return cls(submitter, PrivateKey(key, submitter))

    @property
    def public(self) -> PublicKey:
        return self.key.public

    def sign(self, namespace: str, job_id: str, spec_json: str, *, now: float | None = None,
             nonce: str | None = None) -> JobAuth:
        ts = float(time.time() if now is None else now)
        if not math.isfinite(ts):
            raise ValueError(f"sign: time {ts!r} is not a finite number")
        nonce = nonce or secrets.token_hex(NONCE_BYTES)
        key_id = self.key.key_id
        sig = self.key.sign(canonical(namespace, job_id, self.submitter, ts, nonce, key_id, spec_json))
        return JobAuth(self.submitter, ts, nonce, key_id, sig)


def verify(public_keys: Iterable[PublicKey], auth: JobAuth, namespace: str, job_id: str, spec_json: str) -> bool:
    """True iff ``auth.sig`` is the signature of this job by the key of ``public_keys`` that ``auth.key_id``
    names (a signature naming no key of them: False)."""
    message = canonical(namespace, job_id, auth.submitter, auth.ts, auth.nonce, auth.key_id, spec_json)
    return any(k.key_id == auth.key_id and k.verify(message, auth.sig) for k in public_keys)


LOCAL_SUBMITTER = "local"
ENV_SUBMITTER, ENV_SUBMITTER_KEY = "FSTREAM_SUBMITTER", "FSTREAM_SUBMITTER_KEY_FILE"


def local_key_file() -> Path:
    """The single-user submitter's private key, ``<state dir>/submitter-ed25519.key`` (its public key beside it,
    ``.pub``): ``fstream submit`` signs with it and an agent started with ``--root`` (no policy file) by the same
    user trusts its public key, as submitter ``local``. (Issue 32's ``submitter.key``, an HMAC secret, is unused.)"""
    return state_dir() / "submitter-ed25519.key"


def ensure_local_key() -> Path:
    """Create the local submitter's pair (private 0600, public ``.pub``) if it does not exist; the private path."""
    p = local_key_file()
    ensure_pair(p, LOCAL_SUBMITTER)
    return p


def local_public_key() -> PublicKey:
    """The local submitter's public key (the pair made on first use)."""
    return ensure_pair(local_key_file(), LOCAL_SUBMITTER).public


def resolve_signer(submitter: str | None = None, key_file: str | None = None) -> Signer:
    """The submitter a client signs as: the arguments, else ``$FSTREAM_SUBMITTER`` and
    ``$FSTREAM_SUBMITTER_KEY_FILE`` (a private key file), else the local submitter (its pair made on first use)."""
    submitter = submitter or os.environ.get(ENV_SUBMITTER) or None
    key_file = key_file or os.environ.get(ENV_SUBMITTER_KEY) or None
    if bool(submitter) != bool(key_file) and not (submitter == LOCAL_SUBMITTER and not key_file):
        raise ValueError("submitter: give both the submitter id and its private key file "
                         f"(--submitter and --submitter-key, or ${ENV_SUBMITTER} and ${ENV_SUBMITTER_KEY})")
    if not key_file:
        return Signer.from_file(LOCAL_SUBMITTER, ensure_local_key())
    return Signer.from_file(str(submitter), key_file)
