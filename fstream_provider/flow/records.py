"""What a flow's ``transfer`` emits: a :class:`Landed` record per landed file, or a :class:`FlowError` naming the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from fstream_provider.model.spec import Destination


class FlowError(Exception):
    """A file could not be shipped; the message names it and says why."""


class Landed(NamedTuple):
    """One file that landed at the destination, verified (a named tuple: cheap to build, read-only).

    :param src: the source path, as a string (``source`` is the :class:`~pathlib.Path`).
    :param path: destination path relative to the receiver's root.
    :param receiver: ``fstream://HOST:PORT`` (``url`` is the file's full URL).
    :param size: bytes.
    :param checksum: hex digest of the landed bytes (``algo``), None with ``verify=False``.
    :param algo: the digest's algorithm (``xxh3_128``).
    :param status: ``committed`` (sent and verified) or ``skipped`` (already there, same size and checksum).
    """

    src: str
    path: str
    receiver: str
    size: int
    checksum: str | None
    algo: str | None
    status: str

    @property
    def source(self) -> Path:
        """The source path."""
        return Path(self.src)

    @property
    def url(self) -> str:
        """``fstream://HOST:PORT/path``."""
        return f"{self.receiver}/{self.path}"

    def to_dict(self) -> dict[str, Any]:
        """``source``, ``path``, ``url``, ``size``, ``checksum``, ``algo``, ``status`` (what ``--manifest`` writes)."""
        return {"source": self.src, "path": self.path, "url": self.url, "size": self.size, "checksum": self.checksum,
                "algo": self.algo, "status": self.status}


def landed_from_event(ev: dict, dest: Destination) -> Landed | None:
    """The record for a transfer's ``file`` event, None unless the file landed; raises FlowError if it failed."""
    status = ev.get("status")
    if status == "failed":
        raise FlowError(f"{ev.get('source') or ev.get('path')}: {ev.get('reason') or 'transfer failed'}")
    if status not in ("committed", "skipped"):
        return None
    return Landed(ev.get("source") or ev["path"], ev["path"], f"fstream://{dest.host}:{dest.port}",
                  int(ev.get("size", 0)), ev.get("checksum"), ev.get("algo"), status)
