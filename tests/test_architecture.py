"""The house's rules that are not import arrows: modules readable in one sitting, every room under contract.

The arrows themselves are checked by ``lint-imports`` (``.importlinter``, run by ``make test``); this
file also runs it, so a plain ``pytest`` catches a broken contract too.
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = ("fstream_provider", "transfer_agent", "bench", "fstream_demo")
MAX_LINES = 500


def test_no_source_module_over_one_sitting() -> None:
    too_long = []
    for top in SOURCE_ROOTS:
        for path in (ROOT / top).rglob("*.py"):
            n = sum(1 for _ in path.open(encoding="utf-8"))
            if n > MAX_LINES:
                too_long.append(f"{path.relative_to(ROOT)}: {n} lines")
    assert not too_long, f"split these by responsibility (limit {MAX_LINES} lines): {too_long}"


def _contracts() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / ".importlinter")
    return cfg


def test_every_provider_room_is_under_a_contract() -> None:
    """A new subpackage of fstream_provider must be placed in the layers (so its arrows are checked)."""
    layers = _contracts()["importlinter:contract:layers"]["layers"]
    named = {part.strip() for line in layers.split("\n") for part in line.split("|")}
    rooms = {f"fstream_provider.{p.name}" for p in (ROOT / "fstream_provider").iterdir()
             if (p / "__init__.py").exists()}
    missing = rooms - named
    assert not missing, f"place these rooms in .importlinter's layers contract: {sorted(missing)}"


def test_import_contracts_hold() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert exe, "lint-imports (import-linter) is not installed: it is in the test extras"
    r = subprocess.run([exe, "--config", str(ROOT / ".importlinter")], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_every_module_says_what_it_owns() -> None:
    """Every source module opens with a docstring (the room's map in docs/architecture.md relies on them)."""
    import ast

    silent = []
    for top in SOURCE_ROOTS:
        for path in (ROOT / top).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            if not (ast.get_docstring(tree) or "").strip():
                silent.append(str(path.relative_to(ROOT)))
    assert not silent, f"give these modules a one-line docstring saying what they own: {silent}"
