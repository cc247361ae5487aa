"""How a received file is hashed for its commit's check, decided in one place from its size and algorithm (issue 42).

* ``TREE``: from its blocks as they land (``tree_hash``; the native module and a BLAKE3 algorithm), from
  ``TREE_MIN`` on. Smaller files are hashed once at commit, read back while their pages are still cached:
  hashing a 256 KiB file in its data stream's thread cost 2000 such files 13 % of their throughput at the same
  CPU (BENCHMARKS §12, issue 29).
* ``AHEAD``: read back and hashed in order while the rest arrives (``checksum.PrefixHasher``), from
  ``AHEAD_MIN`` on, when the tree cannot be used: no native module, or ``xxh3_128``.
* ``AT_COMMIT``: read back whole at commit (``checksum.hash_fd``).
* ``NONE``: the sender does not verify (its COMMIT carries no digest): nothing is hashed.

Every way gives the same digest; they differ in when the bytes are read and by which thread.
"""

from __future__ import annotations

from typing import Literal

from transfer_agent.storage import tree_hash

TREE_MIN = 1 << 20
AHEAD_MIN = 32 << 20

Plan = Literal["tree", "ahead", "at_commit", "none"]
TREE: Plan = "tree"
AHEAD: Plan = "ahead"
AT_COMMIT: Plan = "at_commit"
NONE: Plan = "none"


def plan(size: int, algo: str, verify: bool = True) -> Plan:
    """How a received file of ``size`` bytes with ``algo`` digests is hashed in this process."""
    if not verify:
        return NONE
    if size >= TREE_MIN and tree_hash.usable(algo):
        return TREE
    if size >= AHEAD_MIN:
        return AHEAD
    return AT_COMMIT
