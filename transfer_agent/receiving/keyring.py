"""A receiver's keyring (issue 32): per key id, its shared secret, the subtree it may write under, a byte quota.

Senders name their key in HELLO (``wire.auth``); an OPEN is admitted only under the key's subtree and within its
quota (``control``, ``quota``). A keyring file is TOML: ``[keys.<id>]`` tables with ``secret_file`` (mode 0600;
relative to the keyring's directory), ``subtree`` (under the root; absent: all of it), ``quota`` (``10TiB``).

Generations (issue 30): a key's secret file may be a ring of generations (``model.secret_ring``); a HELLO names the
generation it uses (``ReceiverKey.secret_at``). ``KeyringWatch`` re-reads the keyring's files (the keyring file and
every key's secret file) when one changes, so a rotation needs no restart. Re-reading fails closed, key by key
(``Keyring.reread``): a key removed from the keyring file is gone; a key whose secret file is missing, unreadable or
readable or writable by group or others is dropped (revoked) while the others stay; a secret file whose content no
longer parses keeps that key's last good secret, and a keyring file that no longer parses keeps every last good key
(edits gone wrong, not revocations). Each handshake uses one ``KeySnapshot`` from its start to its session.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from fstream_provider.model.keyfile import KeyFileError
from fstream_provider.model.secret_ring import RingError, fmt_time, read_ring
from fstream_provider.model.units import parse_size
from transfer_agent.errors import FStreamError
from transfer_agent.storage.paths import safe_relpath
from transfer_agent.wire.auth import DEFAULT_KEY, KEY_ID_RULE, Secret, generation_secret, valid_key_id

KEY_FIELDS = frozenset({"secret_file", "subtree", "quota"})
CHECK_INTERVAL = 1.0  # seconds: how often a receiver looks whether its key files changed (on accept)
FORCED_LOOK_S = 0.25  # at most one look out of turn (a HELLO naming a key or generation not accepted) this often


def file_stamp(path: str) -> tuple[int, int, int, int] | None:
    """(inode, size, mtime, ctime in ns) of ``path``, None when it cannot be stat'ed: what changes when a file is
    rewritten, replaced, or its mode or owner changed (a ``chmod 644`` of a secret file revokes its key)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


@dataclass(frozen=True)
class ReceiverKey:
    """One key: its id (``[A-Za-z0-9._-]{1,64}``), secret (None only for TLS-only receivers), the subtree of the
    root it may write under (normalised; ``""``: the whole root) and the bytes it may hold there (None: unlimited)."""

    key_id: str
    secret: bytes | None = field(repr=False)
    subtree: str = ""
    quota: int | None = None

    def __post_init__(self) -> None:
        if not valid_key_id(self.key_id) or not isinstance(self.secret, (bytes, type(None))):
            raise FStreamError(f"key {self.key_id!r}: not a valid key id ({KEY_ID_RULE}) or its secret is not bytes")
        sub = self.subtree.rstrip("/") if isinstance(self.subtree, str) else self.subtree
        object.__setattr__(self, "subtree", safe_relpath(sub) if sub else "")  # RefusedError naming the reason
        if self.quota is not None and (type(self.quota) is not int or self.quota < 0):
            raise FStreamError(f"key {self.key_id!r}: quota {self.quota!r} is not a number of bytes")

    def admits(self, rel: str) -> bool:  # rel: validated; component-wise: subtree "lcls" does not admit "lcls2/x"
        return not self.subtree or rel.startswith(self.subtree + "/")

    def where(self) -> str:
        return f"{self.subtree}/" if self.subtree else "the whole root"

    @property
    def secret_file(self) -> str | None:
        """The file its secret was read from (``auth.Secret``), None when given as bytes."""
        return getattr(self.secret, "path", None)

    def secret_at(self, gen: str | None) -> tuple[str, bytes | None]:
        """(generation, secret) for the generation a HELLO named (None: the current one); ``auth.KeyRefused``
        when it is not accepted now."""
        return generation_secret(self.secret, gen)

    def generations(self) -> str:
        """Its generations and their states, for logs (never a secret): ``g2 current, g1 previous until ...``."""
        ring = getattr(self.secret, "ring", None)
        if ring is None:
            return "0 current"
        return ", ".join(f"{g.gen_id} {g.state}" + (f" until {fmt_time(g.accept_until)}" if g.accept_until else "")
                         for g in ring.generations)

    @property
    def spec(self) -> "KeySpec":
        return KeySpec(self.key_id, self.secret_file, self.subtree, self.quota)


