"""``fstream seen list|reset``: what the new-files sensors and triggers of a scope remember, and forgetting it."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from transfer_agent.cli.redis_auth import add_redis_options
from transfer_agent.errors import FStreamError

EXIT_OK = 0


def add_seen_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("seen", help="a new-files scope's memory: list it, or reset it so files are reported again")
    p.add_argument("action", choices=("list", "reset", "adopt"),
                   help="adopt: copy the scope's state from before issue 40 into --submitter's own scope (as an "
                        "agent or operator user; a sensor or trigger does it by itself where its user may)")
    p.add_argument("--scope", required=True, help="the sensor's/trigger's scope (its scope= or the derived one)")
    p.add_argument("--submitter", metavar="ID",
                   help="the submitter of the sensor's Airflow connection (its 'submitter' extra): its scopes are "
                        "stored under its id (issue 40). Without it: a scope of a connection with no submitter")
    add_redis_options(p, "Redis URL (default: $FSTREAM_REDIS_URL, else the embedded one)")
    p.add_argument("--namespace", default="fstream", help="key namespace (default fstream)")
    p.set_defaults(func=cmd_seen)
    return p


def cmd_seen(args: argparse.Namespace) -> int:
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.embedded import resolve_redis_url
    from fstream_provider.bus.keys import Keys

    client, keys = connect(resolve_redis_url(args.redis)), Keys(args.namespace)
    scope = Keys.owned(args.submitter, args.scope) if args.submitter else args.scope
    if args.action == "adopt":
        from fstream_provider.watch.adopt import adopt

        if not args.submitter:
            raise FStreamError("fstream seen adopt: give --submitter (whose scope takes the old state over)")
        done = adopt(client, keys, args.scope, scope)
        if done is None:
            raise FStreamError(f"scope {args.scope!r}: this Redis user may not read it (use an agent's user)")
        print(f"scope {args.scope!r} -> {scope!r}: " + (", ".join(f"{n} {k}" for k, n in done.items()) if done else
                                                      "nothing to carry over (its own scope holds state already, "
                                                      "or the old one is empty)"))
        return EXIT_OK
    seen, pending, looks = keys.seen(scope), keys.pending(scope), keys.looks(scope)
    counts = {"seen": client.scard(seen), "pending batches": client.hlen(pending), "looks": client.exists(looks)}
    if args.action == "list":
        for m in sorted(client.smembers(seen)):
            print(f"seen     {m}")
        for bid, text in sorted(client.hgetall(pending).items()):
            try:
                doc = json.loads(text)
                files, claimed = doc["files"], time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(doc["claimed_at"]))
            except (ValueError, KeyError, TypeError):
                print(f"pending  batch {bid} (unreadable: {text[:60]!r})")
                continue
            print(f"pending  batch {bid}: {len(files)} file(s), claimed {claimed} UTC, not yet acknowledged")
        print(f"scope {args.scope!r}: {counts['seen']} seen file(s), {counts['pending batches']} pending batch(es)")
        return EXIT_OK
    client.delete(seen, pending, looks)
    print(f"scope {args.scope!r} reset: removed {counts['seen']} seen file(s), {counts['pending batches']} pending "
          f"batch(es){' and the last look' if counts['looks'] else ''}; its files will be reported again")
    return EXIT_OK
