"""``fstream bench micro``'s entries that start the agent: one-byte ``send``, bytecode, ``gc`` and splice pipe A/Bs.

An A/B changes one thing in one checkout, in both processes of a side, through a ``python -c``
wrapper around ``transfer_agent.cli.main`` (both sides run the same wrapper, so its own cost
cancels); the pairs run in ABBA order on ``fstream_bench.datapath.ab``'s sides: sender pinned to CPU 0,
receiver to CPU 1 writing to tmpfs with ``--no-fsync``, CPU-s from ``wait4`` and the receiver's process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Callable

from fstream_bench.datapath import ab

from fstream_bench.core import runstats

from fstream_bench.core import vm_memory
from fstream_bench.datapath.micro_cpu import MIB, Ctx

REPO = Path(__file__).resolve().parents[2]


def agent_cmd(pre: str = "", post: str = "") -> str:
    """An ``fstream`` command that runs this checkout's CLI with ``pre`` before importing it and ``post`` after
    (the one thing an A/B changes); both sides of an A/B run through it, so its own cost cancels."""
    code = "\n".join(["import sys", pre, "import transfer_agent.cli.main as m", post,
                      "sys.argv[0] = 'fstream'", "sys.exit(m.main())"])
    return shlex.join([sys.executable, "-c", code])


def _ab(ctx: Ctx, name: str, a_cmd: str, b_cmd: str, count: int, size: int, opts: list[str], *,
        hold_bytes: int = 0, env: dict[str, str] | None = None) -> tuple[list[dict], str | None]:
    """``ctx.repeat`` pairs of sends of ``count`` files of ``size`` bytes, A then B, B then A, ...
    (``fstream_bench.datapath.ab``'s pinned sides); returns the pairs and the memory-hold note."""
    root = ctx.work / name
    root.mkdir()
    secret = root / "secret"
    secret.write_text(os.urandom(24).hex())
    secret.chmod(0o600)
    src = ab._make(root, count, size)
    case = f"{count} x {size} B"
    sides: list = []
    try:
        for side, cmd in (("A", a_cmd), ("B", b_cmd)):
            sides.append(ab.Side(side, cmd, None, secret, root / side.lower()))  # one by one: a failed B still closes A
            sides[-1].env.update(env or {})
        hold = vm_memory.held_free_pages(warm_bytes=hold_bytes) if hold_bytes else contextlib.nullcontext(None)
        with hold as note:
            pairs = ab.interleave(sides, ctx.repeat, {case: (count, size, opts)}, {case: src},
                                  log=lambda s: ctx.log(f"micro {name}: {s.removeprefix('ab: ')}"))
        return pairs[case], note
    finally:
        for s in sides:
            s.close()
        shutil.rmtree(root, ignore_errors=True)


def _ab_series(pairs: list[dict], a: str, b: str,
               metrics: dict[str, tuple[str, Callable[[dict], float]]]) -> tuple[dict, dict]:
    """Series for each side and metric, and B/A per pair for each metric."""
    out, ratios = {}, {}
    for key, (unit, get) in metrics.items():
        va, vb = [get(p["A"]) for p in pairs], [get(p["B"]) for p in pairs]
        out[f"A, {a}: {key}"] = runstats.series(va, unit)
        out[f"B, {b}: {key}"] = runstats.series(vb, unit)
        ratios[f"{key}, B/A"] = runstats.series(runstats.pair_ratios(va, vb), "ratio")
    return out, ratios


def run_startup(ctx: Ctx) -> dict:
    """``fstream send`` of one 1-byte file (the venv's console script, bytecode written), sender pinned to
    CPU 0 and receiver to CPU 1, ``--repeat`` times: the sender's CPU-s (``wait4``) is each run's fixed cost."""
    from fstream_bench.peers.fstream import fstream_argv

    root = ctx.work / "startup"
    root.mkdir()
    secret = root / "secret"
    secret.write_text(os.urandom(24).hex())
    secret.chmod(0o600)
    src = ab._make(root, 1, 1)
    side = ab.Side("B", shlex.join(fstream_argv()), None, secret, root / "dst")
    try:
        side.send(src, ab.CASES["1 x 1 B"][2])  # warm-up
        runs = [side.send(src, ab.CASES["1 x 1 B"][2]) for _ in range(ctx.repeat)]
    finally:
        side.close()
        shutil.rmtree(root, ignore_errors=True)
    return {"params": {"command": fstream_argv(), "send_options": ab.CASES["1 x 1 B"][2], "pinned": side.pinned},
            "series": {"sender CPU-s": runstats.series([r["tx_cpu"] for r in runs], "CPU-s"),
                       "receiver CPU-s": runstats.series([r["rx_cpu"] for r in runs], "CPU-s"),
                       "wall s": runstats.series([r["wall"] for r in runs], "s")},
            "runs": runs}


def _no_bytecode_pre() -> str:
    """Wrapper code: this checkout's modules compile from source (their bytecode is not read), as an editable
    install under ``PYTHONDONTWRITEBYTECODE`` did; a ``send`` lists the modules it compiled at exit."""
    roots = tuple(str(REPO / p) + os.sep for p in ("transfer_agent", "fstream_provider"))
    return "\n".join([
        "import atexit, os, importlib.machinery as _m",
        f"_roots, _seen, _orig = {roots!r}, [], _m.SourceFileLoader.path_stats",
        "def _stats(self, path):",
        "    if path.startswith(_roots):",
        "        _seen.append(path)",
        "        raise OSError('fstream bench micro: bytecode ignored')",
        "    return _orig(self, path)",
        "_m.SourceFileLoader.path_stats = _stats",
        "_dump = os.environ.get('FSTREAM_MICRO_COMPILED')",
        "if _dump and sys.argv[1:2] == ['send']:",
        "    atexit.register(lambda: open(_dump, 'w').write('\\n'.join(_seen)))"])


def run_bytecode(ctx: Ctx) -> dict:
    """A/B, ``--repeat`` pairs of a 1-byte ``send``: A compiles this checkout's modules from source in every
    process (what ``PYTHONDONTWRITEBYTECODE`` did to the editable checkout), B reads the bytecode written once
    (``peers.fstream.precompile``). The sender's CPU-s, A − B per pair, and the modules A's sender compiled."""
    listing = ctx.work / "compiled.txt"
    pairs, _ = _ab(ctx, "bytecode", agent_cmd(pre=_no_bytecode_pre()), agent_cmd(), 1, 1, ab.CASES["1 x 1 B"][2],
                   env={"FSTREAM_MICRO_COMPILED": str(listing)})
    compiled = [p for p in listing.read_text().splitlines() if p] if listing.exists() else None
    series, ratios = _ab_series(pairs, "compiled from source", "bytecode", {
        "sender CPU-s": ("CPU-s", lambda r: r["tx_cpu"]), "wall s": ("s", lambda r: r["wall"])})
    series["sender CPU, A − B per pair"] = runstats.series(
        [(p["A"]["tx_cpu"] - p["B"]["tx_cpu"]) * 1e3 for p in pairs], "ms CPU")
    return {"params": {"send_options": ab.CASES["1 x 1 B"][2],
                       "modules_compiled_by_a_send": len(compiled) if compiled is not None else None},
            "series": series, "ratios": ratios, "pairs": pairs,
            "compiled": [os.path.relpath(p, REPO) for p in compiled or []],
            "notes": ([] if compiled is not None
                      else ["the sender wrote no module list (it did not exit through atexit)"])}


def run_gc(ctx: Ctx) -> dict:
    """A/B (ae77b87), pairs of ``send`` of ``--files`` one-byte files at cc = 4, pp = 16: A without
    ``quiet_gc`` (the cyclic GC as Python sets it), B as the CLI runs today (start-up frozen out of the GC,
    young generation every 20,000 allocations); both processes of each side. The sender's CPU-s is the figure."""
    opts = ab.CASES["2000 x 1 B, cc=4 pp=16"][2]
    pairs, _ = _ab(ctx, "gc", agent_cmd(post="m.quiet_gc = lambda: None"), agent_cmd(), ctx.args.files, 1, opts)
    series, ratios = _ab_series(pairs, "default gc", "quiet_gc (today)", {
        "sender CPU-s": ("CPU-s", lambda r: r["tx_cpu"]), "receiver CPU-s": ("CPU-s", lambda r: r["rx_cpu"]),
        "wall s": ("s", lambda r: r["wall"])})
    return {"params": {"files": ctx.args.files, "send_options": opts}, "series": series, "ratios": ratios,
            "pairs": pairs}


def _pipe_ok(size: int) -> str | None:
    """None if this user may make a pipe of ``size`` bytes (else the B arm would quietly run on 64 KiB)."""
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, size)
        got = fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)
        return None if got >= size else f"a {size}-byte pipe came out at {got} bytes"
    except OSError as e:
        return f"a {size}-byte pipe is refused here ({e}; /proc/sys/fs/pipe-max-size, root may exceed it)"
    finally:
        os.close(r)
        os.close(w)


