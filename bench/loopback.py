"""Issue 2's loopback benchmark: ``fstream send`` vs GridFTP vs iperf3 on 127.0.0.1, in one run.

(a) one 1 GiB file at p = 1 and p = 4; (b) 2000 x 256 KiB files at cc = 4 with pipelining.
The agent runs with checksum verification on (its default). GridFTP runs twice: as people
run it (no checksum) and with ``-verify-checksum`` (MD5 of both copies), so both comparisons
are visible. Every tool reads the same page-cached source files and writes a fresh
destination directory; ``sync`` runs before each measurement so one tool's dirty pages do
not slow the next.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable

from fstream_bench.peers import fstream as fs_peer
from fstream_bench.peers import gridftp, iperf
from fstream_bench.peers.base import PeerError, PeerResult, Sites
from fstream_bench.report import machine_info
from fstream_bench.workload_gen import content_block, write_file

GIB = 2**30
KIB = 2**10


def make_datasets(root: Path, *, big_bytes: int = GIB, small_count: int = 2000, small_bytes: int = 256 * KIB,
                  seed: int = 0) -> dict[str, list[Path]]:
    """Write (once) the big file and the small-file set; return their paths."""
    block = content_block(seed)
    big = root / "big" / "one-gib.dat"
    if not (big.is_file() and big.stat().st_size == big_bytes):
        write_file(big, big_bytes, block, key=f"{seed}:big")
    small = []
    for i in range(small_count):
        p = root / "small" / f"f{i:05d}.dat"
        if not (p.is_file() and p.stat().st_size == small_bytes):
            write_file(p, small_bytes, block, key=f"{seed}:small:{i}")
        small.append(p)
    return {"big": [big], "small": small}


def _warm(paths: list[Path]) -> None:
    for p in paths:
        with open(p, "rb") as f:
            while f.read(8 * 2**20):
                pass


def _sync() -> None:
    subprocess.run(["sync"], check=False)


def _fresh(d: Path) -> Path:
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def run(workdir: Path, *, repeat: int = 1, big_bytes: int = GIB, small_count: int = 2000,
        small_bytes: int = 256 * KIB, pp: int = 16, log: Callable[[str], None] = print) -> dict:
    """Run every case ``repeat`` times; return a document with all results and the medians."""
    sites = Sites()
    workdir = Path(workdir)
    src = workdir / "src"
    log(f"loopback: preparing datasets under {src}")
    data = make_datasets(src, big_bytes=big_bytes, small_count=small_count, small_bytes=small_bytes)
    _warm(data["big"] + data["small"])
    small_total = small_count * small_bytes
    cases = [
        ("a: 1 file, p=1", "big", {"cc": 1, "p": 1, "pp": 1}),
        ("a: 1 file, p=4", "big", {"cc": 1, "p": 4, "pp": 1}),
        (f"b: {small_count} files, cc=4, pp", "small", {"cc": 4, "p": 1, "pp": pp}),
    ]
    missing = {name: why for name, why in (("iperf3", iperf.available()), ("gridftp", gridftp.available()),
                                           ("fstream", fs_peer.available())) if why}
    for name, why in missing.items():
        log(f"loopback: skipping {name}: {why}")
    results: list[dict] = []
    dst_root = workdir / "dst"
    for rep in range(repeat):
        for case, dataset, knobs in cases:
            files = data[dataset]
            nbytes = big_bytes if dataset == "big" else small_total
            runs: list[tuple[str, Callable[[], PeerResult]]] = []
            if "fstream" not in missing:
                for fsync in (True, False):
                    label = "fstream" if fsync else "fstream-nofsync"

                    def fs_run(knobs=knobs, files=files, dataset=dataset, fsync=fsync, label=label) -> PeerResult:
                        root = _fresh(dst_root / label)
                        with fs_peer.FStreamReceiver(sites=sites, workdir=workdir / "fstream", root=root,
                                                     extra_args=() if fsync else ("--no-fsync",)) as rx:
                            srcs = [src / dataset] if dataset == "small" else files
                            return fs_peer.send(rx, srcs, "in", tuner="fixed", options=knobs, label=label)
                    runs.append((label, fs_run))
            if "gridftp" not in missing:
                for verify in (False, True):
                    label = "gridftp+md5" if verify else "gridftp"

                    def g_run(knobs=knobs, files=files, verify=verify, label=label) -> PeerResult:
                        d = _fresh(dst_root / label)
                        with gridftp.GridFTPServer(sites=sites, workdir=workdir / "gridftp") as srv:
                            st = gridftp.GridSettings(knobs["cc"], knobs["p"], knobs["pp"], "bench knobs")
                            return gridftp.copy(srv, files, src, d, st, label=label, verify=verify)
                    runs.append((label, g_run))
            if "iperf3" not in missing:
                def i_run(knobs=knobs, nbytes=nbytes) -> PeerResult:
                    streams = knobs["p"] * knobs["cc"]
                    return iperf.Iperf3(sites=sites, workdir=workdir / "iperf3", port=_iperf_port()).measure(
                        streams=streams, nbytes=nbytes, label="iperf3")
                runs.append(("iperf3", i_run))
            for tool, fn in runs:
                _sync()
                log(f"loopback: [{rep + 1}/{repeat}] {case}: {tool} ...")
                try:
                    r = fn()
                except PeerError as e:
                    r = PeerResult(tool=tool, ok=False, error=str(e))
                r.tool = tool
                row = {"case": case, "repeat": rep, **r.to_dict()}
                results.append(row)
                log(f"loopback:   {tool}: {'ok' if r.ok else 'FAILED'} {r.bytes / 1e6:.0f} MB in "
                    f"{r.seconds:.2f} s = {r.throughput_bps / 1e9:.2f} Gbit/s {r.error[:200]}")
    shutil.rmtree(dst_root, ignore_errors=True)
    return {"machine": machine_info(), "cases": [c[0] for c in cases], "results": results,
            "medians": medians(results)}


def _iperf_port() -> int:
    from fstream_bench.peers.base import free_port
    return free_port()


def medians(results: list[dict]) -> dict[str, dict[str, float]]:
    """Median throughput (bits/s) per case and tool over successful repeats."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in results:
        if r["ok"]:
            out.setdefault(r["case"], {}).setdefault(r["tool"], []).append(r["throughput_bps"])
    return {c: {t: statistics.median(v) for t, v in tools.items()} for c, tools in out.items()}


