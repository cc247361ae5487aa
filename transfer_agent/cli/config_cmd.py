"""``fstream config show|check`` (issue 30, "Configuration file"): a command's effective configuration with
where each value came from, and the check of a file (every problem, or ``ok: N keys in M sections``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from transfer_agent.errors import FStreamError

DEFAULT_TARGETS = ("receive", "agent")


def add_config_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("config", help="the configuration file: show what a command would run with, check a file",
                              description="The configuration file: --config FILE, else $FSTREAM_CONFIG, else "
                                          "/etc/fstream/fstream.toml if it exists (docs/config.md).")
    acts = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = acts.add_parser("show", help="every option of COMMAND (default: receive and agent), its value and where it "
                                     "came from: default, file PATH, env NAME, command line")
    s.add_argument("--json", action="store_true", help="one JSON object: {file, commands: {COMMAND: {key: {value, "
                                                       "source}}}}")
    s.add_argument("target", nargs="?", metavar="COMMAND")
    s.add_argument("options", nargs=argparse.REMAINDER, metavar="OPTION",
                   help="COMMAND's options as you would give them (shown as `command line`); show's own --json goes "
                        "before COMMAND when COMMAND has a --json too")
    c = acts.add_parser("check", help="validate FILE: print every problem (exit 2), or `ok: N keys in M sections`")
    c.add_argument("file", metavar="FILE")
    p.set_defaults(func=cmd_config, commands=subparsers.choices)  # every command, filled in by the time it runs
    return p


def cmd_config(args: argparse.Namespace) -> int:
    from transfer_agent.cli.config import Config, Schema, locate

    schema = Schema(args.commands)
    if args.action == "check":
        cfg = Config.load(schema, args.file)
        print(f"ok: {cfg.keys} keys in {cfg.sections} sections", flush=True)
        return 0
    cfg = Config.load(schema, locate(args.config_file))
    targets = [args.target] if args.target else list(DEFAULT_TARGETS)
    for t in targets:
        if t not in schema.own:
            from transfer_agent.cli.config import suggest

            raise FStreamError(f"show {t}: no such command{suggest(t, list(schema.own))}")
    options = list(args.options or [])
    if args.target and "--json" in options and "json" not in schema.own[args.target]:
        options.remove("--json")
        args.json = True
    cli = _given(schema, args.target, args.commands[args.target], options) if options else {}
    shown = {t: cfg.effective(t, cli=cli if t == args.target else None) for t in targets}
    if args.json:
        from transfer_agent.cli.config import redact

        print(json.dumps({"file": cfg.path, "commands": {t: {k: {"value": redact(s.raw), "source": s.source}
                                                             for k, s in got.items()} for t, got in shown.items()}},
                         default=str), flush=True)
        return 0
    _print_text(cfg.path, shown)
    return 0


def _print_text(path: str | None, shown: dict[str, dict[str, Any]]) -> None:
    """``[section]`` then ``key = value  # source`` lines, aligned: the output is itself a valid file."""
    from transfer_agent.cli.config import shown as toml_value

    print(f"# configuration file: {path}" if path else "# no configuration file", flush=True)
    for command, settings in shown.items():
        rows = [(key, "" if s.raw is None else toml_value(s.raw), s.source) for key, s in settings.items()]
        kw = max((len(k) for k, _, _ in rows), default=0)
        vw = max((len(v) for _, v, _ in rows), default=0)
        print(f"\n[{command}]")
        for key, value, source in rows:
            print(f"{key:<{kw}} = {value:<{vw}}  # {source}" if value else f"# {key}: not set", flush=True)


def _given(schema: Any, target: str, parser: argparse.ArgumentParser, options: list[str]) -> dict[str, Any]:
    """The options ``options`` gives ``target``, parsed by its own parser (values typed and checked), by key.
    Everything else is left out: every action defaults to SUPPRESS and nothing is required (positionals too)."""
    todo, saved = [parser], []
    while todo:
        p = todo.pop(0)
        for a in p._actions:
            saved.append((a, a.default, a.required, a.nargs, a.choices))
            if isinstance(a, argparse._SubParsersAction):
                todo.extend(dict.fromkeys(a.choices.values()))
            elif not a.option_strings:  # a positional: optional here, any value
                a.nargs = "*" if a.nargs in ("+", "*", argparse.REMAINDER) else "?"
                a.choices = None
            a.default, a.required = argparse.SUPPRESS, False
    try:
        given = vars(parser.parse_args(options))
    finally:
        for a, a.default, a.required, a.nargs, a.choices in reversed(saved):  # parents share actions
            pass
    out: dict[str, Any] = {}
    for key, opt in schema.own[target].items():
        if opt.action.dest in given:
            out[key] = True if opt.kind == "flag" else given[opt.action.dest]
    return out
