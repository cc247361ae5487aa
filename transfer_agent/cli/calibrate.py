"""``fstream calibrate --to URL [--budget 5m]``: seed HARP's transfer history with a (cc, p, pp) sweep of one path."""

from __future__ import annotations

import argparse
import json
from typing import Any

from transfer_agent.cli.redis_auth import add_redis_options

EXIT_OK = 0


def add_calibrate_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "calibrate", help="sweep cc/p/pp per chunk type on a path within a budget to seed HARP's history",
        description="Probe a (cc, p, pp) grid per chunk type (tiny/small/medium/large relative to the BDP) with "
                    "real transfers of generated files into DEST/.fstream-calibration/CHUNK/ (the receiver keeps "
                    "one dataset per chunk, overwritten by each probe); every probe becomes a history row. "
                    "Resumable: a second run on the same path continues where the first stopped.")
    p.add_argument("--to", required=True, dest="destination", metavar="URL", help="fstream://HOST:PORT/PATH")
    p.add_argument("--secret-file", metavar="F", help="shared secret (default: $FSTREAM_STATE_DIR/secret)")
    add_redis_options(p, "Redis URL (default: $FSTREAM_REDIS_URL, else the embedded one)")
    p.add_argument("--namespace", default="fstream", help="key namespace (default fstream)")
    p.add_argument("--budget", metavar="DURATION", default="5m", help="no probe starts after this (default 5m)")
    p.add_argument("--bandwidth", metavar="RATE", default="1Gbit", help="the path's bandwidth (default 1Gbit)")
    p.add_argument("--rtt", metavar="DURATION", help="the path's RTT (default: measured)")
    p.add_argument("--tcp-buffer", metavar="SIZE", help="TCP buffer cap per stream (default: this host's)")
    p.add_argument("--probe-seconds", metavar="DURATION", default="1s",
                   help="data per probe, in time at the bandwidth (default 1s; at least eight files)")
    p.add_argument("--max-cc", type=int, default=32, help="highest concurrency probed (default 32)")
    p.add_argument("--chunks", default="tiny,small,medium,large", help="chunk types to probe (default all four)")
    p.add_argument("--grid", metavar="SPEC", help="cc=1,2,4:p=1,2:pp=0,4 (default cc 1..32, p 1..16, pp 0,1,4,16)")
    p.add_argument("--passes", type=int, default=5, help="passes over the grid (default 5; each is one group)")
    p.add_argument("--restart", action="store_true", help="forget earlier progress on this path")
    p.add_argument("--json", action="store_true", help="print one JSON summary at the end")
    p.set_defaults(func=cmd_calibrate)
    return p


def cmd_calibrate(args: argparse.Namespace) -> int:
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.embedded import resolve_redis_url
    from fstream_provider.bus.keys import Keys
    from fstream_provider.model.statedir import default_secret_file
    from fstream_provider.model.units import parse_duration, parse_rate, parse_size
    from transfer_agent.sending.calibration import Calibration, parse_grid

    if args.passes < 1 or args.max_cc < 1:
        raise ValueError(f"calibrate: --passes ({args.passes}) and --max-cc ({args.max_cc}) must be >= 1")
    secret = args.secret_file or (str(default_secret_file()) if default_secret_file().exists() else None)
    cal = Calibration(args.destination, secret_file=secret, redis=connect(resolve_redis_url(args.redis)),
                      keys=Keys(args.namespace), bandwidth_bps=parse_rate(args.bandwidth),
                      rtt_s=parse_duration(args.rtt) if args.rtt else None,
                      tcp_buffer=parse_size(args.tcp_buffer) if args.tcp_buffer else None,
                      budget_s=parse_duration(args.budget), probe_seconds=parse_duration(args.probe_seconds),
                      chunks=[c.strip() for c in args.chunks.split(",") if c.strip()], grid=parse_grid(args.grid),
                      passes=args.passes, max_cc=args.max_cc, restart=args.restart,
                      out=(lambda line: None) if args.json else (lambda line: print(line, flush=True)))
    summary = cal.run()
    if args.json:
        print(json.dumps(summary, default=str))
    return EXIT_OK
