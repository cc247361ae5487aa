"""Issue 8 (reworked for issue 26): what each authentication mode costs, measured in one run.

``fstream bench trust`` sends the same data with every mode the agent offers and reports both
sides' CPU-seconds per GB moved and the throughput of each:

- ``hmac``: shared secret; mutual HMAC proofs, MAC'd control frames, keyed BLAKE3 file digests;
  data blocks travel in the clear with ``sendfile``/``splice``.
- ``hmac+encrypt``: the same plus ``--encrypt``: every data block sealed with an AEAD.
- ``tls``: mutual TLS (certificates from a throw-away CA), xxh3-128 file digests.
- ``hmac --no-verify``: no end-to-end digest at all: the floor of the data path, for reference
  (not a mode anyone should run on data they care about).

Cases: one big file on one channel of 4 streams, and many 1 MiB files on 4 channels with
pipelining; sources and destinations on tmpfs, the receiver with ``--no-fsync``, so the figures are
the data path's own cost. Rounds interleave the modes (per round, per case: hmac, hmac+encrypt,
tls, --no-verify, then again); every run is kept in the result and the summary is the median and
range of all runs, with each mode's ratio to ``hmac`` taken within a round.

CPU per GB is the evidence (on a 2-core VM throughput moves with the machine); CPU-seconds are
user + system of every thread: the sender's from ``wait4`` at its exit (its ~0.2 s start-up
included), the receiver's as the difference of its process tree's CPU around the run
(``fstream_bench.core.cpu_meter``). Freed pages are held in the guest for the whole run
(``fstream_bench.core.vm_memory``, root only; without it a run's CPU swung 2-3x with how long ago
its memory was freed).

Loopback (default): each side pinned (sender on CPU 0, receiver on CPU 1, as ``bench loopback``).
``--wan`` (root): the same cases through the emulated WAN (default 1 Gbit/s, 40 ms) with TCP
buffers of at least twice the path's bandwidth-delay product (16 MiB at 1 Gbit/s x 40 ms; the
testbed's default 1 MiB cap held one stream to ~130 Mbit/s), so the path and not the window is
the limit; the selfcheck's one-stream iperf3 figure in the report shows it. Where no mode can be
the limit at the path's rate, the CPU per GB and the cores each side kept busy show the cost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from fstream_provider.model.units import format_bytes, parse_duration, parse_rate, parse_size

from fstream_bench.ops.trust_report import BASE, MODES, markdown, schedule, summarise, wan_buffer

RESULTS = Path(__file__).resolve().parents[1] / "results"


def log(msg: str) -> None:
    print(f"trust: {msg}", file=sys.stderr, flush=True)


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


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return format_bytes(n)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_")


def auth_args(side: str, mode: str, secret: Path, certs: dict[str, str]) -> list[str]:
    """The options that make ``fstream send`` (``side`` "send") or ``receive`` use ``mode``."""
    if mode == "tls":
        role = "client" if side == "send" else "server"
        return ["--tls-cert", certs[f"{role}.pem"], "--tls-key", certs[f"{role}.key"], "--tls-ca", certs["ca.pem"]]
    out = ["--secret-file", str(secret)]
    if side == "send" and mode == "hmac+encrypt":
        out.append("--encrypt")
    if side == "send" and mode == "hmac --no-verify":
        out.append("--no-verify")
    return out


def _receiver(mode: str, *, sites, workdir: Path, root: Path, secret: Path, certs: dict[str, str]):
    """``fstream receive --no-fsync`` for ``mode`` at the destination site (pinned / in its namespace by ``sites``)."""
    from fstream_bench.peers.fstream import FStreamReceiver

    return FStreamReceiver(sites=sites, workdir=workdir, root=root, extra_args=["--no-fsync"], secret=secret,
                           auth_args=auth_args("receive", mode, secret, certs))


def _remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def _one(mode: str, rx, sites, sources: list[Path], knobs: list[str], dest: str, secret: Path,
         certs: dict[str, str], workdir: Path, timeout: float) -> dict:
    """One ``fstream send`` with ``mode``: status, bytes, the agent's throughput, both sides' CPU-seconds."""
    from fstream_bench.core.cpu_meter import ServerCpu
    from fstream_bench.peers.base import PeerError, log_tail, run_client
    from fstream_bench.peers.fstream import _last_json, fstream_argv

    argv = [*fstream_argv(), "send", *map(str, sources), "--to", rx.url(dest), "--tuner", "fixed", "--json",
            *knobs, *auth_args("send", mode, secret, certs)]
    slog = workdir / f"send-{_slug(mode)}.log"
    env = {**os.environ, "FSTREAM_STATE_DIR": str(workdir / "state-send")}
    meter = ServerCpu(rx.proc.pid).start()
    try:
        try:
            done = run_client(sites.argv("src", argv), timeout, slog, env=env)
        finally:
            rx_cpu = meter.stop()  # once the receiver is quiet
    except PeerError as e:
        return {"ok": False, "error": str(e), "bytes": 0, "files": 0, "verified_files": 0, "wall_s": 0.0,
                "agent_s": None, "bps": 0.0, "tx_cpu_s": None, "rx_cpu_s": None}
    finally:
        _remove(rx.root / dest)  # freed now, so the next run writes into the pages this one used
    doc = _last_json(done.out) or {}
    failed = doc.get("failed_files", 0)
    nfailed = len(failed) if isinstance(failed, list) else int(failed or 0)
    files, verified = int(doc.get("files", 0)), int(doc.get("verified_files", 0))
    ok = done.status == 0 and bool(doc) and nfailed == 0 and (verified == files or mode == "hmac --no-verify")
    error = "" if ok else (f"status {done.status}, files {files}, verified {verified}, failed {failed!r}: "
                           f"{log_tail(slog, 300)} | receiver: {log_tail(rx.log, 300)}")
    return {"ok": ok, "error": error, "bytes": int(doc.get("bytes", 0)), "files": files, "verified_files": verified,
            "wall_s": done.wall, "agent_s": doc.get("seconds"), "bps": float(doc.get("throughput_bps") or 0.0),
            "tx_cpu_s": done.cpu_s, "rx_cpu_s": rx_cpu}


def run_cases(where: str, sites, cases: dict[str, tuple[list[Path], list[str]]], modes: list[str], repeat: int,
              work: Path, secret: Path, certs: dict[str, str], timeout: float) -> list[dict]:
    """Every (round, case, mode) of ``schedule`` at ``sites``, one receiver per mode kept running."""
    runs: list[dict] = []
    root = work / "dst" / where
    with contextlib.ExitStack() as stack:
        rxs = {m: stack.enter_context(_receiver(m, sites=sites, workdir=work / where / _slug(m), root=root,
                                                secret=secret, certs=certs)) for m in modes}
        plan = schedule(list(cases), modes, repeat)
        for seq, (rep, case, mode) in enumerate(plan):
            sources, knobs = cases[case]
            r = _one(mode, rxs[mode], sites, sources, knobs, f"{_slug(case)}-{_slug(mode)}-{rep}", secret, certs,
                     work / where, timeout)
            r.update(where=where, case=case, mode=mode, rep=rep, seq=seq)
            runs.append(r)
            if r["ok"]:
                log(f"[{seq + 1}/{len(plan)}] {where} {case} {mode} round {rep + 1}: {r['bps'] / 1e9:.2f} Gbit/s, "
                    f"CPU-s sender {r['tx_cpu_s']:.2f} receiver {r['rx_cpu_s']:.2f}")
            else:
                log(f"[{seq + 1}/{len(plan)}] {where} {case} {mode} round {rep + 1}: FAILED {r['error'][:400]}")
    return runs


def _wan_site(args, buffer: int, pin: bool) -> tuple[object, object, dict]:
    """Our own WAN path (``--wan-run-id``), selfchecked; (bench, sites, what the report says of it)."""
    from fstream_bench.peers.base import Sites
    from fstream_bench.wan.rig import open_bench

    bench = open_bench(SimpleNamespace(rate=args.wan_rate, rtt=args.wan_rtt, buffer=str(buffer),
                                       run_id=args.wan_run_id, loopback=False, force_path=args.force_path), log=log)
    try:
        cfg = bench.path.config
        sites = bench.sites
        if pin:
            sites = Sites(src_host=sites.src_host, dst_host=sites.dst_host,
                          src_prefix=("taskset", "-c", "0", *sites.src_prefix),
                          dst_prefix=("taskset", "-c", "1", *sites.dst_prefix), name=sites.name)
        check = bench.selfcheck
        one = check.get("single_stream_bps")
        share = one / cfg.expected_goodput_bps if one else None
        limit = ("so the path, not the window, limits" if share is not None and share >= 0.9 else
                 "below 0.9 of the path: something other than the path limits one stream (see the selfcheck)")
        note = (f"{cfg.describe()}: buffer {buffer / cfg.bdp_bytes:.1f}x the bandwidth-delay product "
                f"({format_bytes(cfg.bdp_bytes)}); one iperf3 stream reached "
                f"{'?' if share is None else f'{share:.2f}'} of the path's goodput in the selfcheck, {limit}; "
                "sides " + ("pinned (sender CPU 0, receiver CPU 1)" if pin else
                            "not pinned (the delay line needs CPU too)"))
        info = {"rate_bps": cfg.rate_bps, "rtt_s": cfg.rtt_s, "buffer_bytes": buffer, "bdp_bytes": cfg.bdp_bytes,
                "expected_goodput_bps": cfg.expected_goodput_bps, "single_stream_of_path": share, "pinned": pin,
                "selfcheck": check, "note": note}
    except BaseException:
        bench.close()
        raise
    return bench, sites, info


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fstream bench trust", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5, help="rounds on loopback (default 5)")
    ap.add_argument("--big-bytes", type=parse_size, default=parse_size("1GiB"), help="the big file (default 1GiB)")
    ap.add_argument("--small-count", type=int, default=500, help="files in the small set (default 500)")
    ap.add_argument("--small-bytes", type=parse_size, default=parse_size("1MiB"), help="each small file (default 1MiB)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, must include {BASE} "
                    f"(default: {','.join(MODES)})")
    ap.add_argument("--no-pin", action="store_true", help="loopback: do not pin the sides to CPU 0 and CPU 1")
    ap.add_argument("--wan", action="store_true", help="also run on the emulated WAN (root)")
    ap.add_argument("--no-loopback", action="store_true", help="skip the loopback runs (with --wan: WAN only)")
    ap.add_argument("--wan-repeat", type=int, default=4, help="rounds on the WAN (default 4)")
    ap.add_argument("--wan-rate", default="1Gbit", help="WAN bottleneck rate (default 1Gbit)")
    ap.add_argument("--wan-rtt", default="40ms", help="WAN round-trip time (default 40ms)")
    ap.add_argument("--wan-buffer", default="auto", type=lambda v: v if v == "auto" else parse_size(v),
                    help="WAN TCP buffer cap; auto (default): the smallest power of two >= 2x the bandwidth-delay "
                    "product (16MiB at 1Gbit x 40ms)")
    ap.add_argument("--wan-pin", action="store_true", help="WAN: pin the sides too (default not: the delay line "
                    "needs CPU on this 2-core machine)")
    ap.add_argument("--wan-run-id", default="trust", help="own WAN run id (default trust; never shared)")
    ap.add_argument("--force-path", action="store_true", help="WAN: measure even if the selfcheck fails (noted)")
    ap.add_argument("--timeout", type=parse_duration, default=parse_duration("10m"), help="per send (default 10m)")
    ap.add_argument("--results", default=str(RESULTS), help="where trust-STAMP.{json,md} go")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = parser()
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"--modes: unknown mode(s) {', '.join(bad)} (known: {', '.join(MODES)})")
    if BASE not in modes:
        ap.error(f"--modes must include {BASE}: every ratio is taken against it")
    if args.no_loopback and not args.wan:
        ap.error("nothing to run: --no-loopback without --wan")
    if min(args.repeat, args.wan_repeat) < 1:
        ap.error("--repeat and --wan-repeat must be at least 1")
    rate, rtt = parse_rate(args.wan_rate), parse_duration(args.wan_rtt)
    buffer = wan_buffer(rate, rtt) if args.wan_buffer == "auto" else args.wan_buffer
    if args.wan and os.geteuid() != 0:
        ap.error("--wan needs root (network namespaces)")
    if args.wan and buffer < 2 * rate * rtt / 8:
        log(f"warning: --wan-buffer {format_bytes(buffer)} is under twice the bandwidth-delay product "
            f"({format_bytes(int(rate * rtt / 8))}): the window may be the limit, not the mode")

    from fstream_bench.core import provenance
    from fstream_bench.peers import fstream as fs_peer
    from fstream_bench.core.vm_memory import held_free_pages
    from transfer_agent.wire.auth import create_secret_file

    modules = [*provenance.AGENT, "fstream_bench.ops.trust", "fstream_bench.ops.trust_report",
               "fstream_bench.core.cpu_meter", "fstream_bench.core.vm_memory", "fstream_bench.peers.base",
               "fstream_bench.peers.fstream"]
    if args.wan:
        modules += ["fstream_bench.wan.rig", "fstream_bench.wan"]
    prov = provenance.start("trust", argv, modules)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # so the memory hold, the path and the tmpfs data go on a kill
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    fs_peer.precompile()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    pin = not args.no_pin and shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
    doc: dict = {"bench": "trust", "modes": modes,
                 "settings": {"repeat": args.repeat, "wan_repeat": args.wan_repeat, "big_bytes": args.big_bytes,
                              "small_count": args.small_count, "small_bytes": args.small_bytes},
                 "order": f"per round, per case, every mode in turn ({', '.join(modes)}); ratios to {BASE} "
                          "within a round", "sites": {}, "runs": []}
    work = Path(tempfile.mkdtemp(prefix="fstream-trust-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:  # the datasets live on tmpfs (RAM): removed however the run ends
        secret = create_secret_file(work / "secret")
        certs = _certs(work / "certs")
        log(f"preparing datasets under {work}")
        big = _dataset(work / "src" / "big", 1, args.big_bytes)
        small = _dataset(work / "src" / "small", args.small_count, args.small_bytes)
        _warm(big)
        _warm(small)
        cases = {  # the same on loopback and the WAN
            f"1 x {_size(args.big_bytes)}, cc=1 p=4": (sorted(big.iterdir()), ["--cc", "1", "--p", "4", "--pp", "0"]),
            f"{args.small_count} x {_size(args.small_bytes)}, cc=4 pp=16": (
                [small], ["--cc", "4", "--p", "1", "--pp", "16"])}
        doc["cases"] = {c: knobs for c, (_, knobs) in cases.items()}
        with held_free_pages(warm_bytes=2 * args.big_bytes + args.small_count * args.small_bytes) as memory:
            log(memory)
            doc["memory"] = memory
            if not args.no_loopback:
                from fstream_bench.peers.base import Sites

                sites = Sites(src_prefix=("taskset", "-c", "0"), dst_prefix=("taskset", "-c", "1")) if pin else Sites()
                doc["sites"]["loopback"] = {
                    "pinned": pin, "note": "127.0.0.1; " + ("sender pinned to CPU 0, receiver to CPU 1" if pin
                                                            else "not pinned") + "; tmpfs to tmpfs, --no-fsync"}
                doc["runs"] += run_cases("loopback", sites, cases, modes, args.repeat, work, secret, certs,
                                         args.timeout)
            if args.wan:
                bench, sites, info = _wan_site(args, buffer, args.wan_pin)
                doc["sites"]["wan"] = info
                log(info["note"])
                try:
                    doc["runs"] += run_cases("wan", sites, cases, modes, args.wan_repeat, work, secret, certs,
                                             args.timeout)
                finally:
                    bench.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc["provenance"] = provenance.finish(prov)
    goodput = {"wan": doc["sites"]["wan"]["expected_goodput_bps"]} if "wan" in doc["sites"] else None
    doc["summary"] = summarise(doc["runs"], goodput)
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(doc)
    (out / f"trust-{stamp}.json").write_text(json.dumps(doc, indent=1))
    (out / f"trust-{stamp}.md").write_text(md)
    print(md)
    print(f"results: {out / f'trust-{stamp}.json'}, {out / f'trust-{stamp}.md'}")
    return 0 if all(r["ok"] for r in doc["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
