"""``fstream --version`` (issue 30, defect 3): the package's version and the wire protocol versions it speaks.

Prints ``fstream 0.1.0 (protocol 2)``, or ``fstream 0.1.0 (protocol 3; accepts 3, 2)`` once
``transfer_agent.wire.protocol`` defines the versions it accepts besides ``VERSION`` (a collection of
version numbers such as ``SUPPORTED`` or ``ACCEPTED_VERSIONS``, or an oldest one, ``MIN_VERSION``): whatever
that module defines.
Everything is read when the flag is given, so no other command pays for it at start-up.
"""

from __future__ import annotations

import argparse
from collections.abc import Collection
from types import ModuleType
from typing import Any

DISTRIBUTION = "fstream"  # setup.cfg [metadata] name


def package_version() -> str:
    """The installed distribution's version (``importlib.metadata``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed)"


def _numbers(value: Any) -> bool:
    return (isinstance(value, Collection) and not isinstance(value, (str, bytes, dict)) and len(value) > 0
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value))


def accepted_versions(protocol: ModuleType) -> list[int]:
    """The protocol versions ``protocol`` accepts, newest first (just ``VERSION`` if it names no others)."""
    names = [n for n in vars(protocol) if n.isupper() and not n.startswith("_") and _numbers(getattr(protocol, n))
             and any(w in n for w in ("ACCEPT", "SUPPORT", "VERSION"))]
    names.sort(key=lambda n: ("ACCEPT" not in n, "SUPPORT" not in n, n))  # ACCEPTED, then SUPPORTED, then *VERSION*
    if names:
        return sorted(set(getattr(protocol, names[0])), reverse=True)
    oldest = getattr(protocol, "MIN_VERSION", None)
    if isinstance(oldest, int) and not isinstance(oldest, bool) and oldest < protocol.VERSION:
        return list(range(protocol.VERSION, oldest - 1, -1))
    return [protocol.VERSION]


def version_text(protocol: ModuleType | None = None) -> str:
    """``fstream <package version> (protocol <N>)``, with the accepted versions when there are several."""
    if protocol is None:
        from transfer_agent.wire import protocol
    accepted = accepted_versions(protocol)
    extra = f"; accepts {', '.join(map(str, accepted))}" if accepted != [protocol.VERSION] else ""
    return f"fstream {package_version()} (protocol {protocol.VERSION}{extra})"


class VersionAction(argparse.Action):
    """``--version``: print ``version_text()`` to stdout and exit 0 (computed only when given)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, default: Any = argparse.SUPPRESS,
                 help: str = "print the version and the wire protocol versions, and exit") -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(version_text(), flush=True)
        parser.exit(0)
