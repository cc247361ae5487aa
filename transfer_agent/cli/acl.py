"""``fstream redis-acl``: print the Redis ACL file line of an FStream role (submitter, agent, viewer; issue 32)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from transfer_agent.errors import FStreamError

EXIT_OK = 0

EPILOG = """\
Append the line to the file named by Redis's `aclfile` and run `ACL LOAD` (or restart Redis);
the line holds the password's SHA-256, never the password. The rules alone, without the
`user NAME` and the password, also follow `ACL SETUSER NAME` in redis-cli. What each role may
and may not do: docs/redis-keys.md, "Least privilege: ACL users and TLS".
"""


def add_acl_parser(subparsers: Any) -> argparse.ArgumentParser:
    from fstream_provider.bus.acl import ROLES

    p = subparsers.add_parser("redis-acl", help="print the Redis ACL file line of a role (submitter, agent, viewer)",
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", required=True, choices=ROLES,
                   help="submitter: submit/follow/cancel jobs (Airflow, fstream submit); agent: fstream agent and "
                        "the operator tools; viewer: read-only live views")
    p.add_argument("--user", required=True, metavar="NAME", help="the Redis user name")
    p.add_argument("--submitter", metavar="ID",
                   help="(role submitter, required) the submitter id the user is for: it reads and writes that "
                        "submitter's jobs, idempotency keys and new-files scopes only (docs/redis-keys.md)")
    p.add_argument("--namespace", default="fstream", help="key namespace the user is confined to (default fstream)")
    p.add_argument("--password-file", metavar="FILE",
                   help="the user's password (mode 0600; the line carries its SHA-256). Without it the user "
                        "exists but cannot log in until a password is added")
    p.add_argument("--server-version", default="7.0", metavar="X.Y",
                   help="the Redis the line is for (default 7.0, also right for every Valkey). 6.2 gets a line "
                        "without 7.0's read-only key patterns and selectors: docs/redis-keys.md")
    p.set_defaults(func=cmd_redis_acl)
    return p


def cmd_redis_acl(args: argparse.Namespace) -> int:
    from fstream_provider.bus.acl import acl_setuser_line, password_hash
    from transfer_agent.cli.redis_auth import read_password

    digest = password_hash(read_password(args.password_file, "password file")) if args.password_file else None
    try:
        line = acl_setuser_line(args.role, args.user, namespace=args.namespace, password_hash=digest,
                                server_version=args.server_version, submitter=args.submitter)
    except ValueError as exc:
        raise FStreamError(str(exc)) from None
    print(line)
    if digest is None:
        print(f"fstream redis-acl: no --password-file: user {args.user} cannot log in until a password is added",
              file=sys.stderr)
    return EXIT_OK
