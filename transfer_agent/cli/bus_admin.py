"""The bus's maintenance subcommands of ``fstream``: ``reconcile`` (orphaned jobs) and ``redis`` (the embedded server,
``migrate-keys``); wired by ``transfer_agent.cli``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from fstream_provider.bus.keys import Keys
from transfer_agent.cli.exits import EXIT_FAILED, EXIT_OK
from transfer_agent.cli.jobs import _common, _store
from transfer_agent.cli.redis_auth import add_redis_options


# -- reconcile -------------------------------------------------------------------------------------
def add_reconcile_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("reconcile", help="report jobs that would vanish silently (orphans); --repair fixes them")
    _common(p)
    p.add_argument("--repair", action="store_true",
                   help="re-enqueue resumable orphans, dead-letter entries without a job state, drop dangling "
                        "idempotency keys")
    p.add_argument("--dest", metavar="DIR", help="also list part files under this destination root whose job "
                                                 "Redis no longer knows")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_reconcile)
    return p


def cmd_reconcile(args: argparse.Namespace) -> int:
    """Exit 0 when nothing is left unresolved, 1 when some orphan still needs someone."""
    from fstream_provider.bus.reconcile import reconcile

    report = reconcile(_store(args), repair=args.repair, dest_root=args.dest)
    if args.json:
        print(json.dumps(report.to_dict(), default=str))
    else:
        for line in report.lines():
            print(line)
    return EXIT_FAILED if report.unresolved else EXIT_OK


# -- redis -----------------------------------------------------------------------------------------
def add_redis_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("redis", help="the embedded Redis: print its URL (starting it if needed; it holds the "
                                            "server's password: export it as FSTREAM_REDIS_URL, an argument with a "
                                            "password is refused), status, stop; migrate-keys: move keys of the "
                                            "layout before issue 28 to their own slots")
    p.add_argument("action", choices=("url", "status", "stop", "migrate-keys"))
    p.add_argument("--state-dir", metavar="DIR", help="default: $FSTREAM_STATE_DIR or ~/.local/state/fstream")
    add_redis_options(p, "migrate-keys: which Redis (default: $FSTREAM_REDIS_URL, else the embedded one); a "
                         "redis+cluster:// URL migrates key by key")
    p.add_argument("--namespace", default="fstream", help="migrate-keys: key namespace (default fstream)")
    p.add_argument("--dry-run", action="store_true", help="migrate-keys: count the old keys, change nothing")
    p.set_defaults(func=cmd_redis)
    return p


def cmd_redis(args: argparse.Namespace) -> int:
    from fstream_provider.bus.embedded import EmbeddedRedis

    if args.action == "migrate-keys":
        from fstream_provider.bus.client import connect
        from fstream_provider.bus.embedded import resolve_redis_url
        from fstream_provider.bus.migrate_keys import migrate

        client = connect(resolve_redis_url(args.redis, args.state_dir))
        try:
            for line in migrate(client, Keys(args.namespace), dry_run=args.dry_run).lines():
                print(line)
        finally:
            client.close()
        return EXIT_OK
    emb = EmbeddedRedis(args.state_dir)
    if args.action == "url":
        print(emb.start().url)
    elif args.action == "status":
        running = emb.running()
        print(f"embedded Redis in {emb.dir}: {'running' if running else 'not running'}")
        return EXIT_OK if running else EXIT_FAILED
    else:
        emb.stop()
        print(f"embedded Redis in {emb.dir}: stopped")
    return EXIT_OK
