"""A private OpenSSH server at the destination, for the rsync-over-SSH and SFTP peers."""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from pathlib import Path

from fstream_bench.peers.base import PeerError, Sites, free_port, spawn, stop, wait_listening

SSHD = "/usr/sbin/sshd"


def available() -> str | None:
    """Return None when sshd, ssh and ssh-keygen are installed, else why not."""
    if not os.path.exists(SSHD):
        return f"{SSHD} not installed (apt-get install openssh-server)"
    for tool in ("ssh", "ssh-keygen"):
        if not shutil.which(tool):
            return f"{tool} not installed (apt-get install openssh-client)"
    return None


class PrivateSshd:
    """``sshd -D`` on its own port, host key and client key, accepting only that key.

    :param sites: where it runs (``dst``) and the address it listens on.
    :param workdir: directory for keys, config and log (removed by nobody: the caller owns it).
    :param port: port (0: pick a free one).
    """

    def __init__(self, *, sites: Sites, workdir: Path, port: int = 0) -> None:
        self.sites = sites
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.user = getpass.getuser()
        self.proc = None

    @property
    def client_key(self) -> Path:
        return self.workdir / "client_ed25519"

    def __enter__(self) -> "PrivateSshd":
        why = available()
        if why:
            raise PeerError(why)
        d = self.workdir
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        for key in ("host_ed25519", "client_ed25519"):
            if not (d / key).exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
        (d / "authorized_keys").write_text((d / "client_ed25519.pub").read_text())
        os.chmod(d / "authorized_keys", 0o600)
        (d / "sshd_config").write_text("\n".join([
            f"Port {self.port}", f"ListenAddress {self.sites.dst_host}", f"HostKey {d / 'host_ed25519'}",
            f"AuthorizedKeysFile {d / 'authorized_keys'}", f"PidFile {d / 'sshd.pid'}",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password", "StrictModes no", "UsePAM no", f"AllowUsers {self.user}",
            "Subsystem sftp internal-sftp", "LogLevel ERROR", "",
        ]))
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege-separation dir sshd insists on
        self.log = d / "sshd.log"
        self.proc = spawn(self.sites, "dst", [SSHD, "-D", "-e", "-f", str(d / "sshd_config")], log_path=self.log)
        try:
            wait_listening(self.sites, "dst", self.port, self.proc, "sshd")
        except BaseException:
            stop(self.proc)
            raise
        return self

    def __exit__(self, *exc) -> None:
        stop(self.proc)

    def ssh_command(self) -> list[str]:
        """The ``ssh`` argv (without host) that reaches this server non-interactively."""
        return ["ssh", "-p", str(self.port), "-i", str(self.client_key), "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=no", "-o", f"UserKnownHostsFile={os.devnull}",
                "-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes"]
