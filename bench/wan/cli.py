"""`fstream bench wan up|down|selfcheck|blackhole|background|status` command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fstream_bench.core import RESULTS_DIR
from fstream_bench.wan import netns
from fstream_bench.wan.netns import NotRootError, WanError

EXIT_FAIL, EXIT_USAGE = 1, 2
#: what a selfcheck result exercised (``provenance``): the whole testbed (path, delay line driver,
#: probe, background flows, storage cap) and this command line
SELFCHECK_MODULES = ("fstream_bench.wan", "fstream_provider.model")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="fstream bench wan",
        description="Emulated WAN between two network namespaces (root required).")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def path_opts(p: argparse.ArgumentParser, *, shape: bool) -> None:
        p.add_argument("--run-id", "--name", dest="run_id", default="main",
                       help="names the namespaces fswan-<id>-src|dst (default: main)")
        if shape:
            p.add_argument("--rate", default="1Gbit", help="bottleneck rate (default 1Gbit)")
            p.add_argument("--rtt", default="40ms", help="round-trip time (default 40ms)")
            p.add_argument("--buffer", default="1MiB", help="max TCP buffer (default 1MiB)")
            p.add_argument("--mtu", type=int, default=1500)
            p.add_argument("--queue", default=None,
                           help="bottleneck queue size (default: one bandwidth-delay product)")
            p.add_argument("--cc", default=None, help="TCP congestion control in both namespaces")
            p.add_argument("--disk-rate", default=None,
                           help="cap destination disk writes (e.g. 50MB/s) on a disk mounted "
                                "at <state dir>/wan/<run id>-dstdisk")
            p.add_argument("--disk-size", default="4GiB", help="size of that disk (sparse)")
            p.add_argument("--rt-prio", type=int, default=10,
                           help="SCHED_FIFO priority of the delay line (0: normal; default 10)")
            p.add_argument("--no-offload", action="store_true",
                           help="no TSO/GSO through the TUNs (one system call per 1500 B packet)")

    up = sub.add_parser("up", help="build the path and leave it running")
    path_opts(up, shape=True)
    up.add_argument("--selfcheck", action="store_true", help="run selfcheck after up")
    up.add_argument("--json", action="store_true")
    down = sub.add_parser("down", help="remove the path (and leftovers of crashed runs)")
    path_opts(down, shape=False)
    down.add_argument("--all", action="store_true", help="every fswan-* run on this machine (other users' too), "
                                               "not just --run-id")
    sc = sub.add_parser("selfcheck", help="measure RTT and throughput; fail if off")
    path_opts(sc, shape=True)
    sc.add_argument("--json", action="store_true")
    sc.add_argument("--duration", default="5s", help="per iperf3 run (default 5s)")
    sc.add_argument("--parallel", type=int, default=16)
    sc.add_argument("--keep", action="store_true",
                    help="if the path was not up, build it for the check and leave it up")
    sc.add_argument("--results", nargs="?", const=str(RESULTS_DIR), default=None, metavar="DIR",
                    help="also write selfcheck-<stamp>.json (every sample + provenance) into DIR "
                         "(default with no DIR: bench/results); written when the check fails too")
    bh = sub.add_parser("blackhole", help="drop all packets both ways for SECONDS")
    path_opts(bh, shape=False)
    bh.add_argument("seconds")
    bg = sub.add_parser("background", help="background iperf3 flows: on N | off")
    path_opts(bg, shape=False)
    bg.add_argument("state", choices=["on", "off"])
    bg.add_argument("n", nargs="?", type=int, default=4)
    st = sub.add_parser("status", help="show the path and delay line counters")
    path_opts(st, shape=False)
    return ap


def _config(a: argparse.Namespace):
    from fstream_bench.wan.path import WanConfig
    from fstream_provider.model.units import parse_rate, parse_size

    return WanConfig.from_text(rate=a.rate, rtt=a.rtt, buffer=a.buffer, run_id=a.run_id,
                               disk_rate_bps=parse_rate(a.disk_rate) if a.disk_rate else None,
                               disk_size_bytes=parse_size(a.disk_size),
                               mtu=a.mtu, cc=a.cc, offload=not a.no_offload, rt_priority=a.rt_prio,
                               queue_bytes=parse_size(a.queue) if a.queue else None)


def main(argv: list[str] | None = None) -> int:
    """Run one ``fstream bench wan`` command; 0 ok, 1 failed check/error, 2 usage or not root."""
    argv = list(sys.argv[1:] if argv is None else argv)
    a = _parser().parse_args(argv)
    a.raw_argv = argv
    try:
        netns.require_root()
        return _dispatch(a)
    except NotRootError as exc:
        print(f"fstream bench wan: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (WanError, ValueError) as exc:
        result = getattr(exc, "result", None)
        if result is not None and getattr(a, "json", False):
            print(json.dumps(result, indent=1))
        print(f"fstream bench wan {a.cmd}: {exc}", file=sys.stderr)
        return EXIT_FAIL


def _dispatch(a: argparse.Namespace) -> int:
    from fstream_bench.wan.path import WanPath, cleanup_all, cleanup_run
    from fstream_bench.wan.selfcheck import selfcheck

    if a.cmd == "up":
        path = WanPath(_config(a)).up()
        try:
            res = selfcheck(path) if a.selfcheck else None
        except BaseException:
            path.down()
            raise
        path.detach()
        if a.json:
            print(json.dumps(res or {"run_id": path.config.run_id, "src_ns": path.src_ns,
                                     "dst_ns": path.dst_ns, "src_ip": path.src_ip,
                                     "dst_ip": path.dst_ip,
                                     "dst_dir": str(path.dst_dir) if path.dst_dir else None,
                                     "dst_cgroup": path.disk_cgroup},
                                    indent=1))
        else:
            print(f"up: {path.config.describe()}; {path.src_ns} ({path.src_ip}) -> "
                  f"{path.dst_ns} ({path.dst_ip}); run commands with "
                  f"`ip netns exec {path.src_ns} ...`"
                  + (f"; destination disk {path.dst_dir}" if path.dst_dir else "")
                  + (f" (cgroup v2: its write cap applies to processes in {path.disk_cgroup}; "
                     f"`echo $$ > {path.disk_cgroup}/cgroup.procs` before `ip netns exec`)"
                     if path.disk_cgroup else ""))
        return 0
    if a.cmd == "down":
        removed = cleanup_all() if a.all else {a.run_id: cleanup_run(a.run_id)}
        for rid, what in removed.items():
            print(f"down {rid}: " + (", ".join(what) if what else "nothing to remove"))
        return 0
    if a.cmd == "selfcheck":
        from fstream_provider.model.units import parse_duration

        prov = None
        if a.results:
            from fstream_bench.core import provenance

            prov = provenance.start("wan", a.raw_argv, SELFCHECK_MODULES)
        try:
            path, built = WanPath.attach(a.run_id), False
        except WanError:
            path, built = WanPath(_config(a)).up(), True
        try:
            try:
                res = selfcheck(path, duration=parse_duration(a.duration), parallel=a.parallel)
            except WanError as exc:  # a failed check is a result too (SelfcheckError carries it)
                if prov is not None and getattr(exc, "result", None) is not None:
                    _write_selfcheck(Path(a.results), exc.result, prov, built=built)
                raise
            if prov is not None:
                _write_selfcheck(Path(a.results), res, prov, built=built)
        finally:
            if built and not a.keep:
                path.down()
            elif built:
                path.detach()
        if a.json:
            print(json.dumps(res, indent=1))
        else:
            print(f"selfcheck {a.run_id}: RTT {res['rtt_ms']:.2f} ms, 1 stream "
                  f"{res['single_stream_bps'] / 1e6:.1f} Mbit/s, iperf3 -P {res['parallel']} "
                  f"{res['parallel_bps'] / 1e6:.1f} Mbit/s ({res['rate_ratio']:.1%} of expected "
                  f"goodput), delay line CPU {res.get('delayline_cpu_percent', 0):.0f} %: ok")
        return 0
    path = WanPath.attach(a.run_id)
    if a.cmd == "blackhole":
        path.blackhole(a.seconds)
        print(f"blackhole {a.run_id}: dropping all packets for {a.seconds}")
    elif a.cmd == "background":
        n = a.n if a.state == "on" else 0
        from fstream_bench.wan.background import set_background

        set_background(path, n)
        print(f"background {a.run_id}: {n} iperf3 flow(s)")
    elif a.cmd == "status":
        from fstream_bench.wan.background import background_flows

        print(json.dumps({"run_id": a.run_id, "config": path.state.config if path.state else {},
                          "background_flows": background_flows(path),
                          "delayline": path.stats()}, indent=1))
    return 0


def _write_selfcheck(out_dir: Path, res: dict, prov: dict, *, built: bool) -> Path:
    """``selfcheck-<stamp>.json``: the measurement (every RTT sample, each iperf3 second) and provenance."""
    from fstream_bench.core import provenance

    provenance.finish(prov)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"selfcheck-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    path.write_text(json.dumps({"bench": "wan selfcheck", "provenance": prov, "path_built_for_check": built,
                                "ok": res.get("ok"), "result": res}, indent=1, default=str) + "\n")
    print(f"results: {path}", file=sys.stderr)
    return path


if __name__ == "__main__":
    sys.exit(main())
