"""What a result measured: command, commit, a hash of the code it exercised, machine, load, time.

Every benchmark writes ``provenance`` into its result file (``start`` before the first run,
``finish`` after the last). ``fstream bench report --check`` recomputes ``code_hash`` over the
same modules and calls a result stale when it differs: a number whose code has changed since is
stale until re-measured (BENCHMARKS.md, "Goals at a glance").

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
import subprocess
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
        if path.suffix == ".py":
            body = ast.unparse(_strip_docstrings(ast.parse(path.read_bytes(), filename=str(path)))).encode()
        else:  # native sources (the WAN delay line's C), the UI's pages: byte for byte
            body = path.read_bytes()
        h.update(name.encode() + b"\0" + body + b"\0")
    return "sha256:" + h.hexdigest()


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
    return {
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
    """Add the load average and the time at the end of the run (returns the same dict)."""
    prov["load_end"] = list(os.getloadavg())
    prov["finished_unix"] = time.time()
    return prov
