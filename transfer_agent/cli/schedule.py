"""``fstream schedule``: the agents' shared SEAL/STEAL board live (waiting and running jobs, their agents,
concurrency and preemption marks), and setting an endpoint's known maximum for the scheduler's model."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from transfer_agent.cli.redis_auth import add_redis_options

EXIT_OK, EXIT_USAGE = 0, 2


def add_schedule_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("schedule", help="the agents' SEAL/STEAL board live, or set an endpoint's maximum")
    p.add_argument("action", nargs="?", choices=("show", "set"), default="show")
    p.add_argument("--endpoint", help="set: a transfer node's host name or a receiver's HOST:PORT")
    p.add_argument("--capacity", metavar="RATE", help="set: the most the endpoint moves in all, e.g. 10Gbit")
    p.add_argument("--unit", metavar="RATE", help="set: what one unit of concurrency moves there, e.g. 1Gbit")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="show: refresh every SECONDS until interrupted")
    p.add_argument("--json", action="store_true", help="show: one JSON object per task")
    add_redis_options(p, "Redis URL (default: $FSTREAM_REDIS_URL, else the embedded one)")
    p.add_argument("--namespace", default="fstream", help="key namespace (default fstream)")
    p.set_defaults(func=cmd_schedule)
    return p


def render(tasks: dict[str, dict], config: dict[str, str], as_json: bool, now: float) -> str:
    """The board as text (or JSON lines): one line per task, running first, then the model's endpoints."""
    lines = []
    order = sorted(tasks.items(), key=lambda kv: (kv[1]["state"] != "running", kv[1]["arrival"]))
    for job, t in order:
        if as_json:
            lines.append(json.dumps({"job_id": job, **t}))
            continue
        prog = t.get("progress") or {}
        if t["state"] == "running":
            what = (f"running on {t['agent']} cc={t['cc']} {prog.get('rate', 0) / 1e6:.0f} Mbit/s, "
                    f"{prog.get('done', 0) / 1e6:.0f}/{t['size'] / 1e6:.0f} MB")
            if t.get("preempt_by"):
                what += f"; to stop for {t['preempt_by']}"
        else:
            what = (f"waiting {max(0.0, now - t['arrival'] - t.get('ran_s', 0)):.0f} s, "
                    f"{t.get('done', 0) / 1e6:.0f}/{t['size'] / 1e6:.0f} MB done, {t.get('preemptions', 0)} preemption(s)")
        lines.append(f"{job} {t['klass']:<11} {t['src']} -> {t['dst']}: {what}")
    if not as_json:
        if not lines:
            lines.append("no jobs on the scheduler's board")
        ends = sorted({k.split(":", 1)[1] for k in config if k.startswith(("cap:", "unit:"))})
        for e in ends:
            cap, unit = config.get(f"cap:{e}"), config.get(f"unit:{e}")
            parts = ([f"maximum {float(cap) / 1e6:.0f} Mbit/s"] if cap else []) + (
                [f"one stream {float(unit) / 1e6:.0f} Mbit/s"] if unit else [])
            lines.append(f"endpoint {e}: " + ", ".join(parts))
    return "\n".join(lines)


def cmd_schedule(args: argparse.Namespace) -> int:
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.embedded import resolve_redis_url
    from fstream_provider.bus.keys import Keys
    from fstream_provider.bus.sched_board import SchedBoard
    from fstream_provider.model.units import parse_rate

    keys = Keys(args.namespace)
    client = connect(resolve_redis_url(args.redis))
    if args.action == "set":
        if not args.endpoint or not (args.capacity or args.unit):
            print("fstream schedule set: --endpoint and --capacity and/or --unit are needed")
            return EXIT_USAGE
        mapping = {}
        try:
            for name, value in (("cap", args.capacity), ("unit", args.unit)):
                if value:
                    mapping[f"{name}:{args.endpoint}"] = repr(parse_rate(value))
        except ValueError as exc:
            print(f"fstream schedule set: {exc}")
            return EXIT_USAGE
        client.hset(keys.sched_config(), mapping=mapping)
        print(f"endpoint {args.endpoint}: " + ", ".join(f"{k.split(':')[0]} {float(v) / 1e6:.0f} Mbit/s"
                                                        for k, v in mapping.items()))
        return EXIT_OK
    from transfer_agent.cli.live import print_live

    board = SchedBoard(client, keys)
    return print_live(lambda: render(board.tasks(), client.hgetall(keys.sched_config()), args.json, time.time()),
                      args.watch)
