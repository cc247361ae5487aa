"""What a flow's ``transfer`` emits: a :class:`Landed` record per landed file, or a :class:`FlowError` naming the file."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fstream_provider.model.spec import Destination


class FlowError(Exception):
    """A file could not be shipped; the message names it and says why."""


@dataclass(frozen=True)
class Landed:
    """One file that landed at the destination, verified.

    :param source: the source path.
    :param path: destination path relative to the receiver's root.
    :param url: ``fstream://HOST:PORT/path``.
    :param size: bytes.
    :param checksum: hex digest of the landed bytes (``algo``), None with ``verify=False``.
    :param algo: the digest's algorithm (``xxh3_128``).
    :param status: ``committed`` (sent and verified) or ``skipped`` (already there, same size and checksum).
    """

    source: Path
    path: str
    url: str
    size: int
    checksum: str | None
    algo: str | None
    status: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["source"] = str(self.source)
        return d


def landed_from_event(ev: dict, dest: Destination) -> Landed | None:
    """The record for a transfer's ``file`` event, None unless the file landed; raises FlowError if it failed."""
    status = ev.get("status")
    if status == "failed":
        raise FlowError(f"{ev.get('source') or ev.get('path')}: {ev.get('reason') or 'transfer failed'}")
    if status not in ("committed", "skipped"):
        return None
    return Landed(Path(ev.get("source") or ev["path"]), ev["path"], f"fstream://{dest.host}:{dest.port}/{ev['path']}",
                  int(ev.get("size", 0)), ev.get("checksum"), ev.get("algo"), status)
