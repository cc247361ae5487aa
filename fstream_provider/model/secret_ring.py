"""A shared-secret file that holds generations (issue 30, "Key rotation without downtime"): parse, check, write.

Both sides read a shared secret from a file. The format of today, one line = one secret, stays readable: it is
one generation, ``"0"``, current. A rotated file (written by ``fstream keys rotate``) is a small TOML ring,
mode 0600::

    # fstream secret ring: generations of one shared secret (`fstream keys show FILE`); keep it mode 0600
    [[generation]]
    id = "g2"
    state = "current"
    created = 2026-11-26T10:00:00Z
    secret = "9f2c..."

    [[generation]]
    id = "g1"
    state = "previous"
    created = 2026-11-20T09:00:00Z
    accept_until = 2026-11-26T11:00:00Z
    secret = "4b1d..."

States: ``current`` (exactly one: what a sender uses), ``next`` (at most one: receivers accept it, senders do
not use it yet) and ``previous`` (receivers accept it until its ``accept_until``). A generation's secret is the
bytes of its text, as a one-line file's secret is its stripped contents, so a file converted by its first
rotation keeps its secret as generation ``"0"``. A file is a ring when one of its lines is ``[[generation]]``
(a one-line secret of at least 16 bytes cannot be that line); anything else is a one-line secret.

Rotation (``SecretRing.with_next`` → ``promoted`` → ``retired``) returns new rings; ``write_ring`` replaces the
file atomically (a temporary file of mode 0600 in the same directory, fsync, rename, fsync of the directory), so a
reader sees the old ring or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from fstream_provider.model.keyfile import MIN_KEY_BYTES, KeyFileError, read_private_file

GEN_ID = re.compile(r"[A-Za-z0-9._-]{1,32}")  # a generation's id (fullmatch)
GEN_ID_RULE = "1 to 32 of A-Z a-z 0-9 . _ -"
LEGACY_GEN = "0"  # the generation a one-line secret file is
STATES = ("current", "next", "previous")
FIELDS = frozenset({"id", "state", "created", "accept_until", "secret"})
MARKER = "[[generation]]"
SECRET_TEXT = re.compile(r"[\x20-\x7e]+")  # what a ring can hold: printable ASCII (a generated one is hex)


class RingError(KeyFileError):
    """A secret file whose generations cannot be used; the message names the file, the field and the reason."""


def fmt_time(ts: float) -> str:
    """``ts`` (seconds since the epoch) as RFC 3339 UTC to the second: ``2026-11-26T10:00:00Z``."""
    return datetime.fromtimestamp(int(ts), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def valid_gen_id(gen_id: object) -> bool:
    return isinstance(gen_id, str) and GEN_ID.fullmatch(gen_id) is not None


@dataclass(frozen=True)
class Generation:
    """One generation of a shared secret.

    :param gen_id: its id (``g3``; ``"0"`` for a one-line file's secret).
    :param secret: its bytes (never printed: not in ``repr``).
    :param created: when it was made (seconds since the epoch).
    :param state: ``current``, ``next`` or ``previous``.
    :param accept_until: a ``previous`` generation's end of acceptance (seconds since the epoch).
    """

    gen_id: str
    secret: bytes = field(repr=False)
    created: float
    state: str
    accept_until: float | None = None

    def accepted(self, now: float) -> bool:
        """Whether a receiver accepts it at ``now``: current and next always, previous until ``accept_until``."""
        return self.state != "previous" or (self.accept_until is not None and now <= self.accept_until)


@dataclass(frozen=True)
class SecretRing:
    """The generations of one shared secret (module docstring); checked when made.

    :param generations: newest first as written; exactly one ``current``, at most one ``next``.
    :param legacy: read from a one-line secret file (generation ``"0"``).
    """

    generations: tuple[Generation, ...]
    legacy: bool = False

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            raise RingError(problem)

    def _problem(self) -> str:
        seen: set[str] = set()
        for g in self.generations:
            what = f"generation {g.gen_id!r}"
            if not valid_gen_id(g.gen_id):
                return f"{what}: not a generation id ({GEN_ID_RULE})"
            if g.gen_id in seen:
                return f"{what}: given twice"
            seen.add(g.gen_id)
            if g.state not in STATES:
                return f"{what}: state {g.state!r} is not one of {', '.join(STATES)}"
            if (g.state == "previous") != (g.accept_until is not None):
                return f"{what}: " + ("a previous generation needs accept_until" if g.state == "previous" else
                                      f"only a previous generation has accept_until (this one is {g.state})")
            if len(g.secret) < MIN_KEY_BYTES:
                return f"{what}: secret too short ({len(g.secret)} bytes; need at least {MIN_KEY_BYTES})"
        states = [g.state for g in self.generations]
        if states.count("current") != 1:
            return f"expected exactly one current generation, found {states.count('current')}"
        if states.count("next") > 1:
            return f"expected at most one next generation, found {states.count('next')}"
        return ""

    @property
    def current(self) -> Generation:
        return next(g for g in self.generations if g.state == "current")

    @property
    def next(self) -> Generation | None:
        return next((g for g in self.generations if g.state == "next"), None)

    def get(self, gen_id: str) -> Generation | None:
        return next((g for g in self.generations if g.gen_id == gen_id), None)

    def refusal(self, gen_id: str, now: float) -> str:
        """Why a receiver does not accept generation ``gen_id`` at ``now`` ("" when it does); names only it."""
        g = self.get(gen_id)
        if g is None:
            return f"generation {gen_id!r} is unknown"
        if not g.accepted(now):
            return f"generation {gen_id!r} is previous and its window ended at {fmt_time(g.accept_until or 0)}"
        return ""

    def new_id(self) -> str:
        """The next free ``g<N>``: one more than the largest ``g<N>`` held."""
        nums = [int(g.gen_id[1:]) for g in self.generations if re.fullmatch(r"g[0-9]{1,9}", g.gen_id)]
        return f"g{max(nums, default=0) + 1}"

    # -- the steps of a rotation: each returns a new ring ------------------------------------------
    def with_next(self, now: float, secret: bytes | None = None) -> "SecretRing":
        """Step 1: a new generation as ``next`` (a fresh random secret unless given)."""
        if self.next is not None:
            raise RingError(f"generation {self.next.gen_id!r} is already next: promote it (--stage promote) "
                            "before adding another")
        g = Generation(self.new_id(), secret or secrets.token_hex(32).encode(), float(int(now)), "next")
        return SecretRing((g, *self.generations))

    def promoted(self, now: float, window: float) -> "SecretRing":
        """Step 2: ``next`` becomes ``current``; the old current becomes ``previous``, accepted ``window`` s more."""
        nxt = self.next
        if nxt is None:
            raise RingError("no next generation to promote: add one first (--stage next)")
        until = float(math.ceil(now + window))
        gens = tuple(replace(g, state="current") if g is nxt else
                     replace(g, state="previous", accept_until=until) if g.state == "current" else g
                     for g in self.generations)
        return SecretRing(gens)

    def retired(self, now: float) -> tuple["SecretRing", list[Generation]]:
        """Step 3: drop the previous generations whose window has passed; (the new ring, those dropped)."""
        gone = [g for g in self.generations if g.state == "previous" and not g.accepted(now)]
        return SecretRing(tuple(g for g in self.generations if g not in gone)), gone


# -- reading -------------------------------------------------------------------------------------------
def is_ring_text(data: bytes) -> bool:
    return any(line.strip() == MARKER.encode() for line in data.splitlines())


def parse_ring(data: bytes, where: str, mtime: float = 0.0) -> SecretRing:
    """The ring in ``data`` (a file's bytes; ``where`` names it in errors); a one-line secret is generation "0",
    created at ``mtime``. ``RingError`` names the file, the field, the value's kind and the reason."""
    if not is_ring_text(data):
        secret = data.strip()
        if len(secret) < MIN_KEY_BYTES:
            raise RingError(f"{where}: too short ({len(secret)} bytes; need at least {MIN_KEY_BYTES})")
        return SecretRing((Generation(LEGACY_GEN, secret, mtime, "current"),), legacy=True)
    import tomllib  # here, not at import: `fstream` start-up reads no TOML without a file (cli.config)

    try:
        doc = tomllib.loads(data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RingError(f"{where}: not a valid secret ring ({exc})") from None
    extra = sorted(set(doc) - {"generation"})
    tables = doc.get("generation")
    if extra or not isinstance(tables, list) or not tables:
        raise RingError(f"{where}: expected only [[generation]] tables, found {', '.join(extra) or 'none'}")
    gens = [_generation(where, i, t) for i, t in enumerate(tables)]
    try:
        return SecretRing(tuple(gens))
    except RingError as exc:
        raise RingError(f"{where}: {exc}") from None


def _generation(where: str, i: int, t: object) -> Generation:
    name = f"{where}: generation[{i}]"
    if not isinstance(t, dict):
        raise RingError(f"{name}: expected a table")
    for fld in sorted(set(t) - FIELDS):
        raise RingError(f"{name}.{fld}: unknown field (allowed: {', '.join(sorted(FIELDS))})")
    for fld in ("id", "state", "created", "secret"):
        if fld not in t:
            raise RingError(f"{name}: {fld} is missing")
    if not valid_gen_id(t["id"]):
        raise RingError(f"{name}.id = {t['id']!r}: not a generation id ({GEN_ID_RULE})")
    if not isinstance(t["secret"], str) or not SECRET_TEXT.fullmatch(t["secret"]):
        raise RingError(f"{name}.secret (of generation {t['id']!r}): expected printable ASCII text")

    def when(fld: str) -> float | None:
        v = t.get(fld)
        if v is None:
            return None
        if not isinstance(v, datetime) or v.tzinfo is None:
            raise RingError(f"{name}.{fld} = {v!r}: expected a date-time with its offset, e.g. 2026-11-26T10:00:00Z")
        return v.timestamp()

    return Generation(t["id"], t["secret"].encode(), when("created") or 0.0, str(t["state"]), when("accept_until"))


def read_ring(path: str | os.PathLike[str], what: str = "secret file") -> SecretRing:
    """Read a secret file (either format); ``KeyFileError``/``RingError`` naming the file and the reason, also
    for a file readable or writable by group or others."""
    data, st = read_private_file(path, what)
    return parse_ring(data, f"{what} {Path(path)}", st.st_mtime)


def file_stamp(path: str | os.PathLike[str]) -> tuple[int, int, int] | None:
    """(inode, size, mtime in ns) of ``path``, None when it cannot be stat'ed: what changes when a file is
    rewritten or replaced (a rename gives a new inode), for a cheap "has it changed?" check."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


# -- writing -------------------------------------------------------------------------------------------
def dump_ring(ring: SecretRing) -> str:
    """The ring as TOML (module docstring); secrets must be printable ASCII (``RingError`` otherwise)."""
    out = ["# fstream secret ring: generations of one shared secret (`fstream keys show FILE`); keep it mode 0600"]
    for g in ring.generations:
        text = g.secret.decode("ascii", "replace")
        if not SECRET_TEXT.fullmatch(text) or text.encode() != g.secret:
            raise RingError(f"generation {g.gen_id!r}: its secret is not printable ASCII text, which a ring holds; "
                            "start from a new secret file (fstream receive creates one) instead")
        out += ["", MARKER, f"id = {json.dumps(g.gen_id)}", f"state = {json.dumps(g.state)}",
                f"created = {fmt_time(g.created)}"]
        if g.accept_until is not None:
            out.append(f"accept_until = {fmt_time(g.accept_until)}")
        out.append(f"secret = {json.dumps(text)}")
    return "\n".join(out) + "\n"


def write_ring(path: str | os.PathLike[str], ring: SecretRing) -> None:
    """Replace ``path`` with ``ring`` atomically: a mode-0600 temporary file in the same directory (owned like the
    file it replaces, where permitted), fsync'ed, renamed over it, then the directory fsync'ed."""
    p = Path(path)
    text = dump_ring(ring).encode()
    tmp = p.with_name(f".{p.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            with contextlib.suppress(FileNotFoundError, PermissionError):  # root rotating a service's file: its owner
                st = os.stat(p)
                os.fchown(f.fileno(), st.st_uid, st.st_gid)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(p.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


@contextlib.contextmanager
def locked(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive lock for a read-change-write of ``path``: two rotations of one file cannot interleave.
    The lock is on the file's directory (the file itself is replaced by each write)."""
    dfd = os.open(Path(path).parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(dfd)
