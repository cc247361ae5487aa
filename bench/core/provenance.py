"""What a result measured: command, commit, a hash of the code it exercised, machine, load, time.

Every benchmark writes ``provenance`` into its result file (``start`` before the first run,
``finish`` after the last). ``fstream bench report --check`` recomputes ``code_hash`` over the
same files and calls a result stale when it differs: a number whose code has changed since is
stale until re-measured or carried (BENCHMARKS.md, "Goals at a glance").

Since issue 42 the hash covers the code the benchmark's processes ran, not whole packages:
``start`` puts ``_site/sitecustomize.py`` first on ``PYTHONPATH``, so every Python process the
benchmark starts (and this one) records each FStream module it imports; ``finish`` turns the names
into the repository's files (a package's ``__init__.py`` and its non-Python sources beside it, the
native module's Rust crate) and hashes those, listed in ``files``. A module no process imported
cannot stale the result; a change to any that one did, does. ``modules`` keeps the benchmark's
declared list (what results before issue 42 were hashed over, package by package).

The hash is taken over each module's syntax tree with docstrings dropped, written back as source
(``ast.unparse``: the same text on every Python that parses it, where ``ast.dump``'s fields change
between versions), so a comment, a blank line or a reworded docstring does not stale a result and
any change to what runs does.
Modules are named by import name (``transfer_agent``, ``fstream_bench.datapath.loopback``); a package
stands for every source file under it (``.py`` by syntax tree; ``.c``, ``.h``, ``.rs`` byte for byte).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fstream_bench.core.report import machine_info

#: What most benchmarks that start real agents exercise: the agent, everything it imports from
#: the provider side, and the benchmark's own harness pieces are added per benchmark.
AGENT = ("transfer_agent", "fstream_provider.authz",
         "fstream_provider.model", "fstream_provider.tuning", "fstream_provider.watch",
         "fstream_provider.bus")


#: What a package's code is made of: Python, the C some benchmarks compile (bench/wan's delay line), and the
#: pages and scripts the UI plugin serves (``fstream_provider/ui/pages``: what ``bench live-view`` measures).
SOURCE_SUFFIXES = (".py", ".c", ".h", ".rs", ".html", ".js")


def _files(module: str) -> list[tuple[str, Path]]:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None and not spec.submodule_search_locations:
        raise LookupError(f"provenance: module {module!r} is not importable")
    if spec.submodule_search_locations:  # a package: every .py file under it
        root = Path(next(iter(spec.submodule_search_locations)))
        return [(module + "/" + p.relative_to(root).as_posix(), p) for p in sorted(root.rglob("*"))
                if p.suffix in SOURCE_SUFFIXES and p.is_file() and "__pycache__" not in p.parts]
    return [(module, Path(spec.origin))]


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def code_hash(modules: list[str] | tuple[str, ...]) -> str:
    """sha256 over the docstring- and comment-free source of ``modules`` (sorted, each named)."""
    h = hashlib.sha256()
    for name, path in sorted({f for m in modules for f in _files(m)}):
        h.update(name.encode() + b"\0" + _body(path) + b"\0")
    return "sha256:" + h.hexdigest()


REPO = Path(__file__).resolve().parents[2]
RECORD_ENV = "FSTREAM_PROVENANCE_RECORD"
SITE_DIR = Path(__file__).resolve().parent / "_site"
ROOTS = ("transfer_agent", "fstream_provider", "fstream_bench", "fstream_demo")
#: what recording a result is, not what was measured: never hashed
NOT_MEASURED = ("fstream_bench.core.provenance",)
#: the native module's source: the crate it is built from (``native/``, issue 29)
NATIVE = ("native/Cargo.toml", "native/Cargo.lock", "native/src")


def record_imports() -> Path:
    """Record every FStream module this process and its children import from now on; returns the directory.

    A second call (a benchmark that starts another inside its run) reuses the first's directory.
    """
    have = os.environ.get(RECORD_ENV)
    if have and Path(have).is_dir():
        return Path(have)
    rec = Path(tempfile.mkdtemp(prefix="fstream-provenance-"))
    rec.chmod(0o1777)  # a benchmark's child may run as another user (the new-user checks)
    os.environ[RECORD_ENV] = str(rec)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE_DIR), os.environ.get("PYTHONPATH")) if p)
    spec = importlib.util.spec_from_file_location("_fstream_provenance_site", SITE_DIR / "sitecustomize.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # this process records too
    (rec / f"{os.getpid()}.loaded").write_text("\n".join(_loaded()) + "\n")
    return rec


def _loaded() -> list[str]:
    return sorted(m for m in list(sys.modules) if m.partition(".")[0] in ROOTS)


def _module_files(name: str) -> list[Path]:
    """The files that are module ``name``'s code: its source, or for a package its ``__init__`` and the
    non-Python sources in its directory that no subpackage owns; an extension module: its crate."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []  # a name tried and not found (an optional module): nothing of ours ran
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return []
    origin = Path(spec.origin)
    if origin.suffix in (".so", ".pyd"):
        return [p for n in NATIVE for p in ([REPO / n] if (REPO / n).is_file() else sorted((REPO / n).rglob("*.rs")))]
    out = [origin]
    if spec.submodule_search_locations and origin.name == "__init__.py":
        root = origin.parent
        for p in sorted(root.rglob("*")):
            if p.suffix in SOURCE_SUFFIXES and p.suffix != ".py" and p.is_file() and "__pycache__" not in p.parts \
                    and not any((d / "__init__.py").exists() for d in p.parents if root in d.parents):
                out.append(p)
    return out


