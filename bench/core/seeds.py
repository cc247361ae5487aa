"""Fresh seeds for the benchmarks that generate their workloads per run (issue 44): ``--seeds`` or ``--fresh N``
drawn from the system's random source, every one recorded in the result so a run replays exactly."""

from __future__ import annotations

import argparse
import secrets


def add_seed_args(ap: argparse.ArgumentParser, fresh: int = 3) -> None:
    """``--seeds S,S`` and ``--fresh N`` (how many to draw without ``--seeds``)."""
    ap.add_argument("--seeds", help="comma list of seeds (default: --fresh seeds drawn from the system)")
    ap.add_argument("--fresh", type=int, default=fresh, help=f"how many fresh seeds without --seeds (default {fresh})")


def seeds_from(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
    """The seeds ``args`` names, else ``--fresh`` new ones; ``ap.error`` on a bad list or none at all."""
    try:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else \
            [secrets.randbelow(2 ** 31) for _ in range(args.fresh)]
    except ValueError:
        ap.error(f"--seeds: expected a comma list of integers, got {args.seeds!r}")
    if not seeds:
        ap.error("need at least one seed")
    return seeds
