"""SFTP sessions for the watcher's polling backend (paramiko; unknown host keys are refused), Airflow-free."""

from __future__ import annotations

from functools import partial
from typing import Any

from fstream_provider.watch.listing import LocationLister
from fstream_provider.watch.location import Location


class SFTPSession:
    """One SSH connection and its SFTP channel; a :class:`~fstream_provider.watch.listing.RemoteDir`.

    :param ssh: the connected ``paramiko.SSHClient``.
    :param sftp: its ``paramiko.SFTPClient``.
    """

    def __init__(self, ssh: Any, sftp: Any) -> None:
        self.ssh = ssh
        self.sftp = sftp

    def listdir_attr(self, path: str) -> list[Any]:
        return self.sftp.listdir_attr(path)

    def close(self) -> None:
        self.ssh.close()


def open_sftp(location: Location, *, key_file: str | None = None, password: str | None = None,
              known_hosts: str | None = None, timeout: float = 10.0) -> SFTPSession:
    """Connect with paramiko; unknown host keys are refused."""
    import paramiko

    ssh = paramiko.SSHClient()
    if known_hosts:
        ssh.load_host_keys(known_hosts)
    else:
        ssh.load_system_host_keys()
    ssh.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        ssh.connect(location.host, port=location.port, username=location.username, key_filename=key_file,
                    password=password, timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
                    allow_agent=False, look_for_keys=key_file is None and password is None)
        return SFTPSession(ssh, ssh.open_sftp())
    except Exception as exc:
        ssh.close()
        raise ConnectionError(f"SFTP {location.url()}: cannot connect ({type(exc).__name__}: {exc})") from exc


class Scanner(LocationLister):
    """Lists a :class:`Location`, locally or over one reused SFTP session (sync).

    :param location: where to look.
    :param pattern: glob on the relative path or the file name.
    :param recursive: descend into subdirectories.
    :param key_file: SSH private key for SFTP.
    :param password: SSH password for SFTP (prefer keys).
    :param known_hosts: known_hosts file to trust; unknown host keys are always refused.
    """

    def __init__(self, location: Location, *, pattern: str = "*", recursive: bool = False,
                 key_file: str | None = None, password: str | None = None,
                 known_hosts: str | None = None) -> None:
        super().__init__(location, pattern=pattern, recursive=recursive,
                         connect=partial(open_sftp, location, key_file=key_file, password=password,
                                         known_hosts=known_hosts))
