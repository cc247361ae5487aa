"""What an agent may do for whom (issue 32): default deny, signed jobs, source roots, destinations, keys by id.

An agent is a deputy with broad read access (a service account that can read every instrument's data)
and keys that open remote receivers. ``Authorizer.decide`` makes sure it acts only within the authority it
was configured with (``fstream_provider.authz.policy``), for a submitter who signed the job
(``fstream_provider.authz.signing``), before a byte of the job's sources is read:

1. the stored spec is a valid transfer spec;
2. it carries a signature envelope, from a submitter this agent knows, whose Ed25519 signature, by one of the
   submitter's public keys this agent holds (the envelope names it by id), verifies over the job as
   stored (namespace, job id, spec JSON; issue 32's HMAC envelopes are refused by name), not signed in the
   future beyond ``clock_skew``, whose nonce no other job used (``fstream_provider.bus.audit.first_use``),
   and, when it is first taken, signed within ``max_job_age`` (a redelivery of a job taken in time — a retry,
   a reclaim, a resumed preemption — passes);
3. it names no file on the agent's host for keys (``secret_file``, ``tls_*``): keys are referred to by id,
   and the id must be one the submitter may use and the agent holds;
4. its destination matches the agent's and the submitter's destination rules (receiver and path prefix); when
   neither lists any, nothing is allowed (default deny; only the single-user ``--root`` agent sends anywhere);
5. every source lies within the agent's roots and the submitter's (``storage.contain.SourceRoots``, after
   resolving ``..`` and symbolic links). While the job runs, each listed file's directory (and each listed
   link) is resolved again, and each file is opened beneath its root as a filesystem boundary
   (``storage.contain.Guard``: no link, mount, hard link or non-regular file is opened), so nothing swapped
   in after this decision is read.

A refusal names the job, the submitter and the reason; the runner dead-letters the job with it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from fstream_provider.bus.audit import first_use
from fstream_provider.bus.client import REDIS_UNREACHABLE
from fstream_provider.bus.keys import Keys
from fstream_provider.authz.ed25519 import PublicKey, load_public, parse_public
from fstream_provider.model.keyfile import KeyFileError
from fstream_provider.authz.policy import KeyEntry, PolicyError, PolicyFile, as_list, load_policy
from fstream_provider.authz.signing import JobAuth, hmac_envelope_submitter, verify
from fstream_provider.model.spec import Destination, TransferSpec
from fstream_provider.model.spec_fields import KEY_FILE_FIELDS
from fstream_provider.model.units import parse_duration
from transfer_agent.errors import AuthError, RefusedError
from transfer_agent.storage.contain import Guard, OutsideRootsError, SourceRoots
from transfer_agent.wire.auth import load_secret


@dataclass(frozen=True)
class DestRule:
    """A receiver (host and port) and a path prefix under its root that jobs may write to."""

    host: str
    port: int
    prefix: tuple[str, ...]

    @classmethod
    def parse(cls, url: str) -> "DestRule":
        d = Destination.parse(url)
        return cls(d.host, d.port, tuple(p for p in d.path.split("/") if p))

    def allows(self, dest: Destination) -> bool:
        parts = tuple(p for p in dest.path.split("/") if p)
        if ".." in parts or "." in parts:
            return False
        return (dest.host, dest.port) == (self.host, self.port) and parts[:len(self.prefix)] == self.prefix

    def __str__(self) -> str:
        return f"fstream://{self.host}:{self.port}/{'/'.join(self.prefix)}"


@dataclass(frozen=True)
class SubmitterGrant:
    """A configured submitter: its public keys (several while one is rotated) and what it may ask for (None /
    empty: the agent's own bounds)."""

    submitter: str
    public_keys: tuple[PublicKey, ...]
    roots: SourceRoots | None = None
    destinations: tuple[DestRule, ...] = ()
    keys: frozenset[str] = frozenset({"default"})


@dataclass(frozen=True)
class AgentPolicy:
    """The authority an agent was configured with. ``AgentPolicy()`` serves nothing (default deny).

    :param roots: the source trees it reads.
    :param destinations: receivers and prefixes it may send to (empty: only those a submitter's entry lists).
    :param keyring: key id -> the files of that key, from the agent's own configuration.
    :param submitters: submitter id -> its grant.
    :param max_job_age_s: a job signed longer ago than this is refused.
    :param clock_skew_s: a job signed further than this in the future is refused.
    :param any_destination: the single-user agent (``local``): no destination rules, the job's key decides.
    """

    roots: SourceRoots = field(default_factory=lambda: SourceRoots.of([]))
    destinations: tuple[DestRule, ...] = ()
    keyring: dict[str, KeyEntry] = field(default_factory=dict)
    submitters: dict[str, SubmitterGrant] = field(default_factory=dict)
    max_job_age_s: float = 7 * 86400.0
    clock_skew_s: float = 300.0
    any_destination: bool = False

    @classmethod
    def from_file(cls, path: str) -> "AgentPolicy":
        try:
            return cls.from_model(load_policy(path))
        except KeyFileError as exc:  # a public key file that cannot be read: name the policy file too
            raise PolicyError(f"policy file {path}: {exc}") from None

    @classmethod
    def from_model(cls, p: PolicyFile) -> "AgentPolicy":
        subs = {}
        for name, s in p.submitters.items():
            subs[name] = SubmitterGrant(name, _public_keys(name, as_list(s.public_key), as_list(s.public_key_file)),
                                        SourceRoots.of(s.roots or p.agent.roots, allow_hardlinks=s.allow_hardlinks)
                                        if s.roots or s.allow_hardlinks is not None else None,
                                        tuple(DestRule.parse(d) for d in s.destinations), frozenset(s.keys))
        return cls(SourceRoots.of(p.agent.roots, allow_hardlinks=p.agent.allow_hardlinks),
                   tuple(DestRule.parse(d) for d in p.agent.destinations),
                   p.keyring(), subs, parse_duration(p.agent.max_job_age), parse_duration(p.agent.clock_skew))

    @classmethod
    def local(cls, roots: list[Any], secret_file: Any = None, *, submitter: str | None = None,
              public_key: PublicKey | str | os.PathLike[str] | None = None,
              allow_hardlinks: bool = False) -> "AgentPolicy":
        """One submitter's agent (``fstream agent --root``): ``roots``, the ``default`` key (``secret_file``), any
        destination that key opens, and the submitter (default: the local one, whose pair is made on first use in
        the state dir, ``authz.signing.local_key_file``) with ``public_key`` (a ``PublicKey`` or its file);
        ``allow_hardlinks``: send files with several hard links (``--allow-hardlinks``; the policy's ``[agent]``)."""
        from fstream_provider.authz.signing import LOCAL_SUBMITTER, local_public_key

        submitter = submitter or LOCAL_SUBMITTER
        if public_key is None:
            public_key = local_public_key()
        elif not isinstance(public_key, PublicKey):
            public_key = load_public(public_key, f"submitter {submitter!r} public key file")
        keyring = {"default": KeyEntry(secret_file=str(secret_file))} if secret_file else {}
        return cls(SourceRoots.of(roots, allow_hardlinks=allow_hardlinks), keyring=keyring, any_destination=True,
                   submitters={submitter: SubmitterGrant(submitter, (public_key,))})

    def describe(self) -> str:
        dests = ", ".join(map(str, self.destinations))
        if not dests:
            listed = [n for n, g in self.submitters.items() if g.destinations]
            dests = ("any" if self.any_destination else f"only those of submitters {', '.join(listed)}" if listed
                     else "none listed, so every job is refused (destinations are default deny)")
        return (f"source roots {self.roots.describe()}; destinations {dests}; "
                f"keys {', '.join(self.keyring) or 'none'}; submitters {', '.join(self.submitters) or 'none'}")


def _public_keys(name: str, lines: list[str], files: list[str]) -> tuple[PublicKey, ...]:
    """A submitter's public keys, parsed once when the policy is loaded (``decide`` only verifies)."""
    keys = [parse_public(line, f"submitters.{name}.public_key") for line in lines]
    keys += [load_public(f, f"submitters.{name}.public_key_file") for f in files]
    return tuple(keys)


@dataclass
class Decision:
    """The outcome of ``Authorizer.decide``: ``run_spec`` (with the keyring's files) and ``guard`` if accepted."""

    accepted: bool
    reason: str
    submitter: str = ""
    run_spec: TransferSpec | None = None
    guard: Guard | None = None


class Authorizer:
    """Decides whether this agent may run a job (module docstring); ``decide`` never reads a source file."""

    def __init__(self, policy: AgentPolicy, client: Any, keys: Keys, *, clock: Any = time.time) -> None:
        self.policy, self.client, self.keys, self.clock = policy, client, keys, clock

    def decide(self, job_id: str, entry_id: str, spec: TransferSpec | None, spec_json: str, auth_json: str,
               invalid: str = "") -> Decision:
        try:
            return self._decide(job_id, entry_id, spec, spec_json, auth_json, invalid)
        except _Refused as r:
            return Decision(False, f"refused: job {job_id}: {r.reason}", r.submitter)
        except REDIS_UNREACHABLE:
            raise  # not a decision: the job stays pending and is decided when Redis is back
        except Exception as exc:  # noqa: BLE001 - fail closed: whatever went wrong, the job is not run
            return Decision(False, f"refused: job {job_id}: the decision failed ({type(exc).__name__}: {exc})")

    def _decide(self, job_id: str, entry_id: str, spec: TransferSpec | None, spec_json: str, auth_json: str,
                invalid: str) -> Decision:
        pol = self.policy
        auth = JobAuth.from_json(auth_json)
        if auth is None and (claimed := hmac_envelope_submitter(auth_json)) is not None:
            raise _Refused("signed with an HMAC shared key (fstream-job-v1), which agents no longer accept (every "
                           "agent holding that key could sign as the submitter): sign with the submitter's Ed25519 "
                           "key (`fstream keys new submitter NAME`, docs/keys.md)", claimed)
        if auth is None:
            raise _Refused("unsigned (no submitter signature; submit with a submitter id and key this agent "
                           "is configured with)" if not auth_json else "malformed submitter signature")
        grant = pol.submitters.get(auth.submitter)
        if grant is None:
            raise _Refused(f"submitter {auth.submitter!r} is not configured on this agent", auth.submitter)
        if not any(k.key_id == auth.key_id for k in grant.public_keys):
            raise _Refused(f"signed with key {auth.key_id}, not one of submitter {auth.submitter!r}'s public keys "
                           f"on this agent ({', '.join(k.key_id for k in grant.public_keys)})", auth.submitter)
        if not verify(grant.public_keys, auth, self.keys.namespace, job_id, spec_json):
            raise _Refused(f"wrong signature for submitter {auth.submitter!r} (the job was altered after it was "
                           "signed, copied under another id, or signed with another key)", auth.submitter)
        now = self.clock()
        if auth.ts > now + pol.clock_skew_s:
            raise _Refused(f"signed {auth.ts - now:.0f} s in the future (clock skew allowed "
                           f"{pol.clock_skew_s:.0f} s)", auth.submitter)
        use, earlier = first_use(self.client, self.keys, auth.submitter, auth.nonce, f"{job_id} {entry_id}",
                                 pol.max_job_age_s + pol.clock_skew_s)
        if use == "replay":
            raise _Refused(f"replayed: its nonce was already used by job {earlier.split()[0]}", auth.submitter)
        if use == "first" and auth.ts < now - pol.max_job_age_s:  # a redelivery of a job taken in time may be old
            raise _Refused(f"signed {now - auth.ts:.0f} s ago, longer than this agent's max job age "
                           f"({pol.max_job_age_s:.0f} s)", auth.submitter)
        if spec is None:
            raise _Refused(invalid or "the job's spec is not a valid transfer spec", auth.submitter)
        named = [f"{f}={getattr(spec, f)!r}" for f in KEY_FILE_FIELDS if getattr(spec, f)]
        if named:
            raise _Refused(f"names a key file on the agent's host ({', '.join(named)}); jobs refer to keys by id "
                           "(key=ID) and the agent uses its own keyring", auth.submitter)
        key_id = spec.key or "default"
        if key_id not in grant.keys:
            raise _Refused(f"submitter {auth.submitter!r} may not use key {key_id!r} (allowed: "
                           f"{', '.join(sorted(grant.keys)) or 'none'})", auth.submitter)
        entry = pol.keyring.get(key_id)
        if entry is None:
            raise _Refused(f"this agent holds no key {key_id!r}", auth.submitter)
        dest = spec.dest
        if not (pol.any_destination or pol.destinations or grant.destinations):
            raise _Refused(f"no destination is allowed for submitter {auth.submitter!r}: neither its entry nor "
                           "[agent] lists destinations (default deny: list the receivers and path prefixes it may "
                           "send to in the policy)", auth.submitter)
        for who, rules in (("this agent", pol.destinations), (f"submitter {auth.submitter!r}", grant.destinations)):
            if rules and not any(r.allows(dest) for r in rules):
                raise _Refused(f"destination {spec.destination} is not allowed for {who} (allowed: "
                               f"{', '.join(map(str, rules))})", auth.submitter)
        roots = [pol.roots] + ([grant.roots] if grant.roots is not None else [])
        for source in spec.sources:
            if "://" in source:
                raise _Refused(f"source {source!r}: remote sources are not served by agents", auth.submitter)
            if ".." in source.split("/"):  # the sender lists by text (abspath drops `link/..`): name the tree itself
                raise _Refused(f"source {source!r}: a '..' component is not accepted in a job's source (the "
                               "listing would not follow the links the check follows); name the directory",
                               auth.submitter)
            for r in roots:
                try:
                    r.check_source(source)
                except (OutsideRootsError, RefusedError) as exc:
                    owner = "this agent's" if r is pol.roots else f"submitter {auth.submitter}'s"
                    raise _Refused(str(exc).replace("this agent's", owner), auth.submitter) from None
        run_spec = spec.replace(**{f: getattr(entry, f) for f in KEY_FILE_FIELDS})
        if entry.secret_file:
            try:
                load_secret(entry.secret_file)  # a broken keyring file fails here, naming it, not in the transfer
            except AuthError as exc:
                raise _Refused(f"this agent's key {key_id!r} cannot be used: {exc}", auth.submitter) from None
        return Decision(True, f"accepted: job {job_id} from submitter {auth.submitter!r}", auth.submitter,
                        run_spec, Guard(*roots))


class _Refused(Exception):
    def __init__(self, reason: str, submitter: str = "") -> None:
        super().__init__(reason)
        self.reason, self.submitter = reason, submitter
