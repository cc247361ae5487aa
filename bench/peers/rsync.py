"""rsync over SSH to a private sshd: what most users run today (one stream, whole-file checksum)."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Sequence

from fstream_bench.peers.base import PeerResult, log_tail, run_timed
from fstream_bench.peers.sshd import PrivateSshd
from fstream_bench.peers.sshd import available as sshd_available


def available() -> str | None:
    """Return None when rsync and a private sshd can run, else why not."""
    if not shutil.which("rsync"):
        return "rsync is not installed (apt-get install rsync)"
    return sshd_available()


def copy(sshd: PrivateSshd, files: Sequence[Path], src_root: Path, dest_dir: Path, *, label: str = "rsync",
         timeout: float = 1800.0) -> PeerResult:
    """``rsync -a --files-from`` the given files (relative to ``src_root``) into ``dest_dir`` over SSH."""
    src_root = Path(src_root).resolve()
    dest_dir = Path(dest_dir).resolve()
    rels = [str(Path(f).resolve().relative_to(src_root)) for f in files]
    total = sum(Path(f).stat().st_size for f in files)
    listing = sshd.workdir / f"{label}.files"
    listing.write_text("\n".join(rels) + "\n")
    argv = ["rsync", "-a", "--whole-file", f"--files-from={listing}", "-e", shlex.join(sshd.ssh_command()),
            f"{src_root}/", f"{sshd.user}@{sshd.sites.dst_host}:{dest_dir}/"]
    # rsync creates only the last path component of the destination.
    dest_dir.mkdir(parents=True, exist_ok=True)
    log = sshd.workdir / f"{label}.log"
    status, wall, _ = run_timed(sshd.sites.argv("src", argv), timeout, log)
    result = PeerResult(tool=label, settings={"cc": 1, "p": 1, "pp": 0}, files=len(rels), bytes=total,
                        seconds=wall, ok=status == 0, verified=True,
                        extra={"note": "rsync checks a whole-file checksum of every file it transfers"})
    if status != 0:
        result.error = f"rsync: status {status}: {log_tail(log, 400)}"
    return result
