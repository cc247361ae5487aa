"""Micro-benchmarks behind BENCHMARKS.md §12's single figures (issue 26, "evidence without raw data").

§12 quotes figures that no script produced: AES-GMAC against keyed BLAKE3 in memory, the checksum
pass per GiB before and after the reused buffer, BLAKE3's threads on a 256 KiB file, the cost of a
control frame, touching fresh memory cold and warm on this VM, pydantic's import, a 1-byte ``send``'s
CPU, the bytecode an editable checkout compiles per ``send``, the ``gc`` change on the sender and the
4 MiB splice pipe that was tried and dropped. Each entry here measures one of them, ``--repeat``
times (default 5; ``gc`` 7 pairs, as §12 measured), and the run writes every raw value, the median
and range and its provenance to ``bench/results/micro-<stamp>.json`` and a short ``.md``::

    fstream bench micro                      # all entries, about 2 minutes on the 2-CPU VM
    fstream bench micro --only gmac,touch    # some
    fstream bench micro --list               # what each entry reproduces, and what none can

The in-process entries are ``micro_cpu`` (pinned to CPU 0, CPU from ``time.process_time``), the ones
that start the agent ``micro_agent`` (A/B pairs in ABBA order on ``fstream_bench.datapath.ab``'s pinned sides);
this module is the registry, the run and the result file.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable

from fstream_bench.core import provenance

from fstream_bench.core import runstats
from fstream_bench.core import RESULTS_DIR
from fstream_bench.datapath.micro_agent import (run_bytecode, run_gc, run_hashed_recv, run_pipe, run_reserve,
                                               run_startup)
from fstream_bench.datapath.micro_cpu import (GIB, KIB, MIB, Ctx, run_checksum, run_frame, run_gmac, run_hash_small,
                                     run_pydantic, run_touch, tmpfs_dir)

AGENT_RUN = (*provenance.AGENT, "fstream_bench.datapath.ab", "fstream_bench.datapath.micro_agent",
             "fstream_bench.datapath.micro_cpu",
             "fstream_bench.core.vm_memory", "fstream_bench.peers.fstream", "fstream_bench.peers.base")
CPU_RUN = ("fstream_bench.datapath.micro_cpu",)


@dataclass
class Entry:
    """One §12 figure and the function that measures it (returns params, series, ratios, pairs, notes)."""

    name: str
    figure: str  # what BENCHMARKS.md §12 (or §19, the data path's round three) says, quoted
    method: str
    modules: tuple[str, ...]
    run: Callable[[Ctx], dict]
    repeat: int = 5
    agent: bool = False  # starts `fstream` processes (needs the bytecode written first)


ENTRIES: dict[str, Entry] = {e.name: e for e in (
    Entry("touch",
          "§12 'Why loopback numbers swung': touching 4 GiB took 7.3 s cold and 1.7 s warm (~1.8 CPU-s per GiB)",
          run_touch.__doc__ or "", (*CPU_RUN, "fstream_bench.core.vm_memory"), run_touch),
    Entry("gmac", "§12 'What would close it': AES-GMAC 26.6 GB/s on this CPU (cryptography, AAD only) against keyed "
          "BLAKE3's 6.7 GB/s; ~0.8 CPU-s per GiB bound", run_gmac.__doc__ or "", CPU_RUN, run_gmac),
    Entry("checksum",
          "§12 table of changes: keyed BLAKE3 over a page-cached GiB, pinned, one process: 0.32 → 0.27 CPU-s "
          "(commit b333e7f: 0.33 → 0.27); the loopback's own checksum pass: blake3-keyed 0.345, "
          "xxh3_128 0.204 CPU-s/GiB",
          run_checksum.__doc__ or "", (*CPU_RUN, "transfer_agent.storage.checksum"), run_checksum),
    Entry("hash-small",
          "§12 table of changes: BLAKE3 threads only for inputs ≥ 64 MiB: one 256 KiB file 67 → 37 µs of CPU",
          run_hash_small.__doc__ or "", (*CPU_RUN, "transfer_agent.storage.checksum"), run_hash_small),
    Entry("frame", "§12 table of changes: control frames 25 µs per frame, both sides, in a tight loop",
          run_frame.__doc__ or "", (*CPU_RUN, "transfer_agent.wire"), run_frame),
    Entry("pydantic", "§12 'What would close it' (3): pydantic's import (~60 ms) is most of what is left of start-up",
          run_pydantic.__doc__ or "", CPU_RUN, run_pydantic),
    Entry("startup", "§12 table of changes: send of one byte 0.20 → 0.17 CPU-s in a pinned shell loop of 5 "
          "(the z case, 0.20–0.22, is `fstream bench loopback --cases z`)", run_startup.__doc__ or "", AGENT_RUN,
          run_startup, agent=True),
    Entry("bytecode", "§12 'The instrument first': an editable checkout under PYTHONDONTWRITEBYTECODE compiled ~75 "
          "modules from source in every fstream send (~60 ms)", run_bytecode.__doc__ or "", AGENT_RUN, run_bytecode,
          agent=True),
    Entry("gc", "§12 table of changes: gc.freeze() after start-up, young generation every 20,000 allocations: A/B, 7 "
          "interleaved pairs, 2000 one-byte files: sender 0.501 → 0.483 CPU-s", run_gc.__doc__ or "", AGENT_RUN,
          run_gc, repeat=7, agent=True),
    Entry("pipe", "§12 table of changes, tried and dropped: a 4 MiB splice pipe instead of 1 MiB: A/B, 5 pairs: 6.74 "
          "Gbit/s both; receiver 0.86 → 0.98 CPU-s", run_pipe.__doc__ or "", AGENT_RUN, run_pipe, agent=True),
    Entry("reserve", "§19.2 (issue 43): on tmpfs a quarter of the receiver's CPU is posix_fallocate at OPEN; without "
          "the reservation, is that cost gone or moved into the writes?", run_reserve.__doc__ or "", AGENT_RUN,
          run_reserve, agent=True),
    Entry("hashed-recv", "§19.2 (issue 43): a hashed block received into memory, hashed there and pwritten (one pass "
          "over the bytes in user memory) against splice into the file and a read-back of each chunk",
          run_hashed_recv.__doc__ or "", AGENT_RUN, run_hashed_recv, agent=True),
)}

#: §12 figures no entry here reproduces, and why (the report lists them with each run)
NOT_HERE = {
    "tried and dropped: hashing files ≤ 1 MiB in the opening thread (4.84 → 4.71 Gbit/s, "
    "sender 0.83 → 0.87 CPU-s)":
        "the tried code was never committed; reproducing it means writing that patch again",
    "'before' halves of the table of changes (plugin entry points 0.27 → 0.20–0.22 and 0.20 → 0.17 CPU-s per "
    "send, control frames before the one-shot MAC, --no-verify receiver 0.77 CPU-s)":
        "need the agent of b333e7f^ (worktree WT, bytecode written with `python -m compileall -q WT/transfer_agent "
        "WT/fstream_provider`): `fstream bench ab --a-cmd .venv/bin/fstream --a-path WT --b-cmd .venv/bin/fstream "
        "--case '1 x 1 B'` (send of one byte), `PYTHONPATH=WT fstream bench loopback --tools fstream-noverify "
        "--cases a:` (today's benchmark driving the old agent)",
    "profile shares (perf, yappi, cProfile, -X importtime): 'where the cycles went'":
        "sampling profiles read by hand; not a repeatable figure",
    "the run's table, the checksum pass (0.345 / 0.204), the z case, --no-verify receiver 0.48–0.57, "
    "disk dd 11.8 Gbit/s":
        "`fstream bench loopback --repeat 5` (bench/results/loopback-20261125-101934.json)",
}


def _parser() -> argparse.ArgumentParser:
    from fstream_provider.model.units import parse_size

    ap = argparse.ArgumentParser(prog="fstream bench micro", description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[],
                    help=f"comma-separated entries (repeatable): {', '.join(ENTRIES)}")
    ap.add_argument("--list", action="store_true", help="print each entry's §12 figure and what no entry reproduces")
    ap.add_argument("--repeat", type=int, default=None, help="repeats (pairs for A/B entries); default 5, gc 7")
    ap.add_argument("--results", default=str(RESULTS_DIR), help="where micro-<stamp>.json/.md go")
    ap.add_argument("--mac-bytes", type=parse_size, default=4 * GIB, help="gmac: bytes per repeat (default 4GiB)")
    ap.add_argument("--chunk", type=parse_size, default=MIB, help="gmac: bytes per call (default 1MiB, in cache)")
    ap.add_argument("--checksum-bytes", type=parse_size, default=GIB, help="checksum: file size (default 1GiB)")
    ap.add_argument("--small-bytes", type=parse_size, default=256 * KIB, help="hash-small: file size (default 256KiB)")
    ap.add_argument("--small-count", type=int, default=2000, help="hash-small: hashes per repeat (default 2000)")
    ap.add_argument("--frames", type=int, default=20000, help="frame: frames per repeat (default 20000)")
    ap.add_argument("--touch-bytes", type=parse_size, default=2 * GIB, help="touch: memory per touch (default 2GiB; "
                    "§12 touched 4GiB)")
    ap.add_argument("--settle", type=float, default=3.0, help="touch: seconds before each cold touch (default 3)")
    ap.add_argument("--files", type=int, default=2000, help="gc: one-byte files per send (default 2000)")
    ap.add_argument("--pipe-bytes", type=parse_size, default=GIB, help="pipe: file size (default 1GiB)")
    ap.add_argument("--pipe-size", type=parse_size, default=4 * MIB, help="pipe: B's splice pipe (default 4MiB; "
                    "above /proc/sys/fs/pipe-max-size only with CAP_SYS_RESOURCE)")
    return ap


def selected(only: list[str]) -> list[Entry]:
    """The entries ``--only`` names (all when empty), in ``ENTRIES`` order; unknown names raise ``ValueError``."""
    names = {n.strip() for o in only for n in o.split(",") if n.strip()}
    unknown = names - set(ENTRIES)
    if unknown:
        raise ValueError(f"unknown entries {sorted(unknown)}; known: {', '.join(ENTRIES)}")
    return [e for n, e in ENTRIES.items() if not names or n in names]


def markdown(doc: dict) -> str:
    """Per entry: the §12 figure quoted, then each series as median (min–max, n runs)."""
    prov = doc["provenance"]
    lines = [f"Command: `{prov['command']}`  ", runstats.provenance_line(prov), ""]
    for name, e in doc["entries"].items():
        lines += [f"### {name}", "", f"Figure: {e['figure']}", ""]
        if e.get("error"):
            lines += [f"Failed: {e['error'].strip().splitlines()[-1]}", ""]
            continue
        lines += ["| series | unit | median (min–max, runs) |", "|---|---|---|"]
        for kind in ("series", "ratios"):
            for label, s in e.get(kind, {}).items():
                fmt = "{:.3f}" if s["median"] is not None and abs(s["median"]) < 10 else "{:.1f}"
                lines.append(f"| {label} | {s['unit']} | {runstats.med_range(s['values'], fmt)} |")
        params = ", ".join(f"{k} {v}" for k, v in e.get("params", {}).items() if not isinstance(v, (list, dict)))
        lines += ["", f"Parameters: {params}; {e['seconds']:.1f} s."]
        lines += [f"Note: {n}" for n in e.get("notes", []) if n]
        lines.append("")
    lines += ["### Not reproduced here", ""] + [f"- {k}: {v}" for k, v in doc["not_here"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.list:
        for e in ENTRIES.values():
            print(f"{e.name} (repeat {e.repeat}): {e.figure}")
        print("\nnot reproduced by an entry:")
        for k, v in NOT_HERE.items():
            print(f"- {k}: {v}")
        return 0
    try:
        entries = selected(args.only)
    except ValueError as e:
        print(f"fstream bench micro: {e}", file=sys.stderr)
        return 2
    modules = sorted({"fstream_bench.datapath.micro", "fstream_bench.core.runstats",
                      *(m for e in entries for m in e.modules)})
    prov = provenance.start("micro", argv, modules)
    old_handlers = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):  # a kill or a hang-up still restores the memory hold and cleans up
        try:
            old_handlers[sig] = signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
        except ValueError:  # not the main thread
            pass
    work = tmpfs_dir("fstream-bench-micro-")
    out: dict[str, dict] = {}
    try:
        if any(e.agent for e in entries):
            from fstream_bench.peers.fstream import precompile
            precompile()  # the agent's bytecode, written once as pip would (see the bytecode entry)
        for e in entries:
            ctx = Ctx(args, args.repeat or e.repeat, work, log=lambda s: print(s, flush=True))
            print(f"micro: {e.name} ({ctx.repeat} repeats) ...", flush=True)
            t0 = time.monotonic()
            try:
                res = e.run(ctx)
            except Exception:  # one entry failing leaves the others' numbers
                res = {"error": traceback.format_exc()}
                print(f"micro: {e.name} failed:\n{res['error']}", file=sys.stderr, flush=True)
            out[e.name] = {"figure": e.figure, "method": " ".join(e.method.split()), "repeat": ctx.repeat,
                           "modules": list(e.modules), **res, "seconds": time.monotonic() - t0}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for sig, h in old_handlers.items():
            signal.signal(sig, h)
    doc = {"provenance": provenance.finish(prov), "bench": "micro", "entries": out, "not_here": NOT_HERE}
    md = markdown(doc)
    jp, mp = runstats.write_result(args.results, "micro", doc, md)
    print(md)
    print(f"results: {jp}, {mp}")
    return 1 if any("error" in e for e in out.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
