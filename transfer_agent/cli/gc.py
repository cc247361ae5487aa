"""``fstream gc``: what finished jobs left on the bus and what each key family costs; ``--apply`` reclaims it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from transfer_agent.cli.exits import EXIT_FAILED, EXIT_OK, EXIT_RETRY
from transfer_agent.cli.redis_auth import add_redis_options

WORDS = {"no_ttl": "finished jobs with a key that has no TTL (set from their end + retention)",
         "index_orphans": "index entries whose job is gone (removed)",
         "event_orphans": "event streams whose job is gone (deleted)",
         "idempotency_orphans": "idempotency keys naming a job that is gone (deleted)",
         "board_orphans": "scheduler board fields of finished or gone jobs (removed)",
         "old_pending": "new-files batches pending longer than --pending-older-than (dropped only with --drop-pending)"}


def add_gc_parser(subparsers: Any) -> argparse.ArgumentParser:
    from transfer_agent.cli.options import add_retention_option

    p = subparsers.add_parser("gc", help="report what finished jobs left in Redis and the memory per key family; "
                                         "--apply reclaims it")
    add_redis_options(p, "Redis URL (default: $FSTREAM_REDIS_URL, else the embedded one); an ACL user needs the "
                         "agent role (SCAN, MEMORY USAGE, scripts)")
    p.add_argument("--namespace", default="fstream", help="key namespace (default fstream)")
    p.add_argument("--apply", action="store_true", help="reclaim what the report lists (default: report only)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    add_retention_option(p, "a finished job found without a TTL gets its end plus this")
    p.add_argument("--pending-older-than", metavar="DURATION", default="7d",
                   help="report new-files batches claimed longer ago than this and not acknowledged (default 7d)")
    p.add_argument("--drop-pending", action="store_true",
                   help="with --apply, also drop those batches (their files stay seen: they are never reported "
                        "again; `fstream seen reset` forgets a whole scope instead)")
    p.add_argument("--sample", type=int, default=200, metavar="N",
                   help="keys per family measured with MEMORY USAGE; more are extrapolated (default 200)")
    p.set_defaults(func=cmd_gc)
    return p


def cmd_gc(args: argparse.Namespace) -> int:
    """Exit 0 when nothing is left to reclaim (after ``--apply``: everything it found was reclaimed), 1 when
    something is (a dry run that found something, or a finding that changed under ``--apply``), 75 when Redis
    is unreachable, 2 for a bad option."""
    from fstream_provider.bus.client import REDIS_UNREACHABLE, connect, describe
    from fstream_provider.bus.embedded import resolve_redis_url
    from fstream_provider.bus.keys import Keys
    from fstream_provider.bus.retention import KINDS, reclaim, survey
    from fstream_provider.model.units import parse_duration

    if args.sample < 1:
        raise ValueError(f"--sample {args.sample}: must be >= 1")
    if args.drop_pending and not args.apply:
        raise ValueError("--drop-pending: only with --apply")
    try:
        older = parse_duration(args.pending_older_than)
    except ValueError as exc:
        raise ValueError(f"--pending-older-than {args.pending_older_than!r}: {exc}") from None
    url = resolve_redis_url(args.redis)
    keys = Keys(args.namespace)
    try:
        client = connect(url)
        report = survey(client, keys, retention_s=args.job_retention, pending_older_than_s=older,
                        sample=args.sample)
        done = reclaim(client, keys, report, drop_pending=args.drop_pending) if args.apply else None
    except REDIS_UNREACHABLE as exc:
        print(f"fstream gc: Redis at {describe(url)} unreachable: {exc}", file=sys.stderr)
        return EXIT_RETRY
    left = _left(report, done, args.drop_pending)
    if args.json:
        print(json.dumps({**report.to_dict(), "applied": args.apply, "reclaimed": done, "left": left}, default=str))
    else:
        for line in _lines(report, done, left, KINDS):
            print(line)
    return EXIT_FAILED if any(left.values()) else EXIT_OK


def _left(report: Any, done: dict[str, int] | None, drop_pending: bool) -> dict[str, int]:
    """What is still to reclaim: everything found on a dry run; after ``--apply``, what it could not act on (a
    finding that changed meanwhile). Old pending batches count only when asked to drop them."""
    found = {**report.counts(), "no_ttl": sum(len(e["keys"]) for e in report.no_ttl)}  # no_ttl: in keys
    if not drop_pending:
        found["old_pending"] = 0
    if done is None:
        return found
    done = {**done, "no_ttl": done["ttl_set"] + done["expired"]}
    return {k: max(0, n - done[k]) for k, n in found.items()}


def _lines(report: Any, done: dict[str, int] | None, left: dict[str, int], kinds: tuple[str, ...]) -> list[str]:
    days = report.retention_s / 86400
    out = [f"namespace {report.namespace}: {report.scanned} keys scanned; job retention {days:g} days"]
    states = ", ".join(f"{n} {s}" for s, n in sorted(report.jobs.items()) if s != "with_ttl")
    out.append(f"jobs: {states or 'none'}" + (f" ({report.jobs['with_ttl']} expiring)" if "with_ttl" in report.jobs
                                              else ""))
    counts = report.counts()
    for kind in kinds:
        line = f"  {counts[kind]:>7}  {WORDS[kind]}"
        if done is not None and kind == "no_ttl":
            line += f": {done['ttl_set']} TTLs set, {done['expired']} keys past their retention deleted"
        elif done is not None and kind in done:
            line += f": {done[kind]} reclaimed"
        out.append(line)
    for scope, n in sorted(report.seen.items()):
        p = report.pending.get(scope, {})
        out.append(f"seen scope {scope!r}: {n} files remembered, {p.get('batches', 0)} pending batches "
                   f"({p.get('older', 0)} old); `fstream seen reset --scope ...` forgets it")
    for name, s in report.streams.items():
        age = f", oldest {s['oldest_age_s'] / 86400:.1f} days" if s["oldest_age_s"] is not None else ""
        out.append(f"stream {name}: {s['length']} entries{age}")
    total = sum(m["bytes"] for m in report.memory.values())
    out.append(f"memory by family (MEMORY USAGE; ~ = extrapolated from a sample): {_size(total)}"
               + (f" of used_memory {_size(report.used_memory)}" if report.used_memory else ""))
    for name, m in sorted(report.memory.items(), key=lambda kv: -kv[1]["bytes"]):
        out.append(f"  {name:<16} {m['keys']:>9} keys  {'~' if m['estimated'] else ' '}{_size(m['bytes']):>10}")
    if done is None:
        n = sum(left.values())
        out.append(f"dry run: {n} key(s) or field(s) to reclaim; run with --apply" if n else "nothing to reclaim")
    else:
        out.append("reclaimed" + ("; some findings changed meanwhile, run again" if any(left.values()) else ""))
    return out


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
