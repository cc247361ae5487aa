"""GridFTP peer: a private anonymous ``globus-gridftp-server`` at the destination, ``globus-url-copy`` at the source.

Two settings are compared, as every seed does: Globus-like fixed presets by average file size
(DESIGN.md "globus baseline": cc = 2; p = 2/4/4; pp = 20/5/1 below 50 MB, 50-250 MB, above
250 MB — ``globus-url-copy`` has only an on/off ``-pp`` switch, so pp > 1 means "on"), and the
settings of our static heuristic (thesis ch. 2 Alg. 1 as DESIGN.md reads it).
"""

from __future__ import annotations

import getpass
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence
from urllib.parse import quote

from fstream_bench.peers.base import (PeerError, PeerResult, Sites, free_port, log_tail, run_client, spawn, stop,
                                      wait_listening)

MB = 1_000_000


def available() -> str | None:
    """Return None when both GridFTP programs are installed, else the reason they cannot run."""
    missing = [p for p in ("globus-url-copy", "globus-gridftp-server") if not shutil.which(p)]
    if missing:
        return (f"{' and '.join(missing)} not installed "
                "(apt-get install globus-gass-copy-progs globus-gridftp-server-progs)")
    return None


@dataclass(frozen=True)
class GridSettings:
    """Knobs ``globus-url-copy`` takes.

    :param cc: concurrent files (``-cc``).
    :param p: parallel TCP streams per file (``-p``).
    :param pp: pipelining depth the preset asks for; ``globus-url-copy`` only has ``-pp`` on/off.
    :param why: where the numbers came from.
    """

    cc: int
    p: int
    pp: int
    why: str = ""

    def as_dict(self) -> dict:
        return {"cc": self.cc, "p": self.p, "pp": self.pp, "why": self.why}


def globus_preset(avg_file_size: float) -> GridSettings:
    """Globus-like fixed presets by average file size (DESIGN.md; SEAL §3.1, HARP §V)."""
    if avg_file_size < 50 * MB:
        return GridSettings(2, 2, 20, "globus preset <50MB")
    if avg_file_size <= 250 * MB:
        return GridSettings(2, 4, 5, "globus preset 50-250MB")
    return GridSettings(2, 4, 1, "globus preset >250MB")


def static_heuristic(*, avg_file_size: float, file_count: int, bandwidth_bps: float, rtt_s: float,
                     tcp_buffer: int, max_cc: int = 32) -> GridSettings:
    """The static heuristic's (cc, p, pp): the project's own ``tuning.heuristic`` run once on the whole set."""
    from fstream_provider.tuning.base import PathInfo
    from fstream_provider.tuning.heuristic import heuristic

    path = PathInfo(bandwidth_bps=bandwidth_bps, rtt_s=rtt_s, tcp_buffer=tcp_buffer, max_cc=max_cc)
    s = heuristic(max(avg_file_size, 1.0), max(file_count, 1), path)
    return GridSettings(s.cc, s.p, s.pp, "static heuristic")


def _resolvable(sites: Sites, workdir: Path, argv: list[str]) -> list[str]:
    """Wrap ``argv`` so the Globus libraries can resolve the namespace addresses.

    Inside a network namespace the host's DNS server is unreachable, and the Globus XIO stack
    reverse-resolves its own address ("Temporary failure in name resolution"). The wrapper
    bind-mounts a private hosts file naming both sites over /etc/hosts in a private mount
    namespace (root only; nothing on the host changes). On loopback it changes nothing.
    """
    if not (sites.src_prefix or sites.dst_prefix):
        return argv
    hosts = Path(workdir) / "hosts"
    if not hosts.exists():
        base = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else "127.0.0.1 localhost\n"
        hosts.write_text(base + f"\n{sites.src_host} fstream-bench-src\n{sites.dst_host} fstream-bench-dst\n")
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"',
            str(hosts), *argv]


class GridFTPServer:
    """A private anonymous GridFTP server listening only on the destination address.

    :param sites: where to run it (``dst``) and the address to bind.
    :param workdir: directory for its log.
    :param port: control port (0: pick a free one).
    """

    def __init__(self, *, sites: Sites, workdir: Path, port: int = 0) -> None:
        self.sites = sites
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.proc = None

    def __enter__(self) -> "GridFTPServer":
        why = available()
        if why:
            raise PeerError(why)
        self.workdir.mkdir(parents=True, exist_ok=True)
        user = getpass.getuser()
        argv = ["globus-gridftp-server", "-aa", "-anonymous-user", user, "-p", str(self.port), "-d", "error",
                "-control-interface", self.sites.dst_host, "-data-interface", self.sites.dst_host,
                "-disable-usage-stats"]
        if os.geteuid() == 0:
            argv.insert(4, "-allow-root")
        self.log = self.workdir / "gridftp-server.log"
        self.proc = spawn(self.sites, "dst", _resolvable(self.sites, self.workdir, argv), log_path=self.log)
        try:
            wait_listening(self.sites, "dst", self.port, self.proc, "globus-gridftp-server")
        except BaseException:
            stop(self.proc)
            raise
        return self

    def __exit__(self, *exc) -> None:
        stop(self.proc)

    def url(self, path: Path) -> str:
        return f"ftp://{self.sites.dst_host}:{self.port}{quote(str(Path(path).resolve()))}"


def copy(server: GridFTPServer, files: Sequence[Path], src_root: Path, dest_dir: Path, settings: GridSettings, *,
         label: str = "gridftp", verify: bool = False, timeout: float = 1800.0) -> PeerResult:
    """Copy ``files`` (under ``src_root``) to ``dest_dir`` on ``server`` with ``globus-url-copy``.

    Runs at the source site in "put" mode: the client reads local files and the server writes.
    """
    files = [Path(f) for f in files]
    src_root = Path(src_root).resolve()
    dest_dir = Path(dest_dir).resolve()
    listing = server.workdir / f"{label}.urls"
    lines = []
    total = 0
    for f in files:
        rel = f.resolve().relative_to(src_root)
        total += f.stat().st_size
        lines.append(f'"file://{quote(str(f.resolve()))}" "{server.url(dest_dir / rel)}"')
    listing.write_text("\n".join(lines) + "\n")
    argv = ["globus-url-copy", "-fast", "-cd", "-p", str(settings.p), "-cc", str(settings.cc)]
    if settings.pp > 1:
        argv.append("-pp")
    if verify:
        argv.append("-verify-checksum")
    argv += ["-f", str(listing)]
    log = server.workdir / f"{label}.log"
    done = run_client(server.sites.argv("src", _resolvable(server.sites, server.workdir, argv)), timeout, log)
    status, wall = done.status, done.wall
    result = PeerResult(tool=label, settings={**settings.as_dict(), "verify": verify}, files=len(files),
                        bytes=total, seconds=wall, ok=status == 0, verified=verify, cpu_src_s=done.cpu_s)
    if status != 0:
        result.error = f"globus-url-copy: status {status}: {log_tail(log, 400)}"
        return result
    missing = [f for f in files
               if not (dest_dir / f.resolve().relative_to(src_root)).is_file()
               or (dest_dir / f.resolve().relative_to(src_root)).stat().st_size != f.stat().st_size]
    if missing:
        result.ok = False
        result.error = f"globus-url-copy: {len(missing)} files missing or short at the destination, e.g. {missing[0]}"
    return result
