"""A real ``airflow api-server`` for tests that need the UI's backend (plugins, forms): the benchmarks' launcher
(``fstream_bench.airflow.api_server``) with the tests' password, and a browser page logged in to it."""

from __future__ import annotations

import contextlib
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from fstream_bench.airflow.api_server import login, serve
from fstream_bench.airflow.browser import CHROMIUM, CHROMIUM_ARGS

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
    """The base URL of an api-server (``fstream_bench.airflow.api_server.serve``) on ``env``'s AIRFLOW_HOME (migrated)
    with the simple auth manager and one user, ``admin`` (password ``PASSWORD``; ``token`` logs in): a request
    without its token is refused. ``all_admins``: everyone is an admin instead (``GET /auth/token`` hands out a
    token). The auth manager's passwords file is ``AIRFLOW_HOME/test-passwords.json``."""
    with serve(env, password=PASSWORD, all_admins=all_admins, passwords_file="test-passwords.json") as (base, _proc):
        yield base


def token(base: str, user: str = "admin", password: str = PASSWORD) -> str:
    """Log in as ``user`` (default ``admin``): the JWT the UI would hold."""
    return login(base, user, password)


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
