"""A throw-away ``redis-server`` on a UNIX socket for a benchmark run: file sockets cross network namespaces, TCP to
127.0.0.1 does not (the WAN benches' agents run in the source namespace, the bench on the host)."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Self

from fstream_bench.core.children import end


class UnixRedis:
    """``redis-server`` without persistence listening on ``<directory>/redis.sock``, logging to ``redis.log`` beside
    it; entered once it answers PING.

    :param directory: where the socket and log go (the server's working directory).
    :param exe: the server binary (default: ``redis-server`` on PATH).
    """

    def __init__(self, directory: Path, exe: str | None = None) -> None:
        self.directory = Path(directory)
        self.sock = self.directory / "redis.sock"
        self.exe = exe
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.sock}"

    def __enter__(self) -> Self:
        self.directory.mkdir(parents=True, exist_ok=True)
        exe = self.exe or shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server is not installed: this benchmark needs a Redis")
        with open(self.directory / "redis.log", "ab") as log:  # the child holds its own copy
            self.proc = subprocess.Popen([exe, "--port", "0", "--unixsocket", str(self.sock), "--unixsocketperm",
                                          "777", "--save", "", "--appendonly", "no", "--dir", str(self.directory)],
                                         stdout=log, stderr=subprocess.STDOUT)
        import redis
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis(unix_socket_path=str(self.sock)).ping()
                return self
            except (redis.ConnectionError, FileNotFoundError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise SystemExit(f"redis-server on {self.sock} did not come up (see {self.directory}/redis.log)")
                threading.Event().wait(0.05)

    def flush(self) -> None:
        import redis
        redis.Redis(unix_socket_path=str(self.sock)).flushall()

    def keys(self) -> int:
        import redis
        return int(redis.Redis(unix_socket_path=str(self.sock)).dbsize())

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        end(self.proc, 10, None)
