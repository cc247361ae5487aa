"""SFTP through paramiko against a private sshd (one connection, files one after another).

The client runs as ``python -m fstream_bench.peers.sftp`` at the source site, so on the emulated
WAN it runs inside the source namespace like every other tool.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path, PurePosixPath
from typing import Sequence

from fstream_bench.peers.base import PeerResult, log_tail, run_timed
from fstream_bench.peers.sshd import PrivateSshd
from fstream_bench.peers.sshd import available as sshd_available


def available() -> str | None:
    """Return None when paramiko and a private sshd can run, else why not."""
    try:
        import paramiko  # noqa: F401
    except ImportError:
        return "paramiko is not installed (pip install paramiko)"
    return sshd_available()


def copy(sshd: PrivateSshd, files: Sequence[Path], src_root: Path, dest_dir: Path, *, label: str = "sftp",
         timeout: float = 1800.0) -> PeerResult:
    """Upload ``files`` (relative to ``src_root``) into ``dest_dir`` with paramiko's SFTP client."""
    src_root = Path(src_root).resolve()
    rels = [str(Path(f).resolve().relative_to(src_root)) for f in files]
    total = sum(Path(f).stat().st_size for f in files)
    listing = sshd.workdir / f"{label}.files"
    listing.write_text("\n".join(rels) + "\n")
    argv = [sys.executable, "-m", "fstream_bench.peers.sftp", "--host", sshd.sites.dst_host, "--port",
            str(sshd.port), "--user", sshd.user, "--key", str(sshd.client_key), "--src-root", str(src_root),
            "--dest", str(Path(dest_dir).resolve()), "--files-from", str(listing)]
    log = sshd.workdir / f"{label}.log"
    status, wall, _ = run_timed(sshd.sites.argv("src", argv), timeout, log)
    result = PeerResult(tool=label, settings={"cc": 1, "p": 1, "pp": 0}, files=len(rels), bytes=total,
                        seconds=wall, ok=status == 0, verified=False,
                        extra={"note": "SFTP checks sizes only; SSH's MAC protects data in flight"})
    if status != 0:
        result.error = f"sftp client: status {status}: {log_tail(log, 400)}"
    return result


def _upload(host: str, port: int, user: str, key: str, src_root: Path, dest: str, rels: list[str]) -> None:
    import paramiko

    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect(host, port=port, username=user, key_filename=key, look_for_keys=False, allow_agent=False,
                   timeout=30)
    try:
        sftp = client.open_sftp()
        made: set[str] = set()

        def mkdirs(d: PurePosixPath) -> None:
            if str(d) in made or str(d) == "/":
                return
            mkdirs(d.parent)
            try:
                sftp.stat(str(d))
            except FileNotFoundError:
                sftp.mkdir(str(d))
            made.add(str(d))

        for rel in rels:
            target = PurePosixPath(dest) / rel
            mkdirs(target.parent)
            local = src_root / rel
            attrs = sftp.put(str(local), str(target), confirm=True)  # confirm: size check after upload
            if attrs.st_size != local.stat().st_size:
                raise RuntimeError(f"sftp: {rel}: remote size {attrs.st_size} != local {local.stat().st_size}")
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fstream_bench.peers.sftp", description=__doc__)
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--user", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--src-root", required=True)
    ap.add_argument("--dest", required=True)
    ap.add_argument("--files-from", required=True)
    a = ap.parse_args(argv)
    rels = [line for line in Path(a.files_from).read_text().splitlines() if line]
    _upload(a.host, a.port, a.user, a.key, Path(a.src_root), a.dest, rels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
