"""Issue 17: Python flows through FStream on loopback — latency, throughput against ``fstream send``, memory.

``fstream bench flow [--parts latency,throughput,memory]``

- **latency**: a writer process closes files at a steady rate (``--rate`` per second, ``--latency-files``
  of ``--latency-size``) in a watched directory; a flow ``watch_path(...).transfer(...)`` in another
  process stamps each landed record. Latency = record time − the writer's close time (one clock,
  one machine), p50/p90/p99/max, with inotify and with 1 s polling (Nextflow's default
  ``watchPath``).
- **throughput**: the same data shipped by ``Transfer(spec).run()`` (what ``fstream send`` runs), by the
  same with what ``--manifest`` adds (the public digest and a JSON line per file: a flow's records
  carry the same) and by
  ``channel.from_path(...).transfer(...).collect()``, each in a fresh process, in alternating order,
  ``--repeats`` times; the ratios of the medians, for large files and for small ones.
- **memory**: a flow watching ``--memory-files`` files (hard links, 1,000 per directory) ships all of
  them; the flow process's peak RSS (``VmHWM``), next to ``fstream send``'s on the same tree.

The receiver is ``fstream receive`` in its own process, writing to a tmpfs (``/dev/shm``) so the
disk is not what is measured; every run checks that each file landed with its size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fstream_bench.core.report import machine_info



def __getattr__(name: str):
    """``MODULES``: what a flow result exercised (``provenance``): the agent (``send``, ``receive``), the
    flow package and this benchmark (its driver runs in the measured processes). Computed on use, so
    the driver processes, whose peak RSS is measured, do not import ``provenance``."""
    if name == "MODULES":
        from fstream_bench.core import provenance

        return (*provenance.AGENT, "fstream_provider.flow", "fstream_bench.datapath.flow", "fstream_bench.core.report",
                "fstream_bench.core.workload_gen", "fstream_bench.core.children")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the driver: one measured run in a fresh process -------------------------------------------------
def drive(argv: list[str]) -> int:
    """``python -m fstream_bench.datapath.flow --drive MODE ...``: run one transfer, print one JSON line."""
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("send", "send-manifest", "flow", "watch"))
    ap.add_argument("--src", required=True)
    ap.add_argument("--to", required=True)
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--files", type=int, default=0, help="watch: records to wait for")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--no-inotify", action="store_true")
    ap.add_argument("--stamps", help="watch: write 'time path' per landed record here")
    a = ap.parse_args(argv)
    from fstream_provider.flow import channel
    from fstream_provider.model.spec import TransferSpec
    from transfer_agent.sending.sender import Transfer

    t0 = time.monotonic()
    if a.mode.startswith("send"):  # send-manifest: what `fstream send --manifest` adds, a record per file
        manifest = None
        if a.mode == "send-manifest":
            from transfer_agent.cli.manifest import Manifest

            manifest = Manifest(os.path.join(tempfile.gettempdir(), f"flow-bench-{os.getpid()}.jsonl"), a.to)
        spec = TransferSpec.from_options([a.src], a.to, secret_file=a.secret_file, public_checksum=manifest is not None)
        res = Transfer(spec, on_event=lambda kind, data: manifest.record(data) if manifest and kind == "file"
                       else None).run()
        if manifest is not None:
            manifest.close()
            os.unlink(manifest.path)
        files, nbytes, ok = res.verified_files + res.skipped_files, res.bytes, res.ok
    else:
        src = os.path.join(a.src, "**")
        ch = (channel.from_path(src) if a.mode == "flow" else
              channel.watch_path(src, interval=a.interval, use_inotify=not a.no_inotify))
        flow = ch.transfer(to=a.to, secret_file=a.secret_file)
        if a.mode == "watch":
            flow = flow.take(a.files)
        files = nbytes = 0
        out = open(a.stamps, "w") if a.stamps else None
        for rec in flow:
            if out:
                out.write(f"{time.time():.6f} {rec.source}\n")
            files += 1
            nbytes += rec.size
        if out:
            out.close()
        ok = True
    seconds = time.monotonic() - t0
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"mode": a.mode, "files": files, "bytes": nbytes, "seconds": seconds, "ok": ok,
                      "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss_kib": _vm_hwm_kib()}), flush=True)
    return 0


PIN = {"src": (), "dst": ()}  # taskset prefixes: the sending process on one core, the receiver on the other


def pin(on: bool) -> None:
    if on and shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        PIN.update(src=("taskset", "-c", "0"), dst=("taskset", "-c", "1"))


def _vm_hwm_kib() -> int:
    """This process's peak resident set (``VmHWM``). Not ``ru_maxrss``: Linux carries that over from
    the parent's address space at fork and exec, so a child of a big parent reports the parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _drive(*args: str, timeout: float = 1800) -> dict:
    r = subprocess.run([*PIN["src"], sys.executable, "-m", "fstream_bench.datapath.flow", "--drive", *args],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"driver {args[0]} failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- the receiver ------------------------------------------------------------------------------------
class Receiver:
    def __init__(self, root: Path, secret: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([*PIN["dst"], sys.executable, "-m", "transfer_agent.cli", "receive", "--listen",
                                      "127.0.0.1:0", "--root", str(root), "--secret-file", str(secret)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.stop()
            raise RuntimeError(f"receiver did not start: {line!r}")
        self.port = int(line.rsplit(":", 1)[1])

    def url(self, path: str) -> str:
        return f"fstream://127.0.0.1:{self.port}/{path}"

    def stop(self) -> None:
        from fstream_bench.core.children import end

        end(self.proc, 10, None)


def _landed(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*")
            if p.is_file() and not p.name.startswith(".")}


# -- latency -------------------------------------------------------------------------------------------
WRITER = """
import os, sys, time
d, n, size, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
data = os.urandom(size)
with open(sys.argv[5], "w") as log:
    t = time.monotonic()
    for i in range(n):
        p = os.path.join(d, f"f{i:06d}.dat")
        with open(p, "wb") as f:
            f.write(data)
        log.write(f"{time.time():.6f} {p}\\n")
        t += 1.0 / rate
        time.sleep(max(0.0, t - time.monotonic()))
"""


def latency(work: Path, secret: Path, n: int, size: int, rate: float, inotify: bool) -> dict:
    src, dst = work / "lat-src", work / "lat-dst"
    for d in (src, dst):
        shutil.rmtree(d, ignore_errors=True)
    src.mkdir(parents=True)
    rx = Receiver(dst, secret)
    try:
        stamps, closes = work / "stamps.txt", work / "closes.txt"
        args = ["watch", "--src", str(src), "--to", rx.url("lat"), "--secret-file", str(secret), "--files", str(n),
                "--interval", "1.0", "--stamps", str(stamps)] + ([] if inotify else ["--no-inotify"])
        flow = subprocess.Popen([*PIN["src"], sys.executable, "-m", "fstream_bench.datapath.flow", "--drive", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)  # the flow is watching before the first file closes
        subprocess.run([sys.executable, "-c", WRITER, str(src), str(n), str(size), str(rate), str(closes)],
                       check=True, timeout=n / rate + 60)
        out, err = flow.communicate(timeout=120)
        if flow.returncode != 0:
            raise RuntimeError(f"flow failed: {err[-2000:]}")
        landed = _landed(dst)
        assert len(landed) == n and set(landed.values()) == {size}, f"{len(landed)} of {n} landed"
    finally:
        rx.stop()
    closed = {p: float(t) for t, p in (line.split(" ", 1) for line in closes.read_text().splitlines())}
    lat = sorted(float(t) - closed[p] for t, p in (line.split(" ", 1) for line in stamps.read_text().splitlines()))
    q = statistics.quantiles(lat, n=100, method="inclusive")
    return {"watch": "inotify" if inotify else "polling 1 s", "files": n, "size": size, "rate": rate,
            "p50": q[49], "p90": q[89], "p99": q[98], "max": lat[-1], "min": lat[0],
            "latencies_s": [round(x, 6) for x in lat]}  # every file's, sorted


# -- throughput ----------------------------------------------------------------------------------------
def make_tree(d: Path, files: int, size: int, per_dir: int = 1000) -> None:
    """``files`` files of ``size`` bytes: one real file per directory, the rest hard links of it."""
    d.mkdir(parents=True, exist_ok=True)
    data = os.urandom(size)
    for i in range(files):
        sub = d / f"d{i // per_dir:04d}"
        first = sub / f"f{(i // per_dir) * per_dir:07d}.dat"
        p = sub / f"f{i:07d}.dat"
        if i % per_dir == 0:
            sub.mkdir(exist_ok=True)
            p.write_bytes(data)
        else:
            os.link(first, p)


def throughput(work: Path, secret: Path, name: str, files: int, size: int, repeats: int) -> dict:
    src = work / f"tp-{name}"
    shutil.rmtree(src, ignore_errors=True)
    if size >= 16 << 20:  # large files: distinct content each (a dedup-free read path)
        src.mkdir(parents=True)
        for i in range(files):
            (src / f"f{i:04d}.dat").write_bytes(os.urandom(size))
    else:
        make_tree(src, files, size)
    modes = ("send", "send-manifest", "flow")
    runs: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}  # CPU-seconds of the sending process (all its threads)
    raw: list[dict] = []  # every run as the driver reported it, in the order run
    for rep in range(repeats):
        for mode in (modes if rep % 2 == 0 else modes[::-1]):
            dst = work / "tp-dst"
            shutil.rmtree(dst, ignore_errors=True)
            rx = Receiver(dst, secret)
            try:
                r = _drive(mode, "--src", str(src), "--to", rx.url("tp"), "--secret-file", str(secret))
                landed = _landed(dst)
                assert r["ok"] and len(landed) == files and set(landed.values()) == {size}, (mode, r, len(landed))
            finally:
                rx.stop()
            runs[mode].append(files * size * 8 / r["seconds"])
            cpu[mode].append(r["cpu_s"])
            raw.append({"repeat": rep, **r})
    shutil.rmtree(src, ignore_errors=True)
    med = {m: statistics.median(v) for m, v in runs.items()}
    return {"data": name, "files": files, "size": size, "runs_bps": runs, "median_bps": med,
            "cpu_s": {m: statistics.median(v) for m, v in cpu.items()}, "runs_cpu_s": cpu, "runs": raw,
            "ratio": med["flow"] / med["send"], "ratio_manifest": med["flow"] / med["send-manifest"]}


# -- memory --------------------------------------------------------------------------------------------
def memory(work: Path, secret: Path, files: int, size: int) -> dict:
    src = work / "mem-src"
    shutil.rmtree(src, ignore_errors=True)
    make_tree(src, files, size)
    out = {"files": files, "size": size}
    for mode in ("watch", "send"):
        dst = work / "mem-dst"
        shutil.rmtree(dst, ignore_errors=True)
        rx = Receiver(dst, secret)
        try:
            r = _drive(mode, "--src", str(src), "--to", rx.url("mem"), "--secret-file", str(secret),
                       "--files", str(files))
            assert len(_landed(dst)) == files, f"{mode}: {len(_landed(dst))} of {files} landed"
        finally:
            rx.stop()
        out[f"{mode}_maxrss_mib"] = r["maxrss_kib"] / 1024
        out[f"{mode}_seconds"] = r["seconds"]
        out.setdefault("runs", []).append(r)  # the driver's own report of each run
    shutil.rmtree(src, ignore_errors=True)
    return out


# -- report --------------------------------------------------------------------------------------------
def report(res: dict) -> str:
    m = res["machine"]
    lines = [f"Machine: {m['nproc']} cores, {m['cpu']}, {m['mem_gib']:.0f} GiB, kernel {m['kernel']}; "
             f"load average before {m['loadavg']}; {m['date']}; "
             + ("sender pinned to CPU 0, receiver to CPU 1" if res.get("pinned") else "not pinned"), ""]
    if res.get("latency"):
        lines += ["| watch | files | size | rate | p50 | p90 | p99 | max |", "|---|---|---|---|---|---|---|---|"]
        for r in res["latency"]:
            lines.append(f"| {r['watch']} | {r['files']} | {r['size'] >> 10} KiB | {r['rate']:g}/s | {r['p50']:.3f} s "
                         f"| {r['p90']:.3f} s | {r['p99']:.3f} s | {r['max']:.3f} s |")
        lines.append("")
    if res.get("throughput"):
        lines += ["| data | send | send --manifest | flow | flow / send | flow / send --manifest | runs (Gbit/s) "
                  "send; --manifest; flow |", "|---|---|---|---|---|---|---|"]
        for r in res["throughput"]:
            med, runs = r["median_bps"], r["runs_bps"]
            fmt = lambda v: ", ".join(f"{x / 1e9:.2f}" for x in v)  # noqa: E731
            lines.append(f"| {r['data']}: {r['files']} x {r['size'] >> 10} KiB | {med['send'] / 1e9:.2f} Gbit/s "
                         f"| {med['send-manifest'] / 1e9:.2f} Gbit/s | {med['flow'] / 1e9:.2f} Gbit/s "
                         f"| {r['ratio']:.3f} | {r['ratio_manifest']:.3f} "
                         f"| {fmt(runs['send'])}; {fmt(runs['send-manifest'])}; {fmt(runs['flow'])} |")
        lines += ["", "| data | sending process CPU-seconds (median): send | send --manifest | flow | per GB | "
                  "per 1,000 files |", "|---|---|---|---|---|---|"]
        for r in res["throughput"]:
            c, gb, k = r["cpu_s"], r["files"] * r["size"] / 1e9, r["files"] / 1000
            per = lambda d: " / ".join(f"{c[m] / d:.3f}" for m in ("send", "send-manifest", "flow"))  # noqa: E731
            lines.append(f"| {r['data']} | {c['send']:.2f} | {c['send-manifest']:.2f} | {c['flow']:.2f} | {per(gb)} "
                         f"| {per(k)} |")
        lines.append("")
    if res.get("memory"):
        r = res["memory"]
        lines += ["| files | flow (watch_path + transfer) peak RSS | fstream send peak RSS | flow time | send time |",
                  "|---|---|---|---|---|",
                  f"| {r['files']:,} x {r['size']} B | {r['watch_maxrss_mib']:.0f} MiB | {r['send_maxrss_mib']:.0f} "
                  f"MiB | {r['watch_seconds']:.0f} s | {r['send_seconds']:.0f} s |", ""]
    if res.get("provenance"):
        p = res["provenance"]
        lines.append(f"Provenance: `{p['command']}`, commit {p['commit'][:12]}{' (dirty)' if p['dirty'] else ''}, "
                     f"code {p['code_hash'][:19]}; every run and every file's latency are in results.json.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--drive"]:
        return drive(argv[1:])
    from fstream_bench.core import RESULTS_DIR  # here: the --drive child imports no more than it did

    ap = argparse.ArgumentParser(prog="fstream bench flow", description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="latency,throughput,memory")
    ap.add_argument("--latency-files", type=int, default=300)
    ap.add_argument("--latency-size", type=int, default=256 << 10)
    ap.add_argument("--rate", type=float, default=20.0, help="files closed per second in the latency run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--large", default="8x256", help="throughput, large files: COUNTxMiB")
    ap.add_argument("--small", default="2000x256", help="throughput, small files: COUNTxKiB")
    ap.add_argument("--memory-files", type=int, default=100_000)
    ap.add_argument("--memory-size", type=int, default=4096)
    ap.add_argument("--workdir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument("--results", default=str(RESULTS_DIR))
    ap.add_argument("--no-pin", action="store_true",
                    help="do not pin the sending side to CPU 0 and the receiver to CPU 1")
    a = ap.parse_args(argv)
    pin(not a.no_pin)
    parts = set(a.parts.split(","))
    from fstream_bench.core import provenance

    prov = provenance.start("flow", argv, __getattr__("MODULES"))
    res: dict = {"bench": "flow", "provenance": prov, "machine": machine_info(), "argv": argv,
                 "pinned": bool(PIN["src"])}
    work = Path(tempfile.mkdtemp(prefix="fstream-flow-bench-", dir=a.workdir))
    try:
        secret = work / "secret"
        secret.write_text(os.urandom(32).hex() + "\n")
        secret.chmod(0o600)
        if "latency" in parts:
            res["latency"] = [latency(work, secret, a.latency_files, a.latency_size, a.rate, inotify)
                              for inotify in (True, False)]
        if "throughput" in parts:
            (ln, lm), (sn, sk) = (map(int, a.large.split("x")), map(int, a.small.split("x")))
            res["throughput"] = [throughput(work, secret, "large", ln, lm << 20, a.repeats),
                                 throughput(work, secret, "small", sn, sk << 10, a.repeats)]
        if "memory" in parts:
            res["memory"] = memory(work, secret, a.memory_files, a.memory_size)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    provenance.finish(prov)
    out = Path(a.results) / f"flow-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    table = report(res)
    (out / "table.md").write_text(table + "\n")
    print(table)
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
