"""SIGHUP: read the configuration again and change what can change in a running daemon (issue 30).

``systemctl reload`` sends SIGHUP. The daemon's command line is parsed again with the configuration file
and the environment as they are now (``cli.config``; the same precedence as at start). A file that does not
validate is refused, naming the problem, and the running configuration stays. Of what changed, each
daemon applies what it can in place (``live``: limits, the log level, the metrics listener); what needs a
restart (the listen address, the root, the keys' files are re-read on their own: ``receiving.keyring``) is
named in the log. The handler only sets an event: the work runs in a thread of its own, never inside the
signal handler.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from fstream_provider.model.units import parse_duration, parse_size
from transfer_agent.errors import FStreamError
from transfer_agent.service import sdnotify

log = logging.getLogger("fstream.reload")
IGNORED = frozenset({"func", "command", "config_file", "parser_factory"})


def reparse(args: argparse.Namespace) -> argparse.Namespace:
    """The command's options as the configuration says now (``FStreamError`` naming the problem if it is bad)."""
    from transfer_agent.cli import config, redis_auth

    argv = list(getattr(args, "argv", None) or [])
    parser = args.parser_factory()  # ``cli.main`` gives it (this module must not import main: no cycles)
    configured = config.apply(parser, argv, args.command, getattr(args, "config_file", None))
    try:
        new = parser.parse_args(argv)
    except SystemExit:  # argparse printed why (a configured value its own check refused)
        raise FStreamError("the command line no longer parses with this configuration (see above)") from None
    configured(new)
    redis_auth.resolve(new)  # the password file as it is now, into the URL (``cli.main`` did it at the start)
    new.argv, new.config_file, new.parser_factory = argv, getattr(args, "config_file", None), args.parser_factory
    return new


def changes(old: argparse.Namespace, new: argparse.Namespace) -> dict[str, tuple[Any, Any]]:
    """Option -> (old, new) for every option whose value differs."""
    out = {}
    for key, value in vars(new).items():
        if key in IGNORED or key == "argv":
            continue
        if getattr(old, key, None) != value:
            out[key] = (getattr(old, key, None), value)
    return out


def log_level(verbose: int) -> int:
    return logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING


class Reloader:
    """``reload()`` (run by ``cli.sighup.Hangup`` on SIGHUP, in its thread): re-read, diff, ``apply(changed) -> applied keys``, log the rest.

    :param args: the options the daemon runs with (updated in place with what was applied).
    :param live: the options this daemon changes in place.
    :param apply: called with ``{option: new value}`` of the live options that changed; returns what it applied.
    """

    def __init__(self, args: argparse.Namespace, live: Iterable[str],
                 apply: Callable[[dict[str, Any]], Iterable[str]]) -> None:
        self.args, self.live, self.apply = args, frozenset(live) | {"verbose", "log_level"}, apply
        self.done = threading.Event()  # set after every reload (tests wait on it)
        self.count = 0
        self.last: dict[str, Any] = {}

    def reload(self) -> dict[str, Any]:
        """One reload; what happened: ``applied``, ``restart`` (changed, not applied), or ``error``."""
        sdnotify.reloading()
        out: dict[str, Any] = {"applied": [], "restart": [], "error": None}
        try:
            new = reparse(self.args)
            changed = changes(self.args, new)
            live = {k: v for k, (_, v) in changed.items() if k in self.live}
            if "verbose" in live and getattr(new, "log_level", None) is None:
                logging.getLogger().setLevel(log_level(live["verbose"]))
            if live.get("log_level"):  # the root, and the agent's daemon logger that has a level of its own
                for name in ("", "transfer_agent.daemon"):
                    logging.getLogger(name).setLevel(live["log_level"].upper())
            applied = set(self.apply({k: v for k, v in live.items() if k not in ("verbose", "log_level")}))
            applied |= {"verbose", "log_level"} & set(live)
            for key in applied:
                setattr(self.args, key, getattr(new, key))
            out["applied"] = sorted(applied)
            out["restart"] = sorted(set(changed) - applied)
            shown = ", ".join(f"{k}: {changed[k][0]!r} -> {changed[k][1]!r}" for k in out["applied"]) or "nothing"
            log.warning("configuration reloaded: applied %s%s", shown,
                        f"; changed but needs a restart: {', '.join(out['restart'])}" if out["restart"] else "")
        except Exception as exc:  # noqa: BLE001 - a reload must never end the daemon, nor its reload thread
            out["error"] = str(exc) if isinstance(exc, (FStreamError, ValueError, OSError)) else \
                f"{type(exc).__name__}: {exc}"
            log.error("configuration reload refused, the running configuration stays: %s", out["error"])
            print(f"fstream {self.args.command}: reload refused: {out['error']}", file=sys.stderr, flush=True)
        finally:
            sdnotify.ready("configuration reloaded" if out["error"] is None else "reload refused")
        self.count += 1
        self.last = out
        self.done.set()
        return out


# -- what each daemon changes in place ------------------------------------------------------------------
RECEIVER_LIVE = ("log_level", "max_unauth", "max_unauth_per_addr", "handshake_timeout", "require_encryption",
                 "max_part_age", "drain_grace", "metrics_listen", "free_space_floor")
AGENT_LIVE = ("log_level", "max_retries", "max_deliveries", "claim_idle", "drain_grace", "metrics_listen")