def markdown(doc: dict, command: str) -> str:
    """The BENCHMARKS.md table: throughput per tool and the ratios that issue 2 asks for."""
    m = doc["machine"]
    lines = [f"Command: `{command}`  ",
             f"Machine: {m['nproc']} CPUs ({m['cpu']}), kernel {m['kernel']}, {m['mem_gib']:.0f} GiB RAM; "
             f"load average at start {m.get('loadavg', '?')}; date {m['date']}; repeats per cell: {max(r['repeat'] for r in doc['results']) + 1} (median).", "",
             "| case | fstream (xxh3, fsync) | fstream (xxh3, no fsync) | gridftp | gridftp + MD5 verify "
             "| iperf3 mem-to-mem | fstream / gridftp | fstream no-fsync / gridftp | fstream / gridftp+MD5 "
             "| fstream / iperf3 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for case in doc["cases"]:
        med = doc["medians"].get(case, {})

        def g(tool: str) -> str:
            return f"{med[tool] / 1e9:.2f} Gbit/s" if tool in med else "failed/skipped"

        def ratio(a: str, b: str) -> str:
            return f"{med[a] / med[b]:.2f}x" if a in med and b in med and med[b] > 0 else "n/a"

        lines.append(f"| {case} | {g('fstream')} | {g('fstream-nofsync')} | {g('gridftp')} | {g('gridftp+md5')} | "
                     f"{g('iperf3')} | {ratio('fstream', 'gridftp')} | {ratio('fstream-nofsync', 'gridftp')} | "
                     f"{ratio('fstream', 'gridftp+md5')} | {ratio('fstream', 'iperf3')} |")
    fails = [r for r in doc["results"] if not r["ok"]]
    for r in fails:
        lines.append(f"\n- {r['case']}: {r['tool']} failed: {r['error'][:300]}")
    return "\n".join(lines) + "\n"


def main(args) -> int:
    """Entry for ``fstream bench loopback``."""
    workdir = Path(args.workdir or f"/tmp/fstream-bench-loopback-{os.getpid()}")
    t0 = time.time()
    doc = run(workdir, repeat=args.repeat, big_bytes=args.big_bytes, small_count=args.small_count,
              small_bytes=args.small_bytes, pp=args.pp)
    doc["command"] = "fstream bench loopback " + " ".join(shlex.quote(a) for a in args.raw_argv)
    doc["wall_seconds"] = time.time() - t0
    out = Path(args.results) / f"loopback-{time.strftime('%Y%m%d-%H%M%S')}"
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(doc, indent=1))
    md = markdown(doc, doc["command"])
    Path(f"{out}.md").write_text(md)
    print(md)
    print(f"results: {out}.json, {out}.md")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(r["ok"] for r in doc["results"]) else 1
