"""Ed25519 key pairs for signatures that the verifying side cannot forge (issue 40, "Asymmetric keys").

Who signs holds the private key; who checks holds only the public key. Submitters sign jobs (agents hold their
public keys: reading an agent's configuration does not let anyone sign a job) and agents sign job outcomes
(clients hold the agents' public keys: a submitter's Redis credentials cannot make another's job look done).
The primitive is ``cryptography``'s Ed25519 (RFC 8032); this module is only its file formats and key ids.

Files:

- a **private key** is the PKCS#8 PEM ``cryptography`` writes, unencrypted, mode 0600 (``model.keyfile`` refuses a
  file group or others may read or write);
- a **public key** is one line, ``fstream-ed25519 <base64 of the 32 raw bytes> [name]``, readable by anyone (it is
  no secret). ``parse_public`` also takes the line itself, so a connection extra or a policy can hold it inline.

A key's **id** is the first 16 hex digits of the SHA-256 of its raw public bytes: what ``fstream keys list`` shows
and what a signature names, so a verifier with several trusted keys (rotation) picks the right one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fstream_provider.model.keyfile import KeyFileError, read_private_file

PUBLIC_PREFIX = "fstream-ed25519"
SIG_HEX = re.compile(r"[0-9a-f]{128}")  # fullmatch: an Ed25519 signature is 64 bytes
KEY_ID_HEX = re.compile(r"[0-9a-f]{16}")


class KeyFormatError(KeyFileError):
    """A key file or line that is not an FStream Ed25519 key; the message names it and the reason."""


def _key_id(raw_public: bytes) -> str:
    return hashlib.sha256(raw_public).hexdigest()[:16]


@dataclass(frozen=True)
class PublicKey:
    """A verifying key: its 32 raw bytes, its id and an optional name (the submitter or agent it belongs to)."""

    raw: bytes = field(repr=False)
    name: str = ""

    def __post_init__(self) -> None:
        if len(self.raw) != 32:
            raise KeyFormatError(f"Ed25519 public key: {len(self.raw)} bytes (need 32)")

    @property
    def key_id(self) -> str:
        return _key_id(self.raw)

    def line(self) -> str:
        """The public key file's one line."""
        return " ".join(filter(None, (PUBLIC_PREFIX, base64.b64encode(self.raw).decode(), self.name)))

    def verify(self, message: bytes, signature_hex: str) -> bool:
        """True iff ``signature_hex`` (128 hex digits) is this key's signature of ``message``."""
        if not isinstance(signature_hex, str) or not SIG_HEX.fullmatch(signature_hex):
            return False
        try:
            Ed25519PublicKey.from_public_bytes(self.raw).verify(bytes.fromhex(signature_hex), message)
        except InvalidSignature:
            return False
        return True

    def __repr__(self) -> str:
        return f"PublicKey(id={self.key_id}, name={self.name!r})"


@dataclass(frozen=True)
class PrivateKey:
    """A signing key (never printed) and the public key that goes with it."""

    _key: Ed25519PrivateKey = field(repr=False)
    name: str = ""

    @classmethod
    def generate(cls, name: str = "") -> "PrivateKey":
        return cls(Ed25519PrivateKey.generate(), name)

    @property
    def public(self) -> PublicKey:
        raw = self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return PublicKey(raw, self.name)

    @property
    def key_id(self) -> str:
        return self.public.key_id

    def sign(self, message: bytes) -> str:
        """The signature of ``message``, 128 hex digits."""
        return self._key.sign(message).hex()

    def pem(self) -> bytes:
        return self._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption())

    def __repr__(self) -> str:
        return f"PrivateKey(id={self.key_id}, name={self.name!r})"


def load_private(path: str | os.PathLike[str], what: str = "Ed25519 private key", name: str = "") -> PrivateKey:
    """A private key file (0600, PKCS#8 PEM); ``KeyFileError`` naming the file and the reason."""
    data, _st = read_private_file(path, what)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFormatError(f"{what} {Path(path)}: not an unencrypted PKCS#8 PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFormatError(f"{what} {Path(path)}: a {type(key).__name__}, not an Ed25519 key")
    return PrivateKey(key, name)


def parse_public(text: str, what: str = "Ed25519 public key") -> PublicKey:
    """``fstream-ed25519 <base64> [name]`` (a public key file's line) as a ``PublicKey``."""
    parts = text.strip().split()
    if len(parts) not in (2, 3) or parts[0] != PUBLIC_PREFIX:
        raise KeyFormatError(f"{what}: expected '{PUBLIC_PREFIX} <base64> [name]', got {text.strip()[:80]!r}")
    try:
        raw = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise KeyFormatError(f"{what}: {parts[1][:60]!r} is not base64") from None
    if len(raw) != 32:
        raise KeyFormatError(f"{what}: {len(raw)} bytes (an Ed25519 public key has 32)")
    return PublicKey(raw, parts[2] if len(parts) == 3 else "")


def load_public(path: str | os.PathLike[str], what: str = "Ed25519 public key") -> PublicKey:
    """A public key file (one line; any mode: it is no secret)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="strict")
    except FileNotFoundError:
        raise KeyFormatError(f"{what} {path}: does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFormatError(f"{what} {path}: cannot read ({exc})") from None
    return parse_public(text, f"{what} {path}")


def write_pair(private_path: str | os.PathLike[str], key: PrivateKey, public_path: str | os.PathLike[str] | None = None,
               *, overwrite: bool = False) -> Path:
    """Write ``key`` to ``private_path`` (created 0600; refused if it exists unless ``overwrite``) and its public line
    to ``public_path`` (default: ``<private_path>.pub``, mode 0644). Returns the public key's path."""
    private_path = Path(private_path)
    public_path = Path(public_path) if public_path else private_path.with_name(private_path.name + ".pub")
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        fd = os.open(private_path, flags, 0o600)
    except FileExistsError:
        raise KeyFileError(f"private key {private_path}: exists (refusing to overwrite a key)") from None
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(key.pem())
    tmp = public_path.with_name(public_path.name + ".tmp")
    tmp.write_text(key.public.line() + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, public_path)
    return public_path


def ensure_pair(private_path: str | os.PathLike[str], name: str = "") -> PrivateKey:
    """The key at ``private_path``, made (with its ``.pub``) if it does not exist. Written whole under a private
    name, then linked in: two processes making it at once both end up with the one linked first, and none ever
    reads it half written."""
    private_path = Path(private_path)
    if not private_path.exists():
        private_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=private_path.parent, prefix=f".{private_path.name}.")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(PrivateKey.generate(name).pem())
            try:
                os.link(tmp, private_path)
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
    key = load_private(private_path, name=name)
    public_path = private_path.with_name(private_path.name + ".pub")
    if not public_path.exists():  # a private temp name each: two threads of one process may get here at once
        fd, tmp_pub = tempfile.mkstemp(dir=public_path.parent, prefix=f".{public_path.name}.")
        with os.fdopen(fd, "w") as f:
            f.write(key.public.line() + "\n")
        os.chmod(tmp_pub, 0o644)
        os.replace(tmp_pub, public_path)
    return key
