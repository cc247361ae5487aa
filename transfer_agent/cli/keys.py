"""``fstream keys``: shared secrets' generations (``rotate|show``, issue 30) and Ed25519 pairs (``new|list``, issue 40).

``fstream keys rotate SECRET_FILE [--stage next|promote|retire] [--window 1h] [--check-receiver URL]`` takes the
steps of a rotation (``fstream_provider.model.secret_ring``; the runbook across hosts: ``docs/keys.md``):

1. ``next``: a new generation, accepted by receivers once they read the file (they look at most once a second),
   not yet used by senders; with ``--check-receiver`` (once per receiver), the command then authenticates to each
   receiver with the new generation until it is accepted (or ``--check-timeout`` passes: nothing is promoted),
   asking for encryption as ``fstream send --encrypt`` does, so receivers that require it answer too;
2. ``promote``: the new generation becomes current (senders use it from their next session); the old current
   becomes previous, accepted until now + ``--window``;
3. ``retire``: previous generations whose window passed are dropped.

Without ``--stage``: next, check (with ``--check-receiver``), promote, as for one file that senders and receivers
share, printing each step. ``fstream keys show SECRET_FILE`` lists the generations, states and times, never a
secret. A file readable or writable by group or others is refused, as everywhere a secret is read.

``fstream keys new|list`` (Ed25519 pairs for submitters and agents, issue 40) are in ``transfer_agent.cli.keypairs``.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from fstream_provider.model.secret_ring import Generation, SecretRing, fmt_time, locked, read_ring, write_ring
from transfer_agent.errors import AuthError, FStreamError, NetworkError

DEFAULT_KEY = "default"  # ``wire.auth.DEFAULT_KEY`` (the parser is built for every command: nothing heavy here)
CHECK_PAUSE = 0.5  # seconds between two checks of a receiver that does not accept the new generation yet


def add_keys_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("keys", help="shared secrets' generations (rotate, show); Ed25519 pairs (new, list)",
                              description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="keys_command", required=True)
    r = sub.add_parser("rotate", help="add a next generation, promote it, retire expired ones (docs/keys.md)")
    r.add_argument("secret_file", metavar="SECRET_FILE", help="the shared-secret file (one line, or a ring)")
    r.add_argument("--stage", choices=("next", "promote", "retire"),
                   help="one step only (default: next, check, promote: for one file senders and receivers share)")
    r.add_argument("--window", default="1h", metavar="DURATION",
                   help="how long receivers still accept the old generation after promote (default 1h)")
    r.add_argument("--check-receiver", metavar="URL", action="append", default=[],
                   help="fstream://HOST:PORT of a receiver that must accept the new generation before promote "
                        "(repeat for each receiver)")
    r.add_argument("--key", default=DEFAULT_KEY, metavar="ID",
                   help="the receiver's key id this file is (for --check-receiver; default 'default')")
    r.add_argument("--check-timeout", default="30s", metavar="DURATION",
                   help="how long --check-receiver keeps trying (default 30s)")
    r.set_defaults(func=cmd_rotate)
    s = sub.add_parser("show", help="list the generations of a secret file (never a secret)")
    s.add_argument("secret_file", metavar="SECRET_FILE")
    s.set_defaults(func=cmd_show)
    from transfer_agent.cli.keypairs import add_pair_parsers

    add_pair_parsers(sub)
    return p


# -- show --------------------------------------------------------------------------------------------------
def describe(ring: SecretRing, now: float) -> list[str]:
    """One line per generation: id, state, created, accept_until (and whether it passed); never a secret."""
    lines = [f"{'generation':<12} {'state':<9} {'created':<21} accepted until"]
    for g in ring.generations:
        if g.accept_until is None:
            until = "-" if g.state != "previous" else "?"
        else:
            left = g.accept_until - now
            until = fmt_time(g.accept_until) + (f" (in {_span(left)})" if left >= 0 else " (passed: retire it)")
        lines.append(f"{g.gen_id:<12} {g.state:<9} {fmt_time(g.created):<21} {until}")
    return lines


def _span(seconds: float) -> str:
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600}h"
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def cmd_show(args: argparse.Namespace) -> int:
    ring = read_ring(args.secret_file)
    kind = "one-line secret (generation 0; the first rotation makes it a ring)" if ring.legacy else "secret ring"
    print(f"{args.secret_file}: {kind}, {len(ring.generations)} generation(s)")
    for line in describe(ring, time.time()):
        print("  " + line)
    return 0


# -- rotate ------------------------------------------------------------------------------------------------
def _steps(stage: str | None, check: bool) -> list[str]:
    """The steps to take: one stage, or next and promote; a check after next and before promote (once)."""
    steps: list[str] = []
    for st in [stage] if stage else ["next", "promote"]:
        if st == "promote" and check and steps[-1:] != ["check"]:
            steps.append("check")
        steps.append(st)
        if st == "next" and check:
            steps.append("check")
    return steps


def cmd_rotate(args: argparse.Namespace) -> int:
    from fstream_provider.model.units import parse_duration

    path = Path(args.secret_file)
    window = parse_duration(args.window)
    if window <= 0:
        raise ValueError(f"--window {args.window!r}: must be longer than 0 (senders still using the old "
                         "generation need time to finish their sessions)")
    targets = [_check_target(url) for url in args.check_receiver]
    steps = _steps(args.stage, bool(targets))
    for n, step in enumerate(steps, 1):
        if step == "next":
            gen = _add_next(path, reuse=args.stage is None)
            text = (f"next: generation {gen.gen_id} is next; receivers reading {path} accept it from their next look "
                    "(within 1 s); senders still use the current one")
        elif step == "check":
            nxt = read_ring(path).next
            if nxt is None:
                raise FStreamError(f"{path}: no next generation to check (run --stage next first)")
            took = [check_receiver(t, nxt, args.key, parse_duration(args.check_timeout)) for t in targets]
            text = (f"check: generation {nxt.gen_id} of key {args.key!r} accepted by "
                    + ", ".join(f"{h}:{p} ({s:.1f} s)" for (h, p), s in zip(targets, took)))
        elif step == "promote":
            new, old = _promote(path, window)
            text = (f"promote: generation {new.gen_id} is current (senders use it from their next session); "
                    f"{old.gen_id} is previous, accepted until {fmt_time(old.accept_until or 0)}; after that run "
                    f"`fstream keys rotate {path} --stage retire`")
        else:
            dropped, kept = _retire(path)
            waiting = ", ".join(f"{g.gen_id} until {fmt_time(g.accept_until or 0)}" for g in kept)
            text = "retire: " + (f"dropped {', '.join(g.gen_id for g in dropped)}" if dropped else "nothing to drop") \
                + (f"; still accepted: {waiting}" if waiting else "")
        print(f"{n}/{len(steps)} {text}", flush=True)
    return 0


def _add_next(path: Path, reuse: bool) -> Generation:
    with locked(path):
        ring = read_ring(path)
        if reuse and ring.next is not None:  # an earlier run stopped after its first step: go on with it
            return ring.next
        new = ring.with_next(time.time())
        write_ring(path, new)
    assert new.next is not None
    return new.next


def _promote(path: Path, window: float) -> tuple[Generation, Generation]:
    with locked(path):
        ring = read_ring(path)
        old = ring.current
        new = ring.promoted(time.time(), window)
        write_ring(path, new)
    prev = new.get(old.gen_id)
    assert prev is not None
    return new.current, prev


def _retire(path: Path) -> tuple[list[Generation], list[Generation]]:
    with locked(path):
        ring = read_ring(path)
        new, dropped = ring.retired(time.time())
        if dropped:
            write_ring(path, new)
    return dropped, [g for g in new.generations if g.state == "previous"]


# -- check ------------------------------------------------------------------------------------------------
def _check_target(url: str) -> tuple[str, int]:
    from fstream_provider.model.spec import Destination

    d = Destination.parse(url if "://" in url else f"fstream://{url}")
    return d.host, d.port


def check_receiver(target: tuple[str, int], gen: Generation, key_id: str, timeout: float,
                   stop: threading.Event | None = None) -> float:
    """Authenticate to the receiver at ``target`` with generation ``gen`` of key ``key_id`` until it accepts (a
    ``check`` connection: nothing else happens); the seconds it took. ``FStreamError`` when it has not accepted
    within ``timeout`` seconds (the last reason named), or speaks another protocol."""
    from transfer_agent.wire.auth import client_handshake

    host, port = target
    stop = stop or threading.Event()
    t0 = time.monotonic()
    last: FStreamError | None = None
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(10.0, max(timeout, 1.0))) as sock:
                client_handshake(sock, gen.secret, {"role": "check", "session": uuid.uuid4().hex,
                                                    "job": "fstream-keys-check", "attempt": 1},
                                 peer=f"{host}:{port}", key_id=key_id, kgen=gen.gen_id, encrypt=True)
            return time.monotonic() - t0
        except (AuthError, NetworkError) as exc:  # not re-read yet, or not reachable now: try again
            last = exc
        except OSError as exc:
            last = NetworkError(f"cannot connect to receiver {host}:{port}: {exc.strerror or exc}")
        if time.monotonic() - t0 >= timeout or stop.wait(CHECK_PAUSE):
            raise FStreamError(f"receiver {host}:{port} did not accept generation {gen.gen_id!r} of key {key_id!r} "
                               f"within {timeout:g} s (last: {last}); nothing was promoted: give that receiver "
                               "the file with this generation as next, then run --stage promote")
