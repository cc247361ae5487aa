"""``fstream pools``: the ADAPT stream pools live (each pair's policy, grants and leases), and setting a pool's policy."""

from __future__ import annotations

import argparse
import json
from typing import Any

from transfer_agent.cli.redis_auth import add_redis_options

EXIT_OK, EXIT_USAGE = 0, 2


def add_pools_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("pools", help="stream pools per (source, destination): grants live, or set a policy")
    p.add_argument("action", nargs="?", choices=("show", "set"), default="show")
    p.add_argument("--source", help="the pair's source (set; show: only this pair)")
    p.add_argument("--destination", help="the pair's destination (set; show: only this pair)")
    p.add_argument("--s-pmax", type=int, default=128, help="set: most streams on the pair (default 128)")
    p.add_argument("--s-cmax", type=int, default=32, help="set: most streams per client (default 32)")
    p.add_argument("--s-i", type=int, default=4, help="set: first grant (default 4)")
    p.add_argument("--s-u", type=int, default=4, help="set: increment per update (default 4)")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="show: refresh every SECONDS until interrupted")
    p.add_argument("--json", action="store_true", help="show: one JSON object per pair")
    add_redis_options(p, "Redis URL (default: $FSTREAM_REDIS_URL, else the embedded one)")
    p.add_argument("--namespace", default="fstream", help="key namespace (default fstream)")
    p.set_defaults(func=cmd_pools)
    return p


def _render(pools: Any, pairs: list[tuple[str, str]], as_json: bool) -> str:
    lines = []
    for src, dst in pairs:
        st = pools.status(src, dst)
        if as_json:
            lines.append(json.dumps(st))
            continue
        lines.append(f"{src} -> {dst}: {st.get('policy', '?')} s_pmax={st.get('s_pmax', '?')} "
                     f"s_cmax={st.get('s_cmax', '?')} s_i={st.get('s_i', '?')} s_u={st.get('s_u', '?')}; "
                     f"{st['allocated']} stream(s) granted")
        for client, g in sorted(st["grants"].items()):
            lines.append(f"  {client}: {g['streams']} stream(s), lease {g['expires_in_s']:.1f} s")
    return "\n".join(lines) if lines else "no stream pools"


def cmd_pools(args: argparse.Namespace) -> int:
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.embedded import resolve_redis_url
    from fstream_provider.bus.keys import Keys
    from fstream_provider.bus.pools import StreamPools
    from fstream_provider.tuning.policy import GreedyPolicy

    pools = StreamPools(connect(resolve_redis_url(args.redis)), Keys(args.namespace))
    if args.action == "set":
        if not (args.source and args.destination):
            print("fstream pools set: --source and --destination name the pair")
            return EXIT_USAGE
        try:
            policy = GreedyPolicy(args.s_pmax, args.s_cmax, args.s_i, args.s_u)
        except ValueError as exc:
            print(f"fstream pools set: {exc}")
            return EXIT_USAGE
        pools.configure(args.source, args.destination, policy)
        print(f"{args.source} -> {args.destination}: greedy s_pmax={policy.s_pmax} s_cmax={policy.s_cmax} "
              f"s_i={policy.s_i} s_u={policy.s_u}")
        return EXIT_OK
    from transfer_agent.cli.live import print_live

    def view() -> str:
        pairs = pools.pairs()
        if args.source or args.destination:
            pairs = [(s, d) for s, d in pairs if args.source in (None, s) and args.destination in (None, d)]
        return _render(pools, pairs, args.json)

    return print_live(view, args.watch)
