"""When the emulated-WAN tests skip, and when they must fail instead (issue 26 item 6).

They skip and say why where the testbed cannot run: without root, or without a TUN device. A missing
tool (``ip``, ``tc``, ``iperf3``, ``ss``, a C compiler, the disk tools) also skips them, unless
``FSTREAM_REQUIRE_WAN=1``: ``.ci/run`` sets it after ``bench/install-deps.sh`` installed those tools as
root, and then a missing one fails the test, so CI cannot stay green with the WAN tests skipped.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import pytest

REQUIRE_ENV = "FSTREAM_REQUIRE_WAN"
TUN = Path("/dev/net/tun")


def required() -> bool:
    """True when ``FSTREAM_REQUIRE_WAN`` says the tools were installed, so a missing one is a failure."""
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def host_reason() -> str | None:
    """Why this host cannot run the testbed whatever is installed (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, TUN devices, tc)"
    if not TUN.exists():
        return f"{TUN} is missing (no TUN driver on this host)"
    return None


def missing_tools() -> list[str]:
    """The tools the testbed needs that are not installed (``bench/install-deps.sh`` installs them)."""
    try:
        from fstream_bench.wan import netns
    except ImportError as exc:
        return [f"the WAN testbed (fstream_bench.wan: {exc})"]
    missing = [t for t in netns.missing_tools() if t != "/dev/net/tun"]  # the device is the host's: host_reason
    if shutil.which("ss") is None:
        missing.append("ss (iproute2)")
    return missing


def require_wan(what: str, extra_tools: Iterable[str] = ()) -> None:
    """Skip the calling test or fixture when the testbed cannot run here, saying why; fail instead when
    only tools are missing and ``FSTREAM_REQUIRE_WAN=1`` says they were installed.

    :param what: what needs the testbed, first in the message (``"WAN testbed"``).
    :param extra_tools: further missing tools the caller found (the disk limit's ``losetup``, ...).
    """
    host = host_reason()
    if host is not None:
        pytest.skip(f"{what}: {host}")
    missing = missing_tools() + list(extra_tools)
    if not missing:
        return
    message = f"{what}: missing {', '.join(missing)}"
    if required():
        pytest.fail(f"{message}; {REQUIRE_ENV}=1 (set by .ci/run once bench/install-deps.sh installed the tools "
                    "as root) makes this a failure, not a skip", pytrace=False)
    pytest.skip(message)
