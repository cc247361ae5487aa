"""``fstream audit``: who asked an agent for what, what it decided and what came of it (issue 32).

Reads the append-only audit stream the agents write (``fstream_provider.bus.audit``): one ``decision`` entry
per claimed job (accepted or refused, with the reason) and one ``outcome`` entry per accepted job that ended.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from typing import Any

from fstream_provider.model.units import parse_duration
from transfer_agent.cli.redis_auth import add_redis_options

EXIT_OK = 0


def add_audit_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("audit", help="list the agents' audit trail: submitter, sources, destination, "
                                            "decision and outcome of every job")
    add_redis_options(p, "Redis URL (default: $FSTREAM_REDIS_URL, else a private embedded redis-server)")
    p.add_argument("--namespace", default="fstream", help=argparse.SUPPRESS)
    p.add_argument("--submitter", metavar="ID", help="only this submitter's jobs")
    p.add_argument("--decision", choices=("accepted", "refused", "succeeded", "failed", "cancelled"),
                   help="only decisions (accepted, refused) or outcomes (succeeded, failed, cancelled) of this kind")
    p.add_argument("--job", metavar="JOB", help="only this job")
    p.add_argument("--since", metavar="DURATION", help="only entries newer than this (e.g. 1h, 7d)")
    p.add_argument("--limit", type=int, default=50, help="how many entries, newest first (default 50)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=cmd_audit)
    return p


def cmd_audit(args: argparse.Namespace) -> int:
    from fstream_provider.bus.audit import AuditLog
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.embedded import resolve_redis_url
    from fstream_provider.bus.keys import Keys

    since = time.time() - parse_duration(args.since) if args.since else None
    log = AuditLog(connect(resolve_redis_url(args.redis)), Keys(args.namespace))
    entries = log.entries(count=args.limit, submitter=args.submitter, decision=args.decision, job_id=args.job,
                          since=since)
    if args.json:
        for e in entries:
            print(json.dumps(e), flush=True)
        return EXIT_OK
    if not entries:
        print("no audit entries match", file=sys.stderr)
        return EXIT_OK
    for e in entries:
        when = datetime.fromtimestamp(float(e.get("ts") or 0), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        what = e.get("decision") or e.get("outcome") or "?"
        head = f"{when} {e.get('kind', '?'):8} {what:9} job {e.get('job_id', '?')} submitter {e.get('submitter') or '-'}"
        if e.get("kind") == "decision":
            sources = ", ".join(json.loads(e["sources"])) if e.get("sources") else "-"
            detail = f"{sources} -> {e.get('destination') or '-'} (key {e.get('key') or '-'})"
        else:
            detail = f"{e.get('files') or 0} files, {e.get('bytes') or 0} bytes"
        print(f"{head}: {detail}" + (f"; {e['reason']}" if e.get("reason") else ""))
    return EXIT_OK
