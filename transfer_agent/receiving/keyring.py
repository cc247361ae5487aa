"""A receiver's keyring (issue 32): per key id, its shared secret, the subtree it may write under, a byte quota.

Senders name their key in HELLO (``wire.auth``); an OPEN is admitted only under the key's subtree and within its
quota (``control``, ``quota``). A keyring file is TOML: ``[keys.<id>]`` tables with ``secret_file`` (mode 0600;
relative to the keyring's directory), ``subtree`` (under the root; absent: all of it), ``quota`` (``10TiB``).

Generations (issue 30): a key's secret file may be a ring of generations (``model.secret_ring``); a HELLO names the
generation it uses (``ReceiverKey.secret_at``). ``KeyringWatch`` re-reads the keyring's files (the keyring file and
every key's secret file) when one changes, so a rotation needs no restart; an invalid file keeps the last good keys.
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

from fstream_provider.model.units import parse_size
from transfer_agent.errors import FStreamError
from transfer_agent.storage.paths import safe_relpath
from fstream_provider.model.secret_ring import file_stamp, fmt_time
from transfer_agent.wire.auth import DEFAULT_KEY, KEY_ID_RULE, generation_secret, load_secret, valid_key_id

KEY_FIELDS = frozenset({"secret_file", "subtree", "quota"})
CHECK_INTERVAL = 1.0  # seconds: how often a receiver looks whether its key files changed (on accept)


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

    def reread(self) -> "ReceiverKey":
        """This key with its secret file read again (itself when its secret came from no file)."""
        path = self.secret_file
        return self if path is None else ReceiverKey(self.key_id, load_secret(path), self.subtree, self.quota)


class Keyring(Mapping[str, ReceiverKey]):
    """Key id → ``ReceiverKey``: every key has a secret (HMAC), or none (TLS only: then one key at most)."""

    def __init__(self, keys: Iterable[ReceiverKey], *, source: str | None = None,
                 from_source: frozenset[str] = frozenset()) -> None:
        self.source = source  # the keyring file the keys ``from_source`` were read from (re-read by ``reread``)
        self._from_source = from_source
        self._keys: dict[str, ReceiverKey] = {}
        for k in keys:
            if k.key_id in self._keys:
                raise FStreamError(f"keyring: key {k.key_id!r} given twice")
            self._keys[k.key_id] = k
        bare = sorted(i for i, k in self._keys.items() if k.secret is None)
        if not self._keys:
            raise FStreamError("keyring: no keys")
        if 0 < len(bare) < len(self._keys):
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
        when the key is unknown, ``auth.KeyRefused`` when the generation is not accepted now."""
        return self._keys[key_id].secret_at(gen)

    @property
    def files(self) -> tuple[str, ...]:
        """The files it was read from: the keyring file, then each key's secret file."""
        return tuple(f for f in (self.source, *(k.secret_file for k in self._keys.values())) if f)

    def reread(self) -> "Keyring":
        """This keyring read again from its files; ``FStreamError`` naming the file and the reason."""
        fresh = load_keyring(self.source) if self.source else None
        keys = [*(fresh.values() if fresh is not None else ()),
                *(k.reread() for k in self._keys.values() if k.key_id not in self._from_source)]
        try:
            return Keyring(keys, source=self.source, from_source=frozenset(fresh or ()))
        except FStreamError as exc:
            raise FStreamError(f"keyring {self.source}: {exc}" if self.source else str(exc)) from None

    @property
    def has_secrets(self) -> bool:
        return any(k.secret is not None for k in self._keys.values())

    def with_key(self, key: ReceiverKey) -> "Keyring":
        """A new keyring with ``key`` added (refused if its id is taken)."""
        return Keyring([*self._keys.values(), key], source=self.source, from_source=self._from_source)


def load_keyring(path: str | os.PathLike[str]) -> Keyring:
    """Read a keyring TOML file; a bad one is refused naming the file, the field (``keys.a.quota``), value, reason."""
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
    keys = [_key_from(where, base, key_id, table) for key_id, table in tables.items()]
    try:
        return Keyring(keys, source=os.fspath(path), from_source=frozenset(k.key_id for k in keys))
    except FStreamError as exc:
        raise FStreamError(f"{where}: {exc}") from None


def _key_from(where: str, base: str, key_id: str, table: Any) -> ReceiverKey:
    name = f"keys.{key_id}"
    if not valid_key_id(key_id):
        raise FStreamError(f"{where}: {name}: {key_id!r} is not a valid key id ({KEY_ID_RULE})")
    if not isinstance(table, dict):
        raise FStreamError(f"{where}: {name} = {table!r}: expected a table")
    for fld in sorted(set(table) - KEY_FIELDS):
        raise FStreamError(f"{where}: {name}.{fld}: unknown field (allowed: {', '.join(sorted(KEY_FIELDS))})")

    def bad(fld: str, why: str) -> FStreamError:
        return FStreamError(f"{where}: {name}.{fld} = {table[fld]!r}: {why}")

    secret, subtree, quota = None, table.get("subtree", ""), table.get("quota")
    if "secret_file" in table:
        if not isinstance(table["secret_file"], str) or not table["secret_file"]:
            raise bad("secret_file", "expected a file name")
        try:  # a relative name is relative to the keyring's directory
            secret = load_secret(os.path.join(base, os.path.expanduser(table["secret_file"])))
        except (FStreamError, ValueError) as exc:
            raise bad("secret_file", str(exc)) from None
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
        return ReceiverKey(key_id, secret, subtree, quota)
    except FStreamError as exc:
        raise bad("subtree", str(exc)) from None


class KeyringWatch:
    """A receiver's keyring, re-read when one of its files changes (issue 30: a rotation needs no restart).

    ``current()`` (asked on each accepted connection) looks at the files at most once per ``interval`` seconds: one
    ``stat`` each (inode, size, mtime), and reads them again only when one changed. A file that became invalid keeps
    the last good keys and logs an error naming the file and the reason, once per change. ``secret_at`` looks again
    at once when a HELLO names a key or generation it does not accept (a sender may have read a rotated file since
    the last look): a rotation's first session is not refused for want of a look.

    :param keyring: the keys read at start.
    :param log: where re-reads and errors are logged.
    :param interval: seconds between looks.
    """

    def __init__(self, keyring: Keyring, log: logging.Logger, interval: float = CHECK_INTERVAL) -> None:
        self._keyring, self._log, self._interval = keyring, log, interval
        self._lock = threading.Lock()
        self._stamps = self._stamp(keyring)
        self._looked = time.monotonic()
        self.rereads = 0  # successful re-reads of changed files

    @staticmethod
    def _stamp(keyring: Keyring) -> dict[str, tuple[int, int, int] | None]:
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
                fresh = self._keyring.reread()
            except FStreamError as exc:
                self._log.error("key files changed (%s) but cannot be used, keeping the last good keys: %s",
                                changed, exc)
                return self._keyring
            self._stamps = {**self._stamp(fresh), **{f: s for f, s in stamps.items() if f in fresh.files}}
            self._keyring = fresh
            self.rereads += 1
            self._log.info("keys re-read (%s changed): %s", changed,
                           "; ".join(f"key {k.key_id}: {k.generations()}" for k in fresh.values()))
            return fresh

    def secret_at(self, key_id: str, gen: str | None) -> tuple[str, bytes | None]:
        """``Keyring.secret_at`` on the keyring now, looking at the files again once if it does not accept."""
        try:
            return self.current().secret_at(key_id, gen)
        except KeyError:
            return self.current(look=True).secret_at(key_id, gen)
