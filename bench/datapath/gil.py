"""The part of each side's CPU that more cores cannot help: GIL-held CPU per GB and per 1,000 files (issue 29).

One Python process runs Python on one core at a time. A side's CPU that is spent outside the GIL (the native
receive loop, ``sendfile``, the checksum's reads and hash updates: ``transfer_agent.storage.gil_meter``) can
spread over cores; what is left is an **upper bound** of its GIL-held CPU (every other syscall and C call is
counted as held). One process per side cannot go faster than ``bytes / held`` however many cores it has: that
bound, per side, is the input of the 100 Gbit/s plan in BENCHMARKS §12. Where ``perf`` runs, the bench also
samples both pinned CPUs and reports the interpreter's share of each side's samples (libpython, and libc as
called from it) times its CPU: the GIL-held CPU as sampled, next to the bound.

Each side runs in its own process, pinned (sender CPU 0, receiver CPU 1), with a shared secret (keyed BLAKE3
end to end) from tmpfs to tmpfs; the receiver reports its CPU and GIL-free CPU around each run. Cases: one
1 GiB file at p = 4, 2000 one-byte files at cc = 4 with pipelining, and one 1-byte file (each side's fixed cost
per run, which ``fstream bench hundred-g`` takes off the others). Run: ``fstream bench gil --repeat 5``.
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
from typing import Any

from transfer_agent.storage import tree_hash

MODULES = ("transfer_agent", "fstream_provider.authz", "fstream_provider.model", "fstream_bench.datapath.gil")

_RECEIVER = """
import json, resource, sys
from transfer_agent.receiving.receiver import Receiver
from transfer_agent.storage import gil_meter
from transfer_agent.wire.auth import load_secret
rx = Receiver(listen=("127.0.0.1", 0), root=sys.argv[1], secret=load_secret(sys.argv[2]), fsync=False).start()
print(json.dumps({"port": rx.port}), flush=True)
for line in sys.stdin:
    if line.strip() == "stop":
        break
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"cpu": ru.ru_utime + ru.ru_stime, "free": gil_meter.free_seconds(),
                      "read_back": rx.stats["bytes_hashed_read_back"]}), flush=True)
rx.stop()
"""

_SENDER = """
import json, resource, sys, time
from fstream_provider.model.spec import TransferSpec
from transfer_agent.sending.sender import Transfer
from transfer_agent.storage import gil_meter
opts = json.loads(sys.argv[3])
spec = TransferSpec.from_options([sys.argv[1]], sys.argv[2], **opts)
t0 = time.monotonic()
res = Transfer(spec).run()
wall = time.monotonic() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"ok": res.ok, "files": res.verified_files, "wall": wall, "cpu": ru.ru_utime + ru.ru_stime,
                  "free": gil_meter.free_seconds()}), flush=True)
