"""``fstream agent --root DIR --allow-hardlinks`` (issue 42's refresh found it missing).

Issue 40 refuses files with several hard links by default; a policy file could allow them, the ``--root`` mode
could not. ``fstream bench stream --via-agent`` sends a million hard links of a few seeded files, so its agent
refused every file and the bench waited for ever. The flag reaches the guard that opens the files.
"""

from __future__ import annotations

import argparse
import os

import pytest

from transfer_agent.cli.jobs import _agent_policy
from transfer_agent.storage.contain import Guard


def _args(root, allow_hardlinks: bool = False) -> argparse.Namespace:
    return argparse.Namespace(policy=None, root=[str(root)], secret_file=None, allow_hardlinks=allow_hardlinks)


@pytest.fixture
def linked(tmp_path, monkeypatch):
    monkeypatch.setenv("FSTREAM_STATE_DIR", str(tmp_path / "state"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "seed.dat").write_bytes(b"x" * 100)
    os.link(src / "seed.dat", src / "link.dat")
    return src


def test_root_mode_refuses_a_hard_link_by_default(linked):
    guard = Guard(_agent_policy(_args(linked)).roots)
    with pytest.raises(Exception, match="hard links"):
        guard.open(str(linked / "link.dat"))


def test_allow_hardlinks_lets_the_guard_open_it(linked):
    guard = Guard(_agent_policy(_args(linked, allow_hardlinks=True)).roots)
    fd, st = guard.open(str(linked / "link.dat"))
    try:
        assert st.st_nlink == 2 and os.read(fd, 10) == b"x" * 10
    finally:
        os.close(fd)


def test_the_flag_with_a_policy_file_is_refused(linked, tmp_path):
    args = argparse.Namespace(policy=str(tmp_path / "p.toml"), root=[], secret_file=None, allow_hardlinks=True)
    with pytest.raises(ValueError, match="allow_hardlinks"):
        _agent_policy(args)
