"""A real ``airflow api-server`` on a free port, and logging in to it: the one launcher of tests and benchmarks."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from fstream_provider.bus.embedded import free_port


@contextlib.contextmanager
def serve(env: dict[str, str], *, password: str, all_admins: bool = False, jwt_secret: str | None = None,
          secret_key: str | None = None, passwords_file: str = "api-server-passwords.json",
          timeout: float = 180.0) -> Iterator[tuple[str, subprocess.Popen]]:
    """``(base URL, process)`` of an api-server (one worker, its own process group, stopped by its pid) on ``env``'s
    AIRFLOW_HOME (migrated), with the simple auth manager and one user, ``admin`` (password ``password``; ``login``
    logs in): a request without its token is refused.

    :param all_admins: everyone is an admin instead (``GET /auth/token`` hands out a token).
    :param jwt_secret: the JWT signing secret (default: a random one).
    :param secret_key: the API's secret key (default: a random one).
    :param passwords_file: the simple auth manager's passwords file, in AIRFLOW_HOME (it adds the passwords it
        generates for other users there).
    :param timeout: seconds the server has to answer ``/api/v2/monitor/health``.
    """
    port, home = free_port(), Path(env["AIRFLOW_HOME"])
    passwords = home / passwords_file
    passwords.write_text(json.dumps({"admin": password}))
    base = f"http://127.0.0.1:{port}"
    env = dict(env, AIRFLOW__API__HOST="127.0.0.1", AIRFLOW__API__PORT=str(port), AIRFLOW__API__BASE_URL=base,
               AIRFLOW__API_AUTH__JWT_SECRET=jwt_secret or secrets.token_hex(24),
               AIRFLOW__API__SECRET_KEY=secret_key or secrets.token_hex(16),
               AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=str(all_admins),
               AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
               AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(passwords))
    log_path = home / f"api-server-{port}.log"
    with open(log_path, "a") as log:
        proc = subprocess.Popen([sys.executable, "-m", "airflow", "api-server", "--port", str(port), "--workers", "1"],
                                env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not is_up(base):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("api-server did not come up:\n" + log_path.read_text(errors="replace")[-3000:])
            time.sleep(0.5)  # polling another process with a deadline
        yield base, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def is_up(base: str) -> bool:
    """True when the api-server at ``base`` answers its health check."""
    with contextlib.suppress(urllib.error.URLError, ConnectionError, OSError):
        urllib.request.urlopen(base + "/api/v2/monitor/health", timeout=5).close()
        return True
    return False


def login(base: str, user: str, password: str) -> str:
    """Log in as ``user``: the JWT the UI would hold."""
    req = urllib.request.Request(base + "/auth/token", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"username": user, "password": password}).encode())
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["access_token"]
