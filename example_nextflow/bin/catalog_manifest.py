#!/usr/bin/env python3
"""Turn an ``fstream send --manifest`` file into a TSV catalog of the landed files (path, size, algo, checksum).

Exits 1, naming the problem, when the manifest is empty or a record's status is neither
``committed`` nor ``skipped`` (skipped: the receiver already held the same bytes).
Nextflow puts this ``bin/`` directory on the PATH of every task.
"""

from __future__ import annotations

import json
import sys

LANDED = {"committed", "skipped"}


def main(manifest: str) -> int:
    with open(manifest) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if not records:
        print(f"{manifest}: empty, no file landed", file=sys.stderr)
        return 1
    bad = [r for r in records if r.get("status") not in LANDED]
    if bad:
        print(f"{manifest}: {len(bad)} file(s) not landed, e.g. {bad[0]}", file=sys.stderr)
        return 1
    print("path\tsize\talgo\tchecksum")
    for r in sorted(records, key=lambda r: r["path"]):
        print(f"{r['path']}\t{r['size']}\t{r['algo']}\t{r['checksum']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