"""


def _pinned(cpu: int, argv: list[str], pin: bool) -> list[str]:
    return (["taskset", "-c", str(cpu)] if pin and shutil.which("taskset") else []) + argv


def _make(workdir: Path, case: str) -> tuple[Path, int, int]:
    src = workdir / f"src-{case}"
    if case == "big":
        src.mkdir(parents=True, exist_ok=True)
        with open(src / "big.bin", "wb") as f:
            block = os.urandom(1 << 20)
            for _ in range(1024):
                f.write(block)
        return src, 1 << 30, 1
    if case == "tiny":  # a side's fixed cost per run (start-up, connect, authenticate): the others net of it
        src.mkdir(parents=True, exist_ok=True)
        (src / "one").write_bytes(b"x")
        return src, 1, 1
    for i in range(2000):
        d = src / f"d{i % 20}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}").write_bytes(b"x")
    return src, 2000, 2000


CASES = {"big": {"cc": 1, "p": 4}, "small": {"cc": 4, "p": 1, "pp": 16}, "tiny": {"cc": 1, "p": 1}}


def run(repeat: int, workdir: Path, pin: bool = True, cases: tuple[str, ...] = ("big", "small"),
        sampled: bool = True) -> dict[str, Any]:
    py = sys.executable
    secret = workdir / "secret"
    secret.write_bytes(os.urandom(32).hex().encode())
    secret.chmod(0o600)
    dst = workdir / "dst"
    dst.mkdir(exist_ok=True)
    rx = subprocess.Popen(_pinned(1, [py, "-c", _RECEIVER, str(dst), str(secret)], pin), stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
    out: dict[str, Any] = {"runs": {}}
    try:
        port = json.loads(rx.stdout.readline())["port"]

        def mark() -> dict:
            rx.stdin.write("mark\n")
            rx.stdin.flush()
            return json.loads(rx.stdout.readline())

        for case in cases:
            src, nbytes, nfiles = _make(workdir, case)
            runs = out["runs"][case] = []
            perf = _PerfRecord(workdir / f"perf-{case}.data") if pin and sampled else None
            for i in range(repeat):
                before = mark()
                opts = {"secret_file": str(secret), "tuner": "fixed", **CASES[case]}
                tx = subprocess.run(_pinned(0, [py, "-c", _SENDER, str(src), f"fstream://127.0.0.1:{port}/r{i}",
                                                json.dumps(opts)], pin), capture_output=True, text=True, timeout=600)
                if tx.returncode != 0:
                    raise RuntimeError(f"gil bench: the sender failed ({tx.returncode}): {tx.stderr[-2000:]}")
                sent = json.loads(tx.stdout.strip().splitlines()[-1])
                time.sleep(0.5)  # the receiver's commit and teardown, then its CPU is read
                after = mark()
                if not sent["ok"] or sent["files"] != nfiles:
                    raise RuntimeError(f"gil bench: {case} run {i} did not verify every file: {sent}")
                runs.append({"wall": sent["wall"], "tx_cpu": sent["cpu"], "tx_free": sent["free"],
                             "rx_cpu": after["cpu"] - before["cpu"], "rx_free": after["free"] - before["free"],
                             "rx_read_back": after["read_back"] - before["read_back"], "bytes": nbytes,
                             "files": nfiles})
                shutil.rmtree(dst / f"r{i}", ignore_errors=True)
            if perf is not None:
                out.setdefault("sampled", {})[case] = perf.stop()
            shutil.rmtree(src, ignore_errors=True)
    finally:
        if rx.poll() is None:
            rx.stdin.write("stop\n")
            rx.stdin.flush()
            try:
                rx.wait(30)
            except subprocess.TimeoutExpired:
                rx.kill()
    out["summary"] = summarize(out["runs"], out.get("sampled"))
    return out


INTERPRETER = ("libpython", "python3", "libc.so")  # CPU here runs with the GIL held (libc: malloc and the like)


class _PerfRecord:
    """``perf record`` of both pinned CPUs while a case runs: the share of each side's samples in the interpreter
    (libpython, and libc as called from it) is the GIL-held part of its CPU as sampled, where ``gil_meter``'s
    figure is a bound (it counts every syscall and softirq outside the timed calls as held)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc = (subprocess.Popen(["perf", "record", "-q", "-a", "-o", str(path)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL) if shutil.which("perf") else None)
        time.sleep(0.5)  # perf is recording before the first run starts

    def stop(self) -> dict[str, Any] | None:
        if self.proc is None:
            return None
        self.proc.send_signal(2)
        self.proc.wait(60)
        out = {}
        for side, cpu in (("tx", 0), ("rx", 1)):
            # (``--comm`` with ``--sort dso`` drops the kernel's samples here: sort by both, keep the side's rows)
            rep = subprocess.run(["perf", "report", "-i", str(self.path), "--cpu", str(cpu), "--sort", "comm,dso",
                                  "--stdio", "-q"], capture_output=True, text=True, timeout=300).stdout
            rows = {}
            for line in rep.splitlines():
                pct, _, rest = line.strip().partition("%")
                comm, _, dso = rest.strip().partition(" ")
                try:
                    if comm == "python3":
                        rows[dso.strip()] = rows.get(dso.strip(), 0.0) + float(pct)
                except ValueError:
                    continue
            total = sum(rows.values()) or 1.0
            shares = {k: v / total for k, v in rows.items()}
            out[side] = {"shares": shares,
                         "interpreter": sum(v for k, v in shares.items() if any(n in k for n in INTERPRETER))}
        self.path.unlink(missing_ok=True)
        return out


def _med(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(runs: dict[str, list[dict]], sampled: dict | None = None) -> dict[str, dict]:
    """Per case and side: CPU and held CPU (upper bound) per GB or per 1,000 files, median and range."""
    summary = {}
    for case, rows in runs.items():
        unit = {"big": lambda r: r["bytes"] / 1e9, "small": lambda r: r["files"] / 1000}.get(case, lambda r: 1)
        per = {"big": "GB", "small": "1k files"}.get(case, "run")
        s: dict[str, Any] = {"per": per, "gbps": _med([r["bytes"] * 8 / r["wall"] / 1e9 for r in rows])}
        for side in ("tx", "rx"):
            s[f"{side}_cpu"] = _med([r[f"{side}_cpu"] / unit(r) for r in rows])
            s[f"{side}_held"] = _med([(r[f"{side}_cpu"] - r[f"{side}_free"]) / unit(r) for r in rows])
        s["rx_read_back_bytes"] = _med([r["rx_read_back"] for r in rows])
        samp = (sampled or {}).get(case)
        for side in ("tx", "rx"):
            if samp and samp.get(side):  # the sampled interpreter share of the side's CPU, per unit
                share = samp[side]["interpreter"]
                s[f"{side}_held_sampled"] = _med([r[f"{side}_cpu"] * share / unit(r) for r in rows])
        summary[case] = s
    return summary


def table(summary: dict[str, dict]) -> str:
    lines = ["| case | Gbit/s | sender CPU-s | sender held ≤ | sender held, sampled | receiver CPU-s "
             "| receiver held ≤ | receiver held, sampled | per |", "|---|---|---|---|---|---|---|---|---|"]
    f = lambda m: f"{m['median']:.3f} ({m['min']:.3f}-{m['max']:.3f})" if m else "-"  # noqa: E731
    for case, s in summary.items():
        lines.append(f"| {case} | {s['gbps']['median']:.2f} | {f(s['tx_cpu'])} | {f(s['tx_held'])} | "
                     f"{f(s.get('tx_held_sampled'))} | {f(s['rx_cpu'])} | {f(s['rx_held'])} | "
                     f"{f(s.get('rx_held_sampled'))} | {s['per']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fstream bench gil", description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workdir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument("--cases", default="big,small,tiny")
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--no-perf", action="store_true", help="do not sample the interpreter's share with perf")
    ap.add_argument("--results", default=None)
    args = ap.parse_args(argv)
    from fstream_bench.core.saved import run_saved

    from fstream_bench.core.vm_memory import held_free_pages

    work = Path(tempfile.mkdtemp(prefix="fstream-gil-", dir=args.workdir))

    def measure() -> dict[str, Any]:
        # freed pages stay in the guest, and the memory the runs reuse is touched once (BENCHMARKS §12: a
        # first touch of memory this VM handed back to its host costs ~1.8 CPU-s per GiB to whoever writes it)
        with held_free_pages(warm_bytes=3 << 30) as memory_note:
            return {"load_start": os.getloadavg(), "repeat": args.repeat, "pinned": not args.no_pin,
                    "native": tree_hash.NATIVE and os.environ.get("FSTREAM_NATIVE", "1") != "0",
                    "memory": memory_note, **run(args.repeat, work, not args.no_pin, tuple(args.cases.split(",")),
                                                 sampled=not args.no_perf)}

    try:
        doc = run_saved("gil", list(sys.argv[1:] if argv is None else argv), MODULES, measure, args.results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(doc["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
