"""Issues 2 and 13: ``fstream send`` vs GridFTP vs iperf3 on 127.0.0.1, in one run, pinned, with CPU.

(a) one 1 GiB file at p = 1 and p = 4; (b) 2000 x 256 KiB files at cc = 4 with pipelining; (z)
one 1-byte file, each tool's fixed cost per run; (d) the 1 GiB and the small set onto disk with
fsync on, against the disk's own ``dd conv=fdatasync`` rate. Sources and the (a)/(b)/(z)
destinations live on tmpfs (``/dev/shm``), so those figures are the data path, not the disk.
The agent runs with checksum verification on (its default), with fsync on and off. GridFTP
runs as people run it (``-fast``, no checksum) and with ``-verify-checksum`` (MD5 of both
copies). Each side runs pinned (source on CPU 0, destination on CPU 1) and each result carries
both sides' CPU-seconds (``cpu_meter``), reported per GB and per 1,000 files.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from fstream_bench.core import provenance
from fstream_bench.core.saved import save_with_markdown
from fstream_bench.core.cpu_meter import ServerCpu
from fstream_bench.core.runstats import med_range
from fstream_bench.peers import fstream as fs_peer, gridftp, iperf
from fstream_bench.peers.base import PeerError, PeerResult, Sites
from fstream_bench.core.report import machine_info
from fstream_bench.core.vm_memory import held_free_pages
from fstream_bench.core.workload_gen import content_block, write_file

GIB = 2**30
KIB = 2**10

#: what a loopback result exercised (``provenance``): the agent, this benchmark, its peers (fstream,
#: GridFTP, iperf3 drivers), CPU meter, memory hold and dataset writer
MODULES = (*provenance.AGENT, "fstream_bench.datapath.loopback", "fstream_bench.peers", "fstream_bench.core.cpu_meter",
           "fstream_bench.core.report", "fstream_bench.core.vm_memory", "fstream_bench.core.workload_gen",
           "fstream_bench.core.runstats", "fstream_bench.core.saved")


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


def _tmpfs_root() -> Path | None:
    """``/dev/shm`` when it is a tmpfs (the destination for the data-path figures), else None."""
    try:
        with open("/proc/mounts") as f:
            return Path("/dev/shm") if any(line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in f) else None
    except OSError:
        return None


def disk_info(d: Path) -> dict:
    """The filesystem the disk cases write to: its type and mount options from ``/proc/mounts``, and for ext4
    whether it has a journal (a ``/proc/fs/jbd2/<device>-*`` entry; this VM's root has none)."""
    d = d.resolve()
    best: list[str] = []
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 4 and (d == Path(parts[1]) or Path(parts[1]) in d.parents) and (
                        not best or len(parts[1]) > len(best[1])):
                    best = parts
    except OSError:
        return {}
    if not best:
        return {}
    info: dict = {"device": best[0], "mount": best[1], "type": best[2], "options": best[3]}
    if best[2] == "ext4" and Path("/proc/fs/jbd2").is_dir():
        dev = Path(best[0]).name
        info["journal"] = any(p.name.startswith(dev + "-") for p in Path("/proc/fs/jbd2").iterdir())
    return info


def disk_ceiling(d: Path, nbytes: int = GIB) -> float:
    """The disk's own durable write rate (bytes/s): ``dd conv=fdatasync`` of ``nbytes`` under ``d``."""
    target = d / "dd-ceiling.bin"
    d.mkdir(parents=True, exist_ok=True)
    _sync()
    t0 = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=4M", f"count={max(1, nbytes // (4 * 2**20))}",
                    "conv=fdatasync", "status=none"], check=True)
    rate = max(1, nbytes // (4 * 2**20)) * 4 * 2**20 / (time.monotonic() - t0)
    target.unlink(missing_ok=True)
    return rate


def checksum_cost(path: Path) -> dict[str, float]:
    """CPU-seconds per GiB of the agent's own checksum pass (``storage.checksum.hash_fd``, which each side
    runs once per file) over a page-cached file, on CPU 0: what verification adds per side."""
    from transfer_agent.storage.checksum import hash_fd

    old = os.sched_getaffinity(0)
    out = {}
    try:
        os.sched_setaffinity(0, {0})
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            for algo, key in (("blake3-keyed", bytes(32)), ("xxh3_128", None)):
                best = float("inf")
                for _ in range(3):
                    t0 = time.process_time()
                    hash_fd(fd, size, algo, key)
                    best = min(best, time.process_time() - t0)
                out[algo] = best / (size / 2**30)
        finally:
            os.close(fd)
    finally:
        os.sched_setaffinity(0, old)
    return out


def cases_for(small_count: int, pp: int) -> list[tuple[str, str, dict, str]]:
    """(case, dataset, knobs, destination kind): tmpfs for the data path, disk for durability."""
    return [
        ("a: 1 GiB, p=1", "big", {"cc": 1, "p": 1, "pp": 1}, "tmpfs"),
        ("a: 1 GiB, p=4", "big", {"cc": 1, "p": 4, "pp": 1}, "tmpfs"),
        (f"b: {small_count} files, cc=4, pp", "small", {"cc": 4, "p": 1, "pp": pp}, "tmpfs"),
        (f"c: {small_count} files of 1 byte, cc=4, pp", "bytes", {"cc": 4, "p": 1, "pp": pp}, "tmpfs"),
        ("z: 1 file of 1 byte", "tiny", {"cc": 1, "p": 1, "pp": 1}, "tmpfs"),
        ("d: 1 GiB, p=4, disk", "big", {"cc": 1, "p": 4, "pp": 1}, "disk"),
        (f"d: {small_count} files, cc=4, pp, disk", "small", {"cc": 4, "p": 1, "pp": pp}, "disk"),
    ]


# fstream-readback: the receiver without the native module (FSTREAM_NATIVE=0): the file read back and hashed at
# commit, as before issue 29, so the one-pass hashing is compared with it in the same run
TMPFS_TOOLS = ("fstream", "fstream-readback", "fstream-nofsync", "fstream-noverify", "gridftp", "gridftp+md5",
               "iperf3")


def run(workdir: Path, *, repeat: int = 1, big_bytes: int = GIB, small_count: int = 2000,
        small_bytes: int = 256 * KIB, pp: int = 16, pin: bool = True, only: str = "",
        tools: str = "", log: Callable[[str], None] = print) -> dict:
    """Run every case ``repeat`` times; return a document with all results and the medians.

    Each side runs pinned (``taskset``: the source on CPU 0, the destination on CPU 1) unless
    ``pin`` is False; each result carries both sides' CPU-seconds (``fstream_bench.core.cpu_meter``).
    ``only`` keeps the cases whose name contains one of its comma-separated words; ``tools`` the
    tools named in it.
    """
    machine = machine_info()  # load average before the datasets are written and anything runs
    pinned = pin and shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
    sites = Sites(src_prefix=("taskset", "-c", "0"), dst_prefix=("taskset", "-c", "1")) if pinned else Sites()
    workdir = Path(workdir)
    tmpfs = _tmpfs_root()
    fast_root = Path(tempfile.mkdtemp(prefix="fstream-bench-loopback-", dir=tmpfs)) if tmpfs else workdir / "fast"
    try:  # the datasets live on tmpfs (RAM): removed however the run ends
        src = fast_root / "src"
        log(f"loopback: preparing datasets under {src} (destinations: {fast_root} and {workdir}); pinned: {pinned}")
        data = make_datasets(src, big_bytes=big_bytes, small_count=small_count, small_bytes=small_bytes)
        tiny = src / "tiny" / "one-byte.dat"
        tiny.parent.mkdir(parents=True, exist_ok=True)
        tiny.write_bytes(b"x")
        data["tiny"] = [tiny]
        data["bytes"] = []
        for i in range(small_count):  # the per-file cost without data: every file one byte
            p = src / "bytes" / f"b{i:05d}.dat"
            if not p.exists():
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(b"x")
            data["bytes"].append(p)
        _warm(data["big"] + data["small"])
        sizes = {"big": big_bytes, "small": small_count * small_bytes, "tiny": 1, "bytes": small_count}
        cases = [c for c in cases_for(small_count, pp) if not only or any(w and w in c[0] for w in only.split(","))]
        wanted = set(filter(None, tools.split(","))) or None
        missing = {name: why for name, why in (("iperf3", iperf.available()), ("gridftp", gridftp.available()),
                                               ("fstream", fs_peer.available())) if why}
        for name, why in missing.items():
            log(f"loopback: skipping {name}: {why}")
        hashing = checksum_cost(data["big"][0])
        log(f"loopback: checksum pass, CPU-s per GiB: {hashing}")
        ceilings: list[float] = []  # dd conv=fdatasync, once per repeat just before its disk cases (paired)
        disk = disk_info(workdir) if any(c[3] == "disk" for c in cases) else {}
        results: list[dict] = []
        with held_free_pages(warm_bytes=2 * big_bytes + sizes["small"]) as memory_note:
            log(f"loopback: {memory_note}")
            for rep in range(repeat):
                for case, dataset, knobs, kind in cases:
                    if kind == "disk" and len(ceilings) == rep:
                        _sync()
                        ceilings.append(disk_ceiling(workdir / "ceiling"))
                        log(f"loopback: [{rep + 1}/{repeat}] dd conv=fdatasync: {ceilings[-1] * 8 / 1e9:.2f} Gbit/s")
                    # a disk case writes into a directory of its own, kept until the run ends: on an ext4 without
                    # a journal (this VM's root) every file created within seconds after thousands were deleted
                    # pays a scan of the recently deleted inodes (find_inode_bit -> recently_deleted, a third of
                    # the receiver's CPU when each repeat removed the last one's 2000 files); dd writes a fresh file
                    dst_root = fast_root / "dst" if kind == "tmpfs" else workdir / "dst" / f"r{rep}"
                    # on disk, without fsync beside it: what the flushes cost in the same repeat
                    names = TMPFS_TOOLS if kind == "tmpfs" else ("fstream", "fstream-nofsync")
                    if dataset in ("tiny", "bytes"):
                        names = ("fstream", "fstream-noverify", "gridftp")
                    names = [n for n in names if n.partition("-")[0].partition("+")[0] not in missing
                             and (wanted is None or n in wanted)]
                    for tool in names:
                        _sync()
                        log(f"loopback: [{rep + 1}/{repeat}] {case}: {tool} ...")
                        dest = dst_root / tool.replace("+", "-")
                        try:
                            r = _one(tool, sites, workdir, dest, src, dataset, data[dataset], knobs, sizes[dataset])
                        except PeerError as e:
                            r = PeerResult(tool=tool, ok=False, error=str(e))
                        finally:  # freed now, so the next run writes into the pages this one used (tmpfs)
                            if kind == "tmpfs":
                                shutil.rmtree(dest, ignore_errors=True)
                        r.tool = tool
                        results.append({"case": case, "repeat": rep, "dest": kind, "dataset": dataset,
                                        **r.to_dict()})
                        log(f"loopback:   {tool}: {'ok' if r.ok else 'FAILED'} {r.bytes / 1e6:.0f} MB in "
                            f"{r.seconds:.2f} s = {r.throughput_bps / 1e9:.2f} Gbit/s, CPU src {r.cpu_src_s} "
                            f"dst {r.cpu_dst_s} {r.error[:200]}")
    finally:
        if tmpfs:
            shutil.rmtree(fast_root, ignore_errors=True)
        shutil.rmtree(workdir / "dst", ignore_errors=True)  # the disk cases' files, kept until now (see above)
    return {"machine": machine, "disk": disk, "disk_ceiling_paired": True, "pinned": pinned, "memory": memory_note,
            "cases": [c[0] for c in cases],
            "results": results,
            "files": {"big": 1, "small": small_count, "tiny": 1, "bytes": small_count}, "disk_ceiling_Bps": ceilings,
            "checksum_cpu_s_per_gib": hashing,
            "medians": medians(results)}


def _one(tool: str, sites: Sites, workdir: Path, dest: Path, src: Path, dataset: str, files: list[Path],
         knobs: dict, nbytes: int) -> PeerResult:
    """One measurement of ``tool`` on ``files``, with both sides' CPU-seconds."""
    if tool == "iperf3":
        return iperf.Iperf3(sites=sites, workdir=workdir / "iperf3", port=_iperf_port()).measure(
            streams=knobs["p"] * knobs["cc"], nbytes=nbytes, label="iperf3")
    root = _fresh(dest)
    if tool.startswith("fstream"):
        extra = ("--no-fsync",) if tool == "fstream-nofsync" else ()
        options = {**knobs, "no_verify": tool == "fstream-noverify"}  # the checksum's own cost, measured
        env = {"FSTREAM_NATIVE": "0"} if tool == "fstream-readback" else None
        with fs_peer.FStreamReceiver(sites=sites, workdir=workdir / "fstream", root=root, extra_args=extra,
                                     env=env) as rx:
            meter = ServerCpu(rx.proc.pid).start()
            srcs = [src / dataset] if dataset in ("small", "bytes") else files
            r = fs_peer.send(rx, srcs, "in", tuner="fixed", options=options, label=tool)
            r.cpu_dst_s = meter.stop()
            return r
    with gridftp.GridFTPServer(sites=sites, workdir=workdir / "gridftp") as srv:
        meter = ServerCpu(srv.proc.pid).start()
        st = gridftp.GridSettings(knobs["cc"], knobs["p"], knobs["pp"], "bench knobs")
        r = gridftp.copy(srv, files, src, root, st, label=tool.replace("+", "-"), verify=tool == "gridftp+md5")
        r.cpu_dst_s = meter.stop()
        return r


def _iperf_port() -> int:
    from fstream_bench.peers.base import free_port
    return free_port()


def medians(results: list[dict]) -> dict[str, dict[str, dict]]:
    """Per case and tool over successful repeats: median, min and max throughput, median CPU-seconds."""
    groups: dict[str, dict[str, list[dict]]] = {}
    for r in results:
        if r["ok"]:
            groups.setdefault(r["case"], {}).setdefault(r["tool"], []).append(r)
    out: dict[str, dict[str, dict]] = {}
    for case, tools in groups.items():
        for tool, rows in tools.items():
            bps = [r["throughput_bps"] for r in rows]
            cell = {"bps": statistics.median(bps), "bps_min": min(bps), "bps_max": max(bps), "n": len(rows),
                    "bytes": rows[0]["bytes"], "files": rows[0]["files"]}
            for k in ("cpu_src_s", "cpu_dst_s"):
                vals = [r[k] for r in rows if r.get(k) is not None]
                cell[k] = statistics.median(vals) if vals else None
            both = [r["cpu_src_s"] + r["cpu_dst_s"] for r in rows
                    if r.get("cpu_src_s") is not None and r.get("cpu_dst_s") is not None]
            cell["cpu_s"] = statistics.median(both) if both else None
            cell["cpu_s_min"], cell["cpu_s_max"] = (min(both), max(both)) if both else (None, None)
            out.setdefault(case, {})[tool] = cell
    return out


def fixed_cost(doc: dict, tool: str) -> float | None:
    """A tool's CPU-seconds (both sides) for one 1-byte file: its per-run cost (start-up, connect, auth)."""
    base = "fstream" if tool.startswith("fstream") else "gridftp"
    for case, tools in doc["medians"].items():
        if case.startswith("z:"):
            for name in (tool, base):
                if name in tools:
                    return tools[name]["cpu_s"]
    return None


def cpu_per_unit(doc: dict, case: str, tool: str, *, net: bool = False) -> float | None:
    """CPU-seconds (both sides) per GB for the big cases, per 1,000 files for the small ones."""
    cell = doc["medians"].get(case, {}).get(tool)
    if not cell or cell["cpu_s"] is None or case.startswith("z:"):
        return None
    cpu = cell["cpu_s"]
    if net:
        fixed = fixed_cost(doc, tool)
        if fixed is None:
            return None
        cpu = max(0.0, cpu - fixed)
    return cpu / (cell["bytes"] / 1e9) if cell["files"] <= 1 else cpu / (cell["files"] / 1000)


def disk_goal(case: str) -> float:
    """Issue 43's share of ``dd conv=fdatasync`` for a disk case: 0.9 for the large file, 0.6 for the small files."""
    return 0.9 if "GiB" in case else 0.6


def disk_ratios(doc: dict, case: str) -> tuple[list[float], float]:
    """fstream's throughput over the disk's ``dd conv=fdatasync`` per repeat, and the ceilings' median (bit/s).

    Since 2026-11-30 (``disk_ceiling_paired``) each repeat measures dd just before its own disk cases and a run is
    divided by its own repeat's dd (the disk's rate swings 3.5-9.4 Gbit/s on this VM); before, the ceilings were
    measured together at the start and every run was divided by their median."""
    ceilings = [c * 8 for c in doc.get("disk_ceiling_Bps") or []]
    if not ceilings:
        return [], 0.0
    runs = {r["repeat"]: r for r in doc["results"] if r.get("ok") and r["case"] == case and r["tool"] == "fstream"}
    if doc.get("disk_ceiling_paired"):
        xs = [runs[i]["throughput_bps"] / ceilings[i] for i in sorted(runs) if i < len(ceilings)]
    else:
        xs = [r["throughput_bps"] / statistics.median(ceilings) for r in runs.values()]
    return xs, statistics.median(ceilings)


def markdown(doc: dict, command: str) -> str:
    """Throughput, CPU per side and CPU per GB / per 1,000 files for every tool and case, then the goals."""
    m = doc["machine"]
    reps = max((r["repeat"] for r in doc["results"]), default=0) + 1
    lines = [f"Command: `{command}`  ",
             f"Machine: {m['nproc']} CPUs ({m['cpu']}), kernel {m['kernel']}, {m['mem_gib']:.0f} GiB RAM; "
             f"load average at start {m.get('loadavg', '?')}; date {m['date']}; repeats per cell: {reps} "
             f"(median, min-max); pinned: {'source on CPU 0, destination on CPU 1' if doc.get('pinned') else 'no'}.  ",
             f"Memory: {doc.get('memory', 'not recorded')}.  ",
             "Checksum pass alone (`hash_fd`, page-cached, CPU 0), CPU-s per GiB per side: "
             + ", ".join(f"{k} {v:.3f}" for k, v in doc.get("checksum_cpu_s_per_gib", {}).items()) + ".",
             "", "| case | tool | Gbit/s (min-max) | CPU-s source | CPU-s dest | CPU-s both (min-max) "
             "| per GB or per 1,000 files | same, net of the 1-byte run |", "|---|---|---|---|---|---|---|---|"]

    def f(x: float | None, fmt: str = "{:.2f}") -> str:
        return fmt.format(x) if x is not None else "-"

    for case in doc["cases"]:
        for tool, c in doc["medians"].get(case, {}).items():
            unit = "" if case.startswith("z:") else (" /GB" if c["files"] <= 1 else " /1k files")
            per, net = cpu_per_unit(doc, case, tool), cpu_per_unit(doc, case, tool, net=True)
            lines.append(f"| {case} | {tool} | {c['bps'] / 1e9:.2f} "
                         f"({c['bps_min'] / 1e9:.2f}-{c['bps_max'] / 1e9:.2f}) "
                         f"| {f(c['cpu_src_s'])} | {f(c['cpu_dst_s'])} | {f(c['cpu_s'])} "
                         f"({f(c['cpu_s_min'])}-{f(c['cpu_s_max'])}) | {f(per)}{unit if per is not None else ''} "
                         f"| {f(net)}{unit if net is not None else ''} |")
    lines += ["", "| goal | measured |", "|---|---|"]
    med = doc["medians"]
    for case in doc["cases"]:
        if case.startswith("z:"):
            continue
        if "disk" in case:
            xs, ceil = disk_ratios(doc, case)
            if xs:
                goal = disk_goal(case)
                lines.append(f"| {case}: fstream (fsync) / the disk's `dd conv=fdatasync` ({ceil / 1e9:.2f} Gbit/s"
                             f"{', paired per repeat' if doc.get('disk_ceiling_paired') else ''}) >= {goal} "
                             f"| {med_range(xs)} |")
            continue
        a, b = cpu_per_unit(doc, case, "fstream"), cpu_per_unit(doc, case, "gridftp")
        an, bn = cpu_per_unit(doc, case, "fstream", net=True), cpu_per_unit(doc, case, "gridftp", net=True)
        nv = cpu_per_unit(doc, case, "fstream-noverify", net=True)
        if a and b:
            lines.append(f"| {case}: CPU both sides, fstream (checksum, fsync) / gridftp -fast <= 1 "
                         f"| {a / b:.2f}; net of each tool's per-run cost {f(an / bn if an and bn else None)}; "
                         f"without the checksum (`--no-verify`, net) {f(nv / bn if nv and bn else None)} |")
        fs, g = med.get(case, {}).get("fstream"), med.get(case, {}).get("gridftp")
        if fs and g and not case.startswith("c:"):
            nvc = med.get(case, {}).get("fstream-noverify")
            lines.append(f"| {case}: throughput fstream / gridftp >= 1.5 (p=4 and the small set) "
                         f"| {fs['bps'] / g['bps']:.2f}; without the checksum "
                         f"{f(nvc['bps'] / g['bps'] if nvc else None)} |")
    for r in doc["results"]:
        if not r["ok"]:
            lines.append(f"\n- {r['case']}: {r['tool']} failed: {r['error'][:300]}")
    if doc.get("provenance"):
        p = doc["provenance"]
        lines += ["", f"Provenance: commit {p['commit'][:12]}{' (dirty)' if p['dirty'] else ''}, code "
                  f"{p['code_hash'][:19]}, load {p['load_start'][0]:.2f} at start, {p['load_end'][0]:.2f} at end; "
                  "every run is in the JSON's `results`."]
    return "\n".join(lines) + "\n"


def main(args) -> int:
    """Entry for ``fstream bench loopback``."""
    workdir = Path(args.workdir or f"/tmp/fstream-bench-loopback-{os.getpid()}")
    for sig in (signal.SIGTERM, signal.SIGHUP):  # so the memory hold is restored on a kill or a hang-up
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    t0 = time.time()
    prov = provenance.start("loopback", list(args.raw_argv), MODULES)
    doc = run(workdir, repeat=args.repeat, big_bytes=args.big_bytes, small_count=args.small_count,
              small_bytes=args.small_bytes, pp=args.pp, pin=not args.no_pin, only=args.cases, tools=args.tools)
    doc["wall_seconds"] = time.time() - t0
    save_with_markdown("loopback", doc, prov, args.results, markdown)
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(r["ok"] for r in doc["results"]) else 1