@dataclass(frozen=True)
class KeySpec:
    """What the configuration says of one key: its id, secret file (None: its secret came from no file), subtree and
    quota; ``load`` reads the secret file."""

    key_id: str
    secret_file: str | None
    subtree: str = ""
    quota: int | None = None
    given: str | None = field(default=None, compare=False)  # the name a keyring file gave (for its errors)

    def load(self) -> ReceiverKey:
        """The key with its secret file read now: ``RingError`` for a file whose content cannot be used, another
        ``KeyFileError`` for one that is missing, unreadable or readable or writable by group or others."""
        if self.secret_file is None:
            return ReceiverKey(self.key_id, None, self.subtree, self.quota)
        ring = read_ring(self.secret_file)
        return ReceiverKey(self.key_id, Secret(ring.current.secret, self.secret_file, None if ring.legacy else ring),
                           self.subtree, self.quota)

    def refresh(self, last: ReceiverKey | None) -> tuple[ReceiverKey | None, str | None]:
        """(the key now or None when it is dropped, a problem to log or None) given its ``last`` good key: a secret
        file that is missing, unreadable or not private drops the key (revocation fails closed); one whose content
        no longer parses keeps the last good secret of the same file (an edit gone wrong)."""
        try:
            return self.load(), None
        except RingError as exc:
            if last is not None and last.secret is not None and last.secret_file == self.secret_file:
                return (ReceiverKey(self.key_id, last.secret, self.subtree, self.quota),
                        f"key {self.key_id!r}: keeping its last good secret: {exc}")
            return None, f"key {self.key_id!r} dropped (refused until its secret file can be used): {exc}"
        except KeyFileError as exc:
            return None, f"key {self.key_id!r} dropped (refused until its secret file can be used): {exc}"