def run_pipe(ctx: Ctx) -> dict:
    """A/B (tried and dropped): pairs of ``send`` of one ``--pipe-bytes`` file at p = 4, A with the receiver's
    splice pipe as today (``receiving.data.PIPE_SIZE``, 1 MiB), B with ``--pipe-size`` (4 MiB); freed pages
    held for the run. Throughput from the agent's own seconds (``send --json``) and the receiver's CPU-s.
    Refused, not run, where this user may not make such a pipe: the agent would fall back to 64 KiB."""
    from transfer_agent.receiving.data import PIPE_SIZE

    size, pipe = ctx.args.pipe_bytes, ctx.args.pipe_size
    for n in (PIPE_SIZE, pipe):
        why = _pipe_ok(n)
        if why:
            raise RuntimeError(why)
    opts = ab.CASES["1 x 1 GiB, p=4"][2]
    pairs, note = _ab(ctx, "pipe", agent_cmd(), agent_cmd(post="import transfer_agent.receiving.data as d\n"
                                                               f"d.PIPE_SIZE = {pipe}"), 1, size, opts,
                      hold_bytes=2 * size)
    series, ratios = _ab_series(pairs, f"{PIPE_SIZE / MIB:g} MiB pipe (today)", f"{pipe / MIB:g} MiB pipe", {
        "Gbit/s (agent's seconds)": ("Gbit/s", lambda r: size * 8 / r["agent_seconds"] / 1e9 if r.get("agent_seconds")
                                     else size * 8 / r["wall"] / 1e9),
        "Gbit/s (wall)": ("Gbit/s", lambda r: size * 8 / r["wall"] / 1e9),
        "receiver CPU-s": ("CPU-s", lambda r: r["rx_cpu"]), "sender CPU-s": ("CPU-s", lambda r: r["tx_cpu"])})
    return {"params": {"bytes": size, "send_options": opts, "pipe_a": PIPE_SIZE, "pipe_b": pipe}, "series": series,
            "ratios": ratios, "pairs": pairs, "notes": [note] if note else []}


