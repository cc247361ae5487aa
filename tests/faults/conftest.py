"""Fixtures of the fault suite (issue 8): seeds, real agents as subprocesses, the emulated WAN.

- every test that takes a ``seed`` argument runs once per seed of ``FSTREAM_FAULT_SEEDS``
  (comma-separated, default ``1,2,3``);
- ``agents``: starts ``fstream receive``/``send`` subprocesses with a fresh secret and kills
  whatever is left after the test;
- ``fault_wan``: one emulated WAN path (200 Mbit/s, 20 ms) for the module, skipped without root
  or tools (like ``tests/test_wan.py``; a missing tool fails under ``FSTREAM_REQUIRE_WAN=1``,
  ``tests/wankit.py``), torn down with nothing left.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # invariants, faultkit (no __init__.py here)

from faultkit import Agents, seeds  # noqa: E402


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "seed" in metafunc.fixturenames:
        metafunc.parametrize("seed", seeds(), ids=lambda s: f"seed{s}")


@pytest.fixture
def fault_secret(tmp_path: Path) -> Path:
    p = tmp_path / "secret"
    p.write_text(secrets.token_hex(32) + "\n")
    p.chmod(0o600)
    return p


@pytest.fixture
def agents(tmp_path: Path, fault_secret: Path) -> Iterator[Agents]:
    a = Agents(tmp_path / "agents", fault_secret)
    try:
        yield a
    finally:
        a.cleanup()


@pytest.fixture(scope="module")
def fault_wan(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A 200 Mbit/s, 20 ms RTT emulated path for this module (namespaces removed afterwards)."""
    import wankit  # skip without root or TUN; without a tool skip too, or fail under FSTREAM_REQUIRE_WAN=1

    wankit.require_wan("WAN testbed")
    from fstream_bench.wan.path import WanConfig, WanPath

    old = os.environ.get("FSTREAM_STATE_DIR")
    os.environ["FSTREAM_STATE_DIR"] = str(tmp_path_factory.mktemp("wanstate"))
    try:
        path = WanPath(WanConfig.from_text(rate="200Mbit", rtt="20ms", buffer="1MiB",
                                           run_id="f" + secrets.token_hex(4)))
        with path:
            yield path
    finally:
        if old is None:
            os.environ.pop("FSTREAM_STATE_DIR", None)
        else:
            os.environ["FSTREAM_STATE_DIR"] = old
