"""Destination path safety: normalise, refuse escapes, walk directories without following symlinks."""

from __future__ import annotations

import errno
import hashlib
import os
import unicodedata

from transfer_agent.errors import RefusedError

MAX_NAME = 255


def safe_relpath(name: str) -> str:
    """Return the NFKC-normalised relative POSIX path, or raise ``RefusedError`` naming the reason.

    Refused: empty names, names that are not valid UTF-8 (lone surrogates), NUL or control characters,
    absolute paths, backslashes, and any ``..`` or ``.`` component — checked after Unicode
    normalisation, so full-width dots (``．．``) cannot sneak past.
    """
    if not isinstance(name, str) or not name:
        raise RefusedError(f"path {name!r}: empty")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: an undecodable byte of a source name (os.fsdecode), or JSON "\udcff"
        raise RefusedError(f"path {name!r}: not valid UTF-8 (undecodable byte in the source name?)") from None
    norm = unicodedata.normalize("NFKC", name)
    for ch in norm:
        if ch == "\x00" or unicodedata.category(ch) == "Cc":
            raise RefusedError(f"path {name!r}: contains a NUL or control character")
    if norm.startswith("/"):
        raise RefusedError(f"path {name!r}: absolute paths are not allowed")
    if "\\" in norm:
        raise RefusedError(f"path {name!r}: backslashes are not allowed")
    parts = norm.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise RefusedError(f"path {name!r}: component {part!r} escapes or is empty")
        if len(part.encode()) > MAX_NAME:
            raise RefusedError(f"path {name!r}: component longer than {MAX_NAME} bytes")
    return "/".join(parts)


def open_parent(root_fd: int, relpath: str, create: bool = True) -> tuple[int, str]:
    """Walk ``relpath``'s directories under ``root_fd`` with ``O_NOFOLLOW``; return (dir fd, basename).

    Missing directories are created (mode 0755). A symlink or non-directory component is refused.
    The caller closes the returned fd.
    """
    parts = relpath.split("/")
    fd = os.dup(root_fd)
    try:
        for comp in parts[:-1]:
            try:
                nfd = os.open(comp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(comp, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                nfd = os.open(comp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise RefusedError(f"path {relpath!r}: component {comp!r} is a symlink or not a directory") from None
                raise
            os.close(fd)
            fd = nfd
        return fd, parts[-1]
    except BaseException:
        os.close(fd)
        raise


def stem_of(base: str) -> str:
    """The part of a temp name that stands for the final name (long names shortened with a hash)."""
    if len(base.encode()) <= 150:
        return base
    digest = hashlib.sha256(base.encode()).hexdigest()[:12]
    return base.encode()[:120].decode(errors="ignore") + "~" + digest


def temp_name(base: str, job: str, attempt: int) -> str:
    """``.NAME.<job>.<attempt>.part`` (long names are shortened with a hash to fit the name limit)."""
    return f".{stem_of(base)}.{job[:64]}.{attempt}.part"