class Keyring(Mapping[str, ReceiverKey]):
    """Key id → ``ReceiverKey``: every key has a secret (HMAC), or none (TLS only: then one key at most).

    :param keys: the usable keys.
    :param source: the keyring file the keys ``from_source`` were read from (re-read by ``reread``).
    :param dropped: keys the configuration names whose secret file cannot be used now (refused; ``reread`` tries
        their files again).
    """

    def __init__(self, keys: Iterable[ReceiverKey], *, source: str | None = None,
                 from_source: frozenset[str] = frozenset(), dropped: Iterable[KeySpec] = ()) -> None:
        self.source = source
        self._from_source = from_source
        self._dropped = {d.key_id: d for d in dropped}
        self._keys: dict[str, ReceiverKey] = {}
        for k in keys:
            if k.key_id in self._keys or k.key_id in self._dropped:
                raise FStreamError(f"keyring: key {k.key_id!r} given twice")
            self._keys[k.key_id] = k
        bare = sorted(i for i, k in self._keys.items() if k.secret is None)
        if not self._keys and not self._dropped:
            raise FStreamError("keyring: no keys")
        if 0 < len(bare) < len(self._keys) or bare and self._dropped:
            raise FStreamError(f"keyring: key(s) {', '.join(bare)} have no secret while others do "
                               "(every key needs a secret_file, or none for a TLS-only receiver)")
        if len(bare) > 1:  # without secrets, a key id would be only the sender's claim
            raise FStreamError("keyring: keys without secrets (TLS only) cannot be told apart: give each a "
                               "secret_file, or keep one key")

    @classmethod
    def single(cls, secret: bytes | None) -> "Keyring":
        """The keyring of a receiver with one secret (or none: TLS): the key ``"default"``, the whole root."""
        return cls([ReceiverKey(DEFAULT_KEY, secret)])

    def __getitem__(self, key_id: str) -> ReceiverKey:
        return self._keys[key_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def lookup(self, key_id: str) -> ReceiverKey | None:  # (Mapping.get)
        return self._keys.get(key_id)

    def secret_for(self, key_id: str) -> bytes | None:
        """The secret of ``key_id`` (None: TLS only); ``KeyError`` when unknown (``wire.auth.SecretLookup``)."""
        return self._keys[key_id].secret

    def secret_at(self, key_id: str, gen: str | None) -> tuple[str, bytes | None]:
        """(generation, secret) of ``key_id`` at the generation a HELLO named (``wire.auth.GenLookup``): ``KeyError``
        when the key is unknown (or dropped), ``auth.KeyRefused`` when the generation is not accepted now."""
        return self._keys[key_id].secret_at(gen)

    @property
    def dropped(self) -> tuple[str, ...]:
        """The ids of the keys dropped because their secret files cannot be used now."""
        return tuple(self._dropped)

    @property
    def files(self) -> tuple[str, ...]:
        """The files it was read from: the keyring file, then each key's secret file (dropped keys' too)."""
        specs = [*(k.spec for k in self._keys.values()), *self._dropped.values()]
        return tuple(f for f in (self.source, *(k.secret_file for k in specs)) if f)

    def reread(self) -> tuple["Keyring", list[str]]:
        """This keyring read again from its files, key by key, and the problems to log (each names the key, its
        file and the reason): ``KeySpec.refresh`` decides each key; keys no longer in the keyring file are gone.
        ``FStreamError`` naming the file and the reason when the keyring file does not parse: keep the last keys."""
        specs = _read_specs(self.source) if self.source else []
        names = {k.key_id for k in specs}
        specs += [k for k in (*(k.spec for k in self._keys.values()), *self._dropped.values())
                  if k.key_id not in self._from_source and k.key_id not in names]
        keys: list[ReceiverKey] = []
        dropped: list[KeySpec] = []
        problems: list[str] = []
        for spec in specs:
            last = self._keys.get(spec.key_id)
            if spec.secret_file is None and spec.key_id not in names and last is not None:
                keys.append(last)  # its secret came from no file: nothing to read again
                continue
            key, problem = spec.refresh(last)
            if key is not None:
                keys.append(key)
            else:
                dropped.append(spec)
            if problem:
                problems.append(problem)
        try:
            return Keyring(keys, source=self.source, from_source=frozenset(names), dropped=dropped), problems
        except FStreamError as exc:
            raise FStreamError(f"keyring {self.source}: {exc}" if self.source else str(exc)) from None

    @property
    def has_secrets(self) -> bool:
        """Whether its keys have secrets (HMAC); a keyring whose keys were all dropped still requires one."""
        return bool(self._dropped) or any(k.secret is not None for k in self._keys.values())

    def with_key(self, key: ReceiverKey) -> "Keyring":
        """A new keyring with ``key`` added (refused if its id is taken)."""
        return Keyring([*self._keys.values(), key], source=self.source, from_source=self._from_source,
                       dropped=self._dropped.values())


def load_keyring(path: str | os.PathLike[str]) -> Keyring:
    """Read a keyring TOML file and its keys' secret files; a bad one is refused naming the file, the field
    (``keys.a.quota``), value, reason."""
    where = f"keyring {os.fspath(path)}"
    keys = []
    for spec in _read_specs(path):
        try:
            keys.append(spec.load())
        except KeyFileError as exc:
            raise FStreamError(f"{where}: keys.{spec.key_id}.secret_file = {spec.given!r}: {exc}") from None
    try:
        return Keyring(keys, source=os.fspath(path), from_source=frozenset(k.key_id for k in keys))
    except FStreamError as exc:
        raise FStreamError(f"{where}: {exc}") from None


def _read_specs(path: str | os.PathLike[str]) -> list[KeySpec]:
    """What a keyring file says of its keys (``FStreamError`` naming the file, field, value and reason); their
    secret files are not read here."""
    where = f"keyring {os.fspath(path)}"
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise FStreamError(f"{where}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    tables = doc.get("keys")
    if set(doc) - {"keys"} or not isinstance(tables, dict) or not tables:
        raise FStreamError(f"{where}: expected only [keys.<id>] tables (with secret_file, subtree, quota), "
                           f"found {', '.join(sorted(doc)) or 'nothing'}")
    base = os.path.dirname(os.path.abspath(path))
    return [_spec_from(where, base, key_id, table) for key_id, table in tables.items()]


def _spec_from(where: str, base: str, key_id: str, table: Any) -> KeySpec:
    name = f"keys.{key_id}"
    if not valid_key_id(key_id):
        raise FStreamError(f"{where}: {name}: {key_id!r} is not a valid key id ({KEY_ID_RULE})")
    if not isinstance(table, dict):
        raise FStreamError(f"{where}: {name} = {table!r}: expected a table")
    for fld in sorted(set(table) - KEY_FIELDS):
        raise FStreamError(f"{where}: {name}.{fld}: unknown field (allowed: {', '.join(sorted(KEY_FIELDS))})")

    def bad(fld: str, why: str) -> FStreamError:
        return FStreamError(f"{where}: {name}.{fld} = {table[fld]!r}: {why}")

    secret_file, subtree, quota = None, table.get("subtree", ""), table.get("quota")
    if "secret_file" in table:
        if not isinstance(table["secret_file"], str) or not table["secret_file"]:
            raise bad("secret_file", "expected a file name")
        # a relative name is relative to the keyring's directory
        secret_file = os.path.join(base, os.path.expanduser(table["secret_file"]))
    if not isinstance(subtree, str):
        raise bad("subtree", "expected a relative path")
    if quota is not None:
        if type(quota) not in (str, int) or (type(quota) is int and quota < 0):
            raise bad("quota", "expected a size such as 10TiB or a number of bytes")
        try:
            quota = parse_size(quota)
        except ValueError as exc:
            raise bad("quota", str(exc)) from None
    try:
        key = ReceiverKey(key_id, None, subtree, quota)  # validates the subtree and the quota
    except FStreamError as exc:
        raise bad("subtree", str(exc)) from None
    return KeySpec(key_id, secret_file, key.subtree, key.quota, given=table.get("secret_file"))


class KeyringWatch:
    """A receiver's keyring, re-read when one of its files changes (issue 30: a rotation needs no restart).

    ``current()`` (asked on each accepted connection) looks at the files at most once per ``interval`` seconds: one
    ``stat`` each (``file_stamp``), and reads them again only when one changed (``Keyring.reread``: key by key,
    failing closed; each problem is logged at ERROR naming the key, its file and the reason, once per change; a
    keyring file that does not parse keeps the last good keys). A HELLO naming a key or generation the keys do not
    accept asks for a look out of turn (``look_now``: a sender may have read a rotated file since the last look), at
    most once per ``forced_interval`` whoever asks, so unauthenticated peers cannot make the receiver stat and read
    its files at will. Each handshake takes one ``snapshot``.

    :param keyring: the keys read at start.
    :param log: where re-reads and errors are logged.
    :param interval: seconds between looks.
    :param forced_interval: seconds between looks out of turn.
    """

    def __init__(self, keyring: Keyring, log: logging.Logger, interval: float = CHECK_INTERVAL,
                 forced_interval: float = FORCED_LOOK_S) -> None:
        self._keyring, self._log, self._interval, self._forced_interval = keyring, log, interval, forced_interval
        self._lock = threading.Lock()
        self._stamps = self._stamp(keyring)
        self._looked = time.monotonic()
        self._forced = -forced_interval  # monotonic time of the last look out of turn
        self._forced_lock = threading.Lock()
        self.rereads = 0  # successful re-reads of changed files

    @staticmethod
    def _stamp(keyring: Keyring) -> dict[str, tuple[int, int, int, int] | None]:
        return {f: file_stamp(f) for f in keyring.files}

    def current(self, *, look: bool = False) -> Keyring:
        """The keyring now (``look``: look at the files whatever the interval)."""
        if not look and time.monotonic() - self._looked < self._interval or not self._stamps:
            return self._keyring
        with self._lock:
            self._looked = time.monotonic()
            stamps = self._stamp(self._keyring)
            if stamps == self._stamps:
                return self._keyring
            changed = ", ".join(f for f in stamps if stamps[f] != self._stamps.get(f))
            self._stamps = stamps  # a broken file is reported once per change, not on every look
            try:
                fresh, problems = self._keyring.reread()
            except FStreamError as exc:
                self._log.error("key files changed (%s) but cannot be used, keeping the last good keys: %s",
                                changed, exc)
                return self._keyring
            for problem in problems:
                self._log.error("key files changed (%s): %s", changed, problem)
            self._stamps = {**self._stamp(fresh), **{f: s for f, s in stamps.items() if f in fresh.files}}
            self._keyring = fresh
            self.rereads += 1
            self._log.info("keys re-read (%s changed): %s", changed,
                           "; ".join([f"key {k.key_id}: {k.generations()}" for k in fresh.values()]
                                     + [f"key {d}: dropped" for d in fresh.dropped]))
            return fresh

    def forced_look_ready(self) -> bool:
        """Whether a look out of turn may run now."""
        return time.monotonic() - self._forced >= self._forced_interval

    def look_now(self) -> Keyring | None:
        """A look at the files out of turn (``current(look=True)``), or None when one ran less than
        ``forced_interval`` seconds ago (whoever asked for it)."""
        with self._forced_lock:
            now = time.monotonic()
            if now - self._forced < self._forced_interval:
                return None
            self._forced = now
        return self.current(look=True)

    def snapshot(self) -> "KeySnapshot":
        """The keys one handshake uses throughout (``KeySnapshot``)."""
        return KeySnapshot(self)

    def secret_at(self, key_id: str, gen: str | None) -> tuple[str, bytes | None]:
        """``Keyring.secret_at`` on the keyring now, looking at the files again (``look_now``) if it does not
        accept."""
        return self.snapshot().secret_at(key_id, gen)


class KeySnapshot:
    """The keyring one handshake uses from its start to the session it opens (issue 30): the secret it authenticates
    with and the key's subtree and quota come from the same keys, whatever re-read happens meanwhile.

    ``keyring`` is the keys at the handshake's start; ``secret_at`` (``wire.auth.GenLookup``) looks them up and, for
    a key or generation they do not accept, asks the watch for a look out of turn: when that gives other keys (in
    the same mode, HMAC or TLS only), the handshake uses those from then on.
    """

    def __init__(self, watch: KeyringWatch) -> None:
        self._watch = watch
        self.keyring = watch.current()

    def secret_at(self, key_id: str, gen: str | None) -> tuple[str, bytes | None]:
        try:
            return self.keyring.secret_at(key_id, gen)
        except KeyError:
            fresh = self._watch.look_now()
            if fresh is None or fresh is self.keyring or fresh.has_secrets != self.keyring.has_secrets:
                raise
            self.keyring = fresh
            return fresh.secret_at(key_id, gen)
