"""A real ``airflow api-server`` for tests that need the UI's backend (plugins, forms): started on a free port in
its own process group, stopped by its handle even when the test fails."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from fstream_provider.bus.embedded import free_port

PASSWORD = "fstream-test-admin-password"


def http(url: str, token: str | None = None) -> tuple[int, str, bytes]:
    """``(status, content type, body)`` of a GET; HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("content-type", ""), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read()


@contextlib.contextmanager
def api_server(env: dict[str, str], *, all_admins: bool = False) -> Iterator[str]:
    """An api-server on ``env``'s AIRFLOW_HOME (migrated) with the simple auth manager and one user, ``admin``
    (password ``PASSWORD``; ``token`` logs in): a request without its token is refused. ``all_admins``: everyone
    is an admin instead (``GET /auth/token`` hands out a token)."""
    port = free_port()
    home = Path(env["AIRFLOW_HOME"])
    passwords = home / "test-passwords.json"
    passwords.write_text(json.dumps({"admin": PASSWORD}))
    env = dict(env, AIRFLOW__API__HOST="127.0.0.1", AIRFLOW__API__PORT=str(port),
               AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{port}",
               AIRFLOW__API_AUTH__JWT_SECRET="fstream-test-jwt-secret-0123456789abcdef",
               AIRFLOW__API__SECRET_KEY="fstream-test", AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=str(all_admins),
               AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
               AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(passwords))
    log_path = home / f"api-server-{port}.log"
    with open(log_path, "a") as log:
        proc = subprocess.Popen([sys.executable, "-m", "airflow", "api-server", "--port", str(port), "--workers", "1"],
                                env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while not _up(base):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("api-server did not come up:\n" + log_path.read_text(errors="replace")[-3000:])
            time.sleep(0.5)  # polling another process with a deadline
        yield base
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def _up(base: str) -> bool:
    try:
        urllib.request.urlopen(base + "/api/v2/monitor/health", timeout=5).close()
        return True
    except (urllib.error.URLError, ConnectionError, OSError):
        return False


def token(base: str, user: str = "admin", password: str = PASSWORD) -> str:
    """Log in as ``user`` (default ``admin``): the JWT the UI would hold."""
    req = urllib.request.Request(base + "/auth/token", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"username": user, "password": password}).encode())
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["access_token"]


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@contextlib.contextmanager
def browser_page(base: str, jwt: str, **context: object) -> Iterator[object]:
    """A headless Debian Chromium page (Playwright) logged in to the api-server's UI with ``jwt`` (its cookie);
    ``context``: options of Playwright's ``new_context`` (``viewport``, ``timezone_id``, ``locale``)."""
    import shutil

    import pytest
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        if os.environ.get("FSTREAM_REQUIRE_WAN", "") not in ("", "0"):  # CI installed it (bench/install-deps.sh)
            raise AssertionError(f"{CHROMIUM} is missing although bench/install-deps.sh should have installed it")
        pytest.skip(f"{CHROMIUM} is not installed (bench/install-deps.sh installs it)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which(CHROMIUM) or CHROMIUM, args=CHROMIUM_ARGS)
        try:
            ctx = b.new_context(**context)
            ctx.add_cookies([{"name": "_token", "value": jwt, "url": base}])
            yield ctx.new_page()
        finally:
            b.close()


def plugin_frame(page: object, part: str, timeout: float = 30.0) -> object:
    """The frame whose URL holds ``part`` (the FStream plugin's page inside Airflow's UI), polled until ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for f in page.frames:
            if f is not page.main_frame and part in f.url:
                return f
        page.wait_for_timeout(100)
    raise AssertionError(f"no frame with {part!r} in {[f.url for f in page.frames]}")
