"""Issue 8: what each authentication mode costs, measured in one run.

``fstream bench trust`` sends the same data with every mode the agent offers and reports
throughput and CPU-seconds of each side per GB moved:

- ``hmac``: shared secret; mutual HMAC proofs, MAC'd control frames, keyed BLAKE3 file digests;
  data blocks travel in the clear with ``sendfile``/``splice``.
- ``hmac+encrypt``: the same plus ``--encrypt``: every data block sealed with an AEAD.
- ``tls``: mutual TLS (certificates from a throw-away CA), xxh3-128 file digests.
- ``hmac --no-verify``: no end-to-end digest at all: the floor of the data path, for reference
  (not a mode anyone should run on data they care about).

On loopback each side runs pinned (``taskset``: sender on CPU 0, receiver on CPU 1), the
destination is on tmpfs and ``--no-fsync`` is set, so the figures are the data path's own cost.
CPU-seconds are user + system of all threads: the sender's from ``wait4`` rusage, the
receiver's from psutil before and after each transfer. ``--wan`` runs the same cases on the
emulated WAN (1 Gbit/s, 40 ms), where the question is whether the mode lowers throughput at all.
Repeats interleave the modes; the table gives medians and the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fstream_provider.model.units import parse_size

MODES = ("hmac", "hmac+encrypt", "tls", "hmac --no-verify")


def _certs(d: Path) -> dict[str, str]:
    """A throw-away CA and one certificate per side (openssl CLI)."""
    d.mkdir(parents=True, exist_ok=True)

    def run(*a: str) -> None:
        subprocess.run(["openssl", *a], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
        "-subj", "/CN=fstream-bench-ca", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    for name in ("server", "client"):
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
            "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))
        run("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
            "-CAcreateserial", "-days", "2", "-out", str(d / f"{name}.pem"))
    return {k: str(d / k) for k in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


def _dataset(root: Path, count: int, size: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    block = os.urandom(min(size, 8 << 20))
    for i in range(count):
        p = root / f"f{i:05d}.dat"
        if p.exists() and p.stat().st_size == size:
            continue
        with open(p, "wb") as f:
            left = size
            while left > 0:
                n = min(left, len(block))
                f.write(block[:n] if i == 0 else (i.to_bytes(8, "little") + block[8:n]))
                left -= n
    return root


def _warm(d: Path) -> None:
    for p in sorted(d.iterdir()):
        with open(p, "rb") as f:
            while f.read(8 << 20):
                pass


class _Receiver:
    """``fstream receive`` for one mode, optionally pinned and inside the destination namespace."""

    def __init__(self, mode: str, work: Path, root: Path, secret: Path, certs: dict[str, str], prefix: list[str],
                 host: str) -> None:
        from fstream_bench.peers.fstream import fstream_argv

        args = ["receive", "--listen", f"{host}:0", "--root", str(root), "--no-fsync"]
        if mode == "tls":
            args += ["--tls-cert", certs["server.pem"], "--tls-key", certs["server.key"], "--tls-ca", certs["ca.pem"]]
        else:
            args += ["--secret-file", str(secret)]
        self.log = open(work / f"receiver-{mode.replace(' ', '_')}.log", "wb")
        self.proc = subprocess.Popen([*prefix, *fstream_argv(), *args], stdout=subprocess.PIPE, stderr=self.log,
                                     env={**os.environ, "FSTREAM_STATE_DIR": str(work / "state")})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if "listening on" not in line:
            raise RuntimeError(f"fstream receive ({mode}) did not start: {line!r}")
        self.port = int(line.rsplit(":", 1)[1].split()[0].strip(", "))
        self.host = host

    def cpu(self) -> float:
        import psutil

        total = 0.0
        procs = [psutil.Process(self.proc.pid)]
        procs += procs[0].children(recursive=True)
        for p in procs:
            t = p.cpu_times()
            total += t.user + t.system
        return total

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _send(mode: str, rx: _Receiver, src: Path, dest: str, secret: Path, certs: dict[str, str], prefix: list[str],
          opts: list[str], work: Path) -> dict:
    from fstream_bench.peers.fstream import fstream_argv

    argv = [*prefix, *fstream_argv(), "send", str(src), "--to", f"fstream://{rx.host}:{rx.port}/{dest}",
            "--tuner", "fixed", "--json", *opts]
    if mode == "tls":
        argv += ["--tls-cert", certs["client.pem"], "--tls-key", certs["client.key"], "--tls-ca", certs["ca.pem"]]
    else:
        argv += ["--secret-file", str(secret)]
    if mode == "hmac+encrypt":
        argv.append("--encrypt")
    if mode == "hmac --no-verify":
        argv.append("--no-verify")
    rx_cpu0 = rx.cpu()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "FSTREAM_STATE_DIR": str(work / "state-send")})
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    # the sender's CPU: children's rusage (wait4 already reaped it through communicate)
    rx_cpu = rx.cpu() - rx_cpu0
    doc: dict = {}
    for line in reversed(out.decode().splitlines()):
        try:
            doc = json.loads(line)
            break
        except ValueError:
            continue
    if proc.returncode != 0 or not doc:
        raise RuntimeError(f"fstream send ({mode}) failed with {proc.returncode}: {err.decode()[-600:]}")
    return {"wall": wall, "bytes": int(doc.get("bytes", 0)), "files": int(doc.get("files", 0)),
            "verified": int(doc.get("verified_files", 0)), "bps": float(doc.get("throughput_bps", 0.0)),
            "rx_cpu": rx_cpu}


def _children_cpu() -> float:
    r = os.times()
    return r.children_user + r.children_system


def run_cases(sites: str, cases: list[tuple[str, Path, list[str]]], modes: list[str], repeat: int, work: Path,
              src_prefix: list[str], dst_prefix: list[str], dst_host: str) -> list[dict]:
    from transfer_agent.wire.auth import create_secret_file

    secret = create_secret_file(work / "secret")
    certs = _certs(work / "certs")
    rows: list[dict] = []
    receivers = {m: _Receiver(m, work, work / "dst", secret, certs, dst_prefix, dst_host) for m in modes}
    try:
        for rep in range(repeat):
            for case, src, opts in cases:
                for mode in modes:  # interleaved: a slow minute of the machine hits every mode alike
                    dest = f"{case}-{mode.replace(' ', '_').replace('+', '_')}-{rep}"
                    c0 = _children_cpu()
                    r = _send(mode, receivers[mode], src, dest, secret, certs, src_prefix, opts, work)
                    r["tx_cpu"] = _children_cpu() - c0
                    r.update(case=case, mode=mode, rep=rep, sites=sites)
                    rows.append(r)
                    shutil.rmtree(work / "dst" / dest, ignore_errors=True)
                    print(f"{sites} {case} {mode} rep {rep}: {r['bps'] / 1e9:.2f} Gbit/s, sender "
                          f"{r['tx_cpu']:.2f} s, receiver {r['rx_cpu']:.2f} s CPU", file=sys.stderr)
    finally:
        for rx in receivers.values():
            rx.stop()
    return rows


def summarise(rows: list[dict]) -> list[str]:
    out = ["| where | case | mode | runs | Gbit/s (median, min–max) | / hmac | sender CPU-s per GB | "
           "receiver CPU-s per GB | both per GB / hmac |", "|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["sites"], r["case"]) for r in rows}, key=lambda k: (k[0] != "loopback", k[1]))
    for sites, case in keys:
        per_mode: dict[str, dict] = {}
        for mode in MODES:
            rs = [r for r in rows if r["sites"] == sites and r["case"] == case and r["mode"] == mode]
            if not rs:
                continue
            gb = [r["bytes"] / 1e9 for r in rs]
            per_mode[mode] = {
                "n": len(rs), "bps": statistics.median(r["bps"] for r in rs),
                "lo": min(r["bps"] for r in rs), "hi": max(r["bps"] for r in rs),
                "tx": statistics.median(r["tx_cpu"] / g for r, g in zip(rs, gb)),
                "rx": statistics.median(r["rx_cpu"] / g for r, g in zip(rs, gb)),
                "ok": all(r["verified"] == r["files"] or r["mode"] == "hmac --no-verify" for r in rs)}
        base = per_mode.get("hmac")
        for mode, m in per_mode.items():
            rel = f"{m['bps'] / base['bps']:.2f}" if base else "–"
            cpu_rel = f"{(m['tx'] + m['rx']) / (base['tx'] + base['rx']):.2f}" if base else "–"
            out.append(f"| {sites} | {case} | {mode}{'' if m['ok'] else ' (NOT VERIFIED)'} | {m['n']} | "
                       f"{m['bps'] / 1e9:.2f} ({m['lo'] / 1e9:.2f}–{m['hi'] / 1e9:.2f}) | {rel} | "
                       f"{m['tx']:.2f} | {m['rx']:.2f} | {cpu_rel} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fstream bench trust", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--big-bytes", type=parse_size, default=parse_size("1GiB"))
    ap.add_argument("--small-count", type=int, default=500)
    ap.add_argument("--small-bytes", type=parse_size, default=parse_size("1MiB"))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--wan", action="store_true", help="also run on the emulated WAN (root; 1 Gbit/s, 40 ms)")
    ap.add_argument("--no-loopback", action="store_true")
    ap.add_argument("--results", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    from fstream_bench.report import machine_info

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"--modes: unknown mode(s) {', '.join(bad)} (known: {', '.join(MODES)})")
    work = Path("/dev/shm") / f"fstream-trust-{os.getpid()}"
    work.mkdir(parents=True)
    load0 = os.getloadavg()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    rows: list[dict] = []
    try:
        big = _dataset(work / "src" / "big", 1, args.big_bytes)
        small = _dataset(work / "src" / "small", args.small_count, args.small_bytes)
        _warm(big)
        _warm(small)
        cases = [("1 x big, p=4", big, ["--cc", "1", "--p", "4", "--pp", "0"]),
                 (f"{args.small_count} x {args.small_bytes >> 20} MiB, cc=4 pp=16", small,
                  ["--cc", "4", "--p", "1", "--pp", "16"])]
        if not args.no_loopback:
            pin_tx = ["taskset", "-c", "0"] if shutil.which("taskset") and os.cpu_count() and os.cpu_count() > 1 else []
            pin_rx = ["taskset", "-c", "1"] if pin_tx else []
            rows += run_cases("loopback", cases, modes, args.repeat, work, pin_tx, pin_rx, "127.0.0.1")
        if args.wan:
            from fstream_bench.wan import netns
            from fstream_bench.wan.path import WanConfig, WanPath

            path = WanPath(WanConfig(rate_bps=1e9, rtt_s=0.040, buffer_bytes=1 << 20, run_id="tr"))
            path.up()
            try:
                wan_cases = [(c, s, [*o[:-4], "--cc", "4", "--p", "4", "--pp", o[-1]]) if c.startswith("1 x") else
                             (c, s, ["--cc", "8", "--p", "2", "--pp", "16"]) for c, s, o in cases]
                rows += run_cases("wan 1G/40ms", wan_cases, modes, max(1, args.repeat - 1), work,
                                  netns.ns_exec_argv(path.src_ns, []), netns.ns_exec_argv(path.dst_ns, []),
                                  path.dst_ip)
            finally:
                path.down()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mi = machine_info()
    md = "\n".join([
        "# Cost of each authentication mode (issue 8)", "",
        f"machine: nproc {mi['nproc']}, {mi['cpu']}, kernel {mi['kernel']}; load average at start "
        f"{load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"reproduce: `fstream bench trust {' '.join(argv if argv is not None else sys.argv[1:])}`", "",
        *summarise(rows), ""])
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"trust-{stamp}.md").write_text(md)
    (out / f"trust-{stamp}.json").write_text(json.dumps(rows, indent=1))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
