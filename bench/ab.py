"""A/B of two checkouts of the agent on loopback, interleaved in one run: wall time and CPU-seconds per side.

For refactors that must not cost speed (issue #15): the same workloads are sent by checkout A and
checkout B alternately (A B, then B A, ...), each side pinned (sender on CPU 0, receiver on CPU 1),
destination on tmpfs, receiver without fsync, so the comparison is the agent's own code path.
Reports medians, the spread (min-max) and B/A ratios. Usage::

    python -m fstream_bench.ab --a-cmd '/tmp/old/fstream' --a-path /work/wt/base \
        --b-cmd .venv/bin/fstream --repeat 5
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

CASES = {  # name: (file count, file size, send options)
    "1 x 1 GiB, p=4": (1, 1 << 30, ["--tuner", "fixed", "--cc", "1", "--p", "4", "--pp", "0"]),
    "2000 x 256 KiB, cc=4 pp=16": (2000, 256 << 10, ["--tuner", "fixed", "--cc", "4", "--p", "1", "--pp", "16"]),
}


def _make(root: Path, count: int, size: int) -> Path:
    d = root / f"src-{count}x{size}"
    d.mkdir(parents=True)
    block = os.urandom(min(size, 1 << 20))
    for i in range(count):
        with open(d / f"f{i:05d}.dat", "wb") as f:
            left = size
            while left:
                n = min(left, len(block))
                f.write(block[:n])
                left -= n
    return d


class Side:
    """One checkout: its ``fstream`` command and PYTHONPATH, a pinned receiver on tmpfs."""

    def __init__(self, name: str, cmd: str, path: str | None, secret: Path, dst: Path) -> None:
        self.name, self.cmd, self.dst, self.secret = name, shlex.split(cmd), dst, secret
        self.env = dict(os.environ)
        if path:
            self.env["PYTHONPATH"] = f"{path}:{path}/.pyroot"
        else:
            self.env.pop("PYTHONPATH", None)
        dst.mkdir(parents=True)
        self.rx = subprocess.Popen(["taskset", "-c", "1", *self.cmd, "receive", "--listen", "127.0.0.1:0",
                                    "--root", str(dst), "--secret-file", str(secret), "--no-fsync"],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=self.env)
        line = self.rx.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"{name}: receiver did not start: {line!r}")
        self.port = int(line.rsplit(":", 1)[1])
        self.proc = psutil.Process(self.rx.pid)

    def _rx_cpu(self) -> float:
        t = self.proc.cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def send(self, src: Path, opts: list[str]) -> dict:
        shutil.rmtree(self.dst / "out", ignore_errors=True)
        rx0, t0 = self._rx_cpu(), time.monotonic()
        p = subprocess.Popen(["taskset", "-c", "0", *self.cmd, "send", str(src), "--to",
                              f"fstream://127.0.0.1:{self.port}/out", "--secret-file", str(self.secret),
                              "--json", *opts], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env)
        _pid, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        out = p.stdout.read()
        p.stdout.close()
        p.stderr.close()
        if status != 0:
            raise RuntimeError(f"{self.name}: send failed ({status}): {out[-500:]!r}")
        return {"wall": wall, "tx_cpu": ru.ru_utime + ru.ru_stime, "rx_cpu": self._rx_cpu() - rx0}

    def close(self) -> None:
        self.rx.terminate()
        self.rx.wait(15)
        self.rx.stdout.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fstream_bench.ab", description=__doc__.splitlines()[0])
    ap.add_argument("--a-cmd", required=True, help="checkout A's fstream command")
    ap.add_argument("--a-path", default=None, help="checkout A's source tree (PYTHONPATH)")
    ap.add_argument("--b-cmd", required=True)
    ap.add_argument("--b-path", default=None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--src-dir", default=None, help="where the datasets are written (default: a temp dir)")
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="run only these cases (repeatable)")
    a = ap.parse_args(argv)
    cases = {k: v for k, v in CASES.items() if not a.case or k in a.case}
    work = Path(tempfile.mkdtemp(prefix="fstream-ab-", dir=a.src_dir))
    tmpfs = Path(tempfile.mkdtemp(prefix="fstream-ab-dst-", dir="/dev/shm"))
    secret = work / "secret"
    secret.write_text(os.urandom(24).hex())
    secret.chmod(0o600)
    sides = []
    try:
        srcs = {name: _make(work, n, size) for name, (n, size, _o) in cases.items()}
        sides = [Side("A", a.a_cmd, a.a_path, secret, tmpfs / "a"), Side("B", a.b_cmd, a.b_path, secret, tmpfs / "b")]
        res: dict[tuple[str, str], list[dict]] = {}
        print(f"load average at start: {os.getloadavg()}", flush=True)
        for r in range(a.repeat):
            for case, (_n, _s, opts) in cases.items():
                # ABBA: whichever side runs second pays for the first one's page cache and tmpfs writes
                # (seen: up to 2x receiver CPU), so the order alternates every round
                for side in (sides if r % 2 == 0 else sides[::-1]):
                    res.setdefault((case, side.name), []).append(side.send(srcs[case], opts))
        print(f"load average at end: {os.getloadavg()}")
        print("| case | metric | A median (min-max) | B median (min-max) | B/A |")
        print("|---|---|---|---|---|")
        for case in cases:
            for metric in ("wall", "tx_cpu", "rx_cpu"):
                va = [r[metric] for r in res[(case, "A")]]
                vb = [r[metric] for r in res[(case, "B")]]
                ma, mb = statistics.median(va), statistics.median(vb)
                print(f"| {case} | {metric} s | {ma:.2f} ({min(va):.2f}-{max(va):.2f}) | "
                      f"{mb:.2f} ({min(vb):.2f}-{max(vb):.2f}) | {mb / ma:.2f} |")
    finally:
        for s in sides:
            s.close()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(tmpfs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
