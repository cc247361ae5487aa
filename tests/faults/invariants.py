"""The fault suite's invariant check (issue 8, DESIGN.md "Rules for never losing data").

After every fault case:

1. every visible destination file matches the source manifest (a hash the source had);
2. no temp files (``.NAME.<job>.<attempt>.part`` or a ``.meta`` sidecar) are left once the job ended;
3. every file of the job is accounted for: at the destination and verified, or reported failed
   with a reason naming the cause (or retryable, i.e. resumable) — none silently vanished.

Used by the tests under ``tests/faults`` and by ``fstream bench soak`` (``bench/soak/check.py`` has
its own copy of the same checks, since the bench package must not import from tests).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable


def digest(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_temp(name: str) -> bool:
    """A receiver temp name: a ``.part`` file, its ``.meta`` ranges sidecar, or the sidecar's own temp."""
    return name.endswith(".meta") or (name.startswith(".") and (name.endswith(".part") or ".part." in name))


def manifest(src: Path, prefix: str = "") -> dict[str, set[str]]:
    """{destination relpath: {acceptable sha256}} for every file under ``src`` (now)."""
    out: dict[str, set[str]] = {}
    for p in sorted(Path(src).rglob("*")):
        if p.is_file():
            rel = p.relative_to(src).as_posix()
            out[f"{prefix.strip('/')}/{rel}" if prefix.strip("/") else rel] = {digest(p)}
    return out


def merge(*manifests: dict[str, set[str]]) -> dict[str, set[str]]:
    """Union of acceptable contents (a file modified mid-send may be either version, never a mix)."""
    out: dict[str, set[str]] = {}
    for m in manifests:
        for k, v in m.items():
            out.setdefault(k, set()).update(v)
    return out


def scan(dst: Path) -> tuple[dict[str, Path], list[str]]:
    """(visible files by relpath, temp files) under ``dst``."""
    visible: dict[str, Path] = {}
    temps: list[str] = []
    for dirpath, _dirs, files in os.walk(dst):
        for name in files:
            p = Path(dirpath) / name
            rel = p.relative_to(dst).as_posix()
            (temps.append(rel) if is_temp(name) else visible.__setitem__(rel, p))
    return visible, sorted(temps)


@dataclass
class Report:
    """What the check found; ``problems`` empty means every invariant held."""

    verified: list[str] = field(default_factory=list)
    accounted: dict[str, str] = field(default_factory=dict)  # rel -> failure reason
    problems: list[str] = field(default_factory=list)
    temps: list[str] = field(default_factory=list)

    def assert_ok(self) -> "Report":
        assert not self.problems, "invariants violated:\n  " + "\n  ".join(self.problems)
        return self


def check(dst: Path, expected: dict[str, set[str]], *, results: Iterable[dict | None] = (),
          job_ended: bool = True, cause: str | None = None, require: Iterable[str] | None = None) -> Report:
    """Check the invariants of ``dst`` against ``expected`` (see the module doc).

    :param results: the senders' ``--json`` results (the last one that names a file wins).
    :param job_ended: False while a killed job may still resume: temps allowed, missing files allowed.
    :param cause: a regex a failure reason must match to account for a missing file (e.g. "disk full").
    :param require: relpaths that must be visible and verified whatever the results say.
    """
    rep = Report()
    visible, rep.temps = scan(dst)
    for rel, p in sorted(visible.items()):
        want = expected.get(rel)
        if want is None:
            rep.problems.append(f"{rel}: visible at the destination but not in the source manifest")
        elif digest(p) not in want:
            rep.problems.append(f"{rel}: visible with content that matches no source version (torn or mixed)")
        else:
            rep.verified.append(rel)
    if not job_ended:
        return rep
    if rep.temps:
        rep.problems.append(f"temp files left after the job ended: {rep.temps}")
    reasons: dict[str, dict] = {}
    for res in results:
        for f in (res or {}).get("failures", []):
            reasons[str(f.get("dest"))] = f
    for rel in sorted(set(expected) - set(rep.verified)):
        f = reasons.get(rel)
        if f is None:
            rep.problems.append(f"{rel}: not at the destination and no failure reported (silently lost)")
            continue
        reason = str(f.get("reason", ""))
        if cause is not None and not re.search(cause, reason, re.I):
            rep.problems.append(f"{rel}: failed with {reason!r}, which does not name the cause /{cause}/")
        elif not reason.strip():
            rep.problems.append(f"{rel}: failed without a reason")
        else:
            rep.accounted[rel] = reason
    for rel in require or ():
        if rel not in rep.verified:
            rep.problems.append(f"{rel}: required at the destination, verified; it is not "
                                f"({rep.accounted.get(rel, 'missing')})")
    return rep
