"""``fstream demo``: added to the agent's CLI by entry point (``fstream.commands``), so the agent never imports it."""

from __future__ import annotations

from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``demo`` subcommand."""
    d = subparsers.add_parser("demo", help="the whole story on one machine")
    d.add_argument("--files", type=int, default=0, help="override the number of generated files")
    d.add_argument("--no-airflow", action="store_true", help="skip the Airflow part")
    d.set_defaults(func=_run)


def _run(args: Any) -> int:
    from fstream_demo.demo import run_demo

    return run_demo(files=args.files, airflow=not args.no_airflow)
