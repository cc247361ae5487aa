"""Compile the C delay line with the system C compiler into a cache keyed by its source hash."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from fstream_bench.wan.netns import WanError

SOURCE = Path(__file__).with_name("delayline.c")


def state_dir() -> Path:
    """``$FSTREAM_STATE_DIR/wan`` (default ``~/.local/state/fstream/wan``), created if needed."""
    base = os.environ.get("FSTREAM_STATE_DIR") or os.path.expanduser("~/.local/state/fstream")
    path = Path(base) / "wan"
    path.mkdir(parents=True, exist_ok=True)
    return path


def compiler() -> str:
    """Path of the C compiler (``$CC``, else ``cc``, else ``gcc``) or raise :class:`WanError`."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)  # type: ignore[return-value]
    raise WanError("no C compiler found ($CC, cc, gcc): install gcc to build the WAN delay line")


def delayline_binary(cache: Path | None = None) -> Path:
    """Return the compiled delay line, building it first if this source was never built.

    :param cache: directory for binaries (default ``<state dir>/build``).
    """
    src = SOURCE.read_bytes()
    digest = hashlib.sha256(src).hexdigest()[:16]
    cache = cache or state_dir() / "build"
    cache.mkdir(parents=True, exist_ok=True)
    binary = cache / f"fswan-delayline-{digest}"
    if binary.exists() and os.access(binary, os.X_OK):
        return binary
    cc = compiler()
    fd, tmp = tempfile.mkstemp(prefix=binary.name + ".", dir=cache)
    os.close(fd)
    try:
        cp = subprocess.run([cc, "-O2", "-Wall", "-o", tmp, str(SOURCE)],
                            capture_output=True, text=True, timeout=120)
        if cp.returncode != 0:
            raise WanError(f"compiling {SOURCE} with {cc} failed: {cp.stderr.strip()}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, binary)  # atomic: concurrent builders both end with a whole binary
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return binary
