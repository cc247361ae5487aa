"""The soak's view of the destination: temp names, progress scans and the final invariant check."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

MiB = 1 << 20


def is_temp(name: str) -> bool:
    """A receiver temp name (same rule as tests/faults/invariants.py)."""
    return name.endswith(".meta") or (name.startswith(".") and (name.endswith(".part") or ".part." in name))


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MiB), b""):
            h.update(chunk)
    return h.hexdigest()


def scan(dst: Path) -> tuple[int, int, int]:
    """(visible files, bytes allocated to part files, temp files) under ``dst``: the soak's progress signal."""
    visible = part = temps = 0
    for dirpath, _d, files in os.walk(dst):
        for name in files:
            if is_temp(name):
                temps += 1
                try:
                    part += os.stat(os.path.join(dirpath, name)).st_blocks * 512
                except FileNotFoundError:
                    pass
            else:
                visible += 1
    return visible, part, temps


def check(src: Path, dst: Path) -> dict:
    """The invariants: every source file at ``dst`` with its content, no temps, nothing foreign or torn."""
    want: dict[str, str] = {}
    total = 0
    for p in sorted(src.rglob("*")):
        if p.is_file() and not p.name.startswith("."):
            rel = p.relative_to(src).as_posix()
            want[rel] = sha256(p)
            total += p.stat().st_size
    visible: dict[str, Path] = {}
    temps: list[str] = []
    if dst.exists():
        for dirpath, _d, files in os.walk(dst):
            for name in files:
                p = Path(dirpath) / name
                rel = p.relative_to(dst).as_posix()
                (temps.append(rel) if is_temp(name) else visible.__setitem__(rel, p))
    corrupted = sorted(r for r, p in visible.items() if r in want and sha256(p) != want[r])
    unexpected = sorted(r for r in visible if r not in want)
    lost = sorted(r for r in want if r not in visible)
    problems = []
    if corrupted:
        problems.append(f"{len(corrupted)} visible file(s) with content that matches no source: {corrupted[:10]}")
    if temps:
        problems.append(f"{len(temps)} temp file(s) left: {temps[:10]}")
    if lost:
        problems.append(f"{len(lost)} source file(s) not at the destination: {lost[:10]}")
    if unexpected:
        problems.append(f"{len(unexpected)} visible file(s) not in the source: {unexpected[:10]}")
    return {"source_files": len(want), "source_bytes": total, "verified": len(visible) - len(corrupted) -
            len(unexpected), "corrupted": len(corrupted), "temps": len(temps), "lost": len(lost),
            "unexpected": len(unexpected), "problems": problems}