def recorded_files(rec: Path) -> list[str]:
    """Repository-relative paths of the code the recorded processes imported (sorted, unique)."""
    names = set(_loaded())
    for f in rec.iterdir():
        if f.suffix in (".imports", ".loaded"):
            names.update(n for n in f.read_text().split() if n)
    files = set()
    for name in names - set(NOT_MEASURED):
        for p in _module_files(name):
            try:
                files.add(p.resolve().relative_to(REPO).as_posix())
            except ValueError:
                continue  # not this checkout's code (a worktree's side of an A/B)
    return sorted(files)


def files_hash(files: list[str] | tuple[str, ...], root: Path = REPO) -> str:
    """sha256 over ``files`` (repository-relative) as ``code_hash`` normalises them; a missing file raises LookupError."""
    h = hashlib.sha256()
    for rel in sorted(set(files)):
        path = root / rel
        if not path.is_file():
            raise LookupError(f"provenance: {rel} no longer exists")
        h.update(rel.encode() + b"\0" + _body(path) + b"\0")
    return "sha256:" + h.hexdigest()


def _body(path: Path) -> bytes:
    if path.suffix == ".py":
        return ast.unparse(_strip_docstrings(ast.parse(path.read_bytes(), filename=str(path)))).encode()
    return path.read_bytes()  # native sources (the WAN delay line's C, the crate's Rust), the UI's pages


def current_hash(prov: dict, root: Path = REPO) -> str:
    """What ``prov``'s code hashes to today: over its recorded ``files``, or (before issue 42) its ``modules``."""
    if prov.get("files"):
        return files_hash(prov["files"], root)
    return code_hash(prov["modules"])


def _git(*args: str) -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def start(bench: str, args: list[str], modules: list[str] | tuple[str, ...]) -> dict:
    """The provenance block of a run that starts now.

    ``bench`` is the subcommand (``fstream bench BENCH``) and ``args`` the words that followed it,
    so ``command`` reruns the measurement.
    """
    mods = sorted(set(modules))
    rec = record_imports()
    return {
        "record": str(rec),
        "bench": bench,
        "command": "fstream bench " + shlex.join([bench, *args]),
        "commit": _git("rev-parse", "HEAD") or "unknown",
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "modules": mods,
        "code_hash": code_hash(mods),
        "machine": machine_info(),
        "python": platform.python_version(),
        "load_start": list(os.getloadavg()),
        "started_unix": time.time(),
    }


def finish(prov: dict) -> dict:
    """Add the load average, the time at the end of the run and the code the run's processes imported:
    ``files`` and their ``code_hash`` (returns the same dict)."""
    prov["load_end"] = list(os.getloadavg())
    prov["finished_unix"] = time.time()
    rec = prov.pop("record", None)
    if rec and Path(rec).is_dir():
        prov["files"] = recorded_files(Path(rec))
        prov["code_hash"] = files_hash(prov["files"])
        if os.environ.get(RECORD_ENV) == rec:
            del os.environ[RECORD_ENV]
        shutil.rmtree(rec, ignore_errors=True)
    return prov
