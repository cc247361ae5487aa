"""How a received file is hashed (``storage.hash_plan``, issue 42): one decision from its size, algorithm and
whether the sender verifies, the same with and without the native module except where the tree needs it."""

from __future__ import annotations

import pytest

from transfer_agent.storage import hash_plan, tree_hash
from transfer_agent.storage.hash_plan import AHEAD_MIN, TREE_MIN

MiB = 1 << 20


@pytest.mark.skipif(not tree_hash.NATIVE, reason="the native module _blake3tree is not built here")
def test_with_the_native_module_blake3_files_from_one_mib_are_hashed_from_their_blocks() -> None:
    for algo in ("blake3", "blake3-keyed"):
        assert hash_plan.plan(TREE_MIN - 1, algo) == "at_commit"
        assert hash_plan.plan(TREE_MIN, algo) == "tree"
        assert hash_plan.plan(AHEAD_MIN + 1, algo) == "tree"
    # xxh3 has no tree: a large file is read back while it arrives, a small one at commit
    assert hash_plan.plan(AHEAD_MIN - 1, "xxh3_128") == "at_commit"
    assert hash_plan.plan(AHEAD_MIN, "xxh3_128") == "ahead"


def test_without_the_native_module_large_files_are_read_back_while_they_arrive(monkeypatch) -> None:
    monkeypatch.setattr(tree_hash, "NATIVE", False)
    for algo in ("xxh3_128", "blake3", "blake3-keyed"):
        assert hash_plan.plan(TREE_MIN, algo) == "at_commit"
        assert hash_plan.plan(AHEAD_MIN - 1, algo) == "at_commit"
        assert hash_plan.plan(AHEAD_MIN, algo) == "ahead"


def test_a_sender_that_does_not_verify_has_nothing_hashed() -> None:
    assert {hash_plan.plan(n, "blake3-keyed", verify=False) for n in (0, TREE_MIN, 40 * MiB)} == {"none"}