def _one_big_file(ctx: Ctx, name: str, a: tuple[str, str], b: tuple[str, str]) -> dict:
    """A/B pairs of ``send`` of one ``--pipe-bytes`` file at p = 4 onto tmpfs, each arm (label, wrapper code run after
    the CLI's import), freed pages held for the run: throughput from the agent's own seconds, both sides' CPU-s."""
    size = ctx.args.pipe_bytes
    opts = ab.CASES["1 x 1 GiB, p=4"][2]
    pairs, note = _ab(ctx, name, agent_cmd(post=a[1]), agent_cmd(post=b[1]), 1, size, opts, hold_bytes=2 * size)
    series, ratios = _ab_series(pairs, a[0], b[0], {
        "Gbit/s (agent's seconds)": ("Gbit/s", lambda r: size * 8 / r["agent_seconds"] / 1e9 if r.get("agent_seconds")
                                     else size * 8 / r["wall"] / 1e9),
        "receiver CPU-s": ("CPU-s", lambda r: r["rx_cpu"]), "sender CPU-s": ("CPU-s", lambda r: r["tx_cpu"])})
    return {"params": {"bytes": size, "send_options": opts}, "series": series, "ratios": ratios, "pairs": pairs,
            "notes": [note] if note else []}


def run_reserve(ctx: Ctx) -> dict:
    """A/B (issue 43's profile): pairs of ``send`` of one ``--pipe-bytes`` file at p = 4 onto tmpfs, A as today
    (the receiver reserves the file's size at OPEN, ``storage.durable.reserve``: ``posix_fallocate``), B with the
    reservation a no-op; freed pages held for the run. Says whether the 25 % of the receiver's samples that
    ``recv-profile`` finds in ``fallocate`` on tmpfs are an added cost or the page allocation a write pays anyway."""
    return _one_big_file(ctx, "reserve", ("space reserved at OPEN (today)", ""),
                         ("no reservation", "import transfer_agent.storage.durable as d\n"
                                            "d.reserve = lambda fd, size: None"))


def run_hashed_recv(ctx: Ctx) -> dict:
    """A/B (issue 43): pairs of ``send`` of one ``--pipe-bytes`` file at p = 4 onto tmpfs, keyed checksum on: A
    takes each hashed block in socket → pipe → file with splice(2) and reads each chunk back for the hash
    (``receiving.data.HASHED_VIA = "splice"``), B receives it into a buffer, hashes it there and pwrites it
    (``"recv"``, ``BlockTree.pump``); freed pages held for the run. Both arms set the switch, so the entry means
    the same whatever the default is."""
    patch = "import transfer_agent.receiving.data as d\nd.HASHED_VIA = {!r}"
    return _one_big_file(ctx, "hashed-recv", ("splice and read-back", patch.format("splice")),
                         ("recv, hash, pwrite", patch.format("recv")))
