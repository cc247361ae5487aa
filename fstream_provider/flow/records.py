"""What a flow's ``transfer`` emits: a :class:`Landed` record per landed file, or a :class:`FlowError` naming the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fstream_provider.model.spec import Destination


class FlowError(Exception):
    """A file could not be shipped; the message names it and says why."""


class Landed:
    """One file that landed at the destination, verified (read-only).

    :param source: the source path (a :class:`~pathlib.Path`).
    :param path: destination path relative to the receiver's root.
    :param url: ``fstream://HOST:PORT/path``.
    :param size: bytes.
    :param checksum: hex digest of the landed bytes (``algo``), None with ``verify=False``.
    :param algo: the digest's algorithm (``xxh3_128``).
    :param status: ``committed`` (sent and verified) or ``skipped`` (already there, same size and checksum).

    ``source`` and ``url`` are built when first read: a flow over many small files makes one
    record per file, and building paths it never reads would cost the transfer's CPU.
    """

    __slots__ = ("_source", "path", "_base", "size", "checksum", "algo", "status")
    FIELDS = ("source", "path", "url", "size", "checksum", "algo", "status")

    def __init__(self, source: str | Path, path: str, base: str, size: int, checksum: str | None, algo: str | None,
                 status: str) -> None:
        for name, value in (("_source", source), ("path", path), ("_base", base), ("size", size),
                            ("checksum", checksum), ("algo", algo), ("status", status)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Landed is read-only ({name})")

    @property
    def source(self) -> Path:
        return Path(self._source)

    @property
    def url(self) -> str:
        """``fstream://HOST:PORT/path``."""
        return f"{self._base}/{self.path}"

    def to_dict(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in self.FIELDS}
        d["source"] = str(self._source)
        return d

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Landed) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash((str(self._source), self.path, self.size, self.checksum))

    def __repr__(self) -> str:
        return "Landed(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS) + ")"


def landed_from_event(ev: dict, dest: Destination) -> Landed | None:
    """The record for a transfer's ``file`` event, None unless the file landed; raises FlowError if it failed."""
    status = ev.get("status")
    if status == "failed":
        raise FlowError(f"{ev.get('source') or ev.get('path')}: {ev.get('reason') or 'transfer failed'}")
    if status not in ("committed", "skipped"):
        return None
    return Landed(ev.get("source") or ev["path"], ev["path"], f"fstream://{dest.host}:{dest.port}",
                  int(ev.get("size", 0)), ev.get("checksum"), ev.get("algo"), status)