# What a reload sets in place, beyond the grouped cases below: (option, attribute of the running object or None when
# the value is only checked because the daemon reads ``args`` when it needs it, converter of the option's text).
Setter = tuple[str, str | None, Callable[[Any], Any]]
RECEIVER_SETTERS: tuple[Setter, ...] = (
    ("handshake_timeout", "handshake_timeout", parse_duration),
    ("require_encryption", "require_encryption", bool),
    ("max_part_age", "part_max_age", parse_duration),
    ("drain_grace", None, parse_duration),  # the daemon reads args.drain_grace when it drains
)
AGENT_SETTERS: tuple[Setter, ...] = (
    ("max_retries", "max_retries", int),
    ("max_deliveries", "max_deliveries", int),
    ("claim_idle", "claim_idle_ms", lambda text: int(parse_duration(text) * 1000)),
    ("drain_grace", "drain_grace", parse_duration),
)


def set_live(target: Any, setters: Iterable[Setter], live: dict[str, Any]) -> list[str]:
    """Each setter's option that changed, converted and set on ``target``; the options set, in table order."""
    done = []
    for option, attribute, convert in setters:
        if option in live:
            value = convert(live[option])
            if attribute is not None:
                setattr(target, attribute, value)
            done.append(option)
    return done


def receiver_apply(rcv: Any, service: Any, args: argparse.Namespace) -> Callable[[dict[str, Any]], list[str]]:
    """The receiver's live changes: pre-auth caps, handshake time, encryption required, part age, drain grace, and
    the metrics endpoint (restarted on its new address or free-space floor; transfers are not touched)."""

    def apply(live: dict[str, Any]) -> list[str]:
        if live.get("metrics_listen") and getattr(args, "handoff_fd", None) is not None:  # a worker (router_apply)
            raise FStreamError(f"metrics on {live['metrics_listen']}: not in a worker of --workers started without "
                               "them (the router serves the workers' metrics; restart it with --metrics-listen)")
        done = []
        if {"max_unauth", "max_unauth_per_addr"} & set(live):
            rcv.set_preauth_limits(live.get("max_unauth", args.max_unauth),
                                   live.get("max_unauth_per_addr", args.max_unauth_per_addr))
            done += [k for k in ("max_unauth", "max_unauth_per_addr") if k in live]
        done += set_live(rcv, RECEIVER_SETTERS, live)
        if {"metrics_listen", "free_space_floor"} & set(live):
            floor = parse_size(live.get("free_space_floor", args.free_space_floor))
            _restart_endpoint(service, live.get("metrics_listen", args.metrics_listen),
                              lambda: service.start(rcv), floor=floor)
            done += [k for k in ("metrics_listen", "free_space_floor") if k in live]
        return done
    return apply


def router_apply(router: Any, args: argparse.Namespace, service: Any = None) -> Callable[[dict[str, Any]], list[str]]:
    """The router's part of a reload (``receive --workers N``, issue 43): its own caps on the connections it holds
    before a worker takes them, their handshake time, and its metrics address (``service``: the router's
    ``RouterService``, None when it was started without metrics). Every worker got the SIGHUP too and applies each
    live option to itself (``receiver_apply``), so the router counts them applied; the drain grace it reads itself.
    Metrics a reload would add to a router started without them are refused: its workers serve none."""

    def apply(live: dict[str, Any]) -> list[str]:
        if service is None and live.get("metrics_listen"):
            raise FStreamError(f"metrics on {live['metrics_listen']}: this router was started without "
                               "--metrics-listen, so its workers serve none; restart it to add them")
        if service is not None and {"metrics_listen", "free_space_floor"} & set(live):
            floor = parse_size(live.get("free_space_floor", args.free_space_floor))
            _restart_endpoint(service, live.get("metrics_listen", args.metrics_listen), service.start, floor=floor)
        if {"max_unauth", "max_unauth_per_addr"} & set(live):
            router.set_preauth_limits(live.get("max_unauth", args.max_unauth),
                                      live.get("max_unauth_per_addr", args.max_unauth_per_addr))
        if "handshake_timeout" in live:
            router.handshake_timeout = parse_duration(live["handshake_timeout"])
        log.info("router: at most %s connections before their HELLO (%s per address), %s s each",
                 live.get("max_unauth", args.max_unauth), live.get("max_unauth_per_addr", args.max_unauth_per_addr),
                 router.handshake_timeout)
        return list(live)
    return apply


def agent_apply(agent: Any, service: Any, url: str, keys: Any) -> Callable[[dict[str, Any]], list[str]]:
    """The agent's live changes: retries and deliveries per job, the reclaim idle time, the drain grace and the
    metrics endpoint. The policy (its authority) is not reloaded: a change of authority is a restart."""

    def apply(live: dict[str, Any]) -> list[str]:
        done = set_live(agent, AGENT_SETTERS, live)
        if "metrics_listen" in live:
            agent.observer = None
            _restart_endpoint(service, live["metrics_listen"], lambda: service.start(agent, url, keys))
            done.append("metrics_listen")
        return done
    return apply


def _restart_endpoint(service: Any, listen: str | None, start: Callable[[], None], floor: int | None = None) -> None:
    """The metrics endpoint on its new address: a bad or busy address is refused while the old one still serves;
    if the new one fails anyway, the old one is started again and the reload refused."""
    from transfer_agent.service.options import parse_listen

    new_listen = parse_listen(listen) if listen else None
    if new_listen is not None and new_listen != service.listen and new_listen[1] != 0:
        _can_bind(new_listen)
    old = (service.listen, getattr(service, "floor", None))
    service.stop()
    service.listen = new_listen
    if floor is not None:
        service.floor = floor
    try:
        start()
    except Exception as exc:
        service.stop()
        service.listen, service.floor = old
        start()
        raise FStreamError(f"metrics on {listen}: {exc}; the endpoint stays on its old address") from None


def _can_bind(address: tuple[str, int]) -> None:
    import socket

    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as exc:
            raise FStreamError(f"--metrics-listen {address[0]}:{address[1]}: cannot listen there ({exc.strerror}); "
                               "the endpoint stays on its old address") from None
