"""The ``fstream`` command: receive, send, the job commands, and commands installed packages add (bench, demo)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from typing import Any, Sequence

from transfer_agent.errors import FStreamError


def _setup_logging(verbose: int, quiet: bool = False) -> None:
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)


def _install_stop_signals(event: threading.Event, term: threading.Event | None = None) -> None:
    """SIGINT and SIGTERM set ``event``; SIGTERM also sets ``term`` (a daemon drains on it, stops on SIGINT)."""
    def handler(signum: int, _frame: Any) -> None:
        if term is not None and signum == signal.SIGTERM:
            term.set()
        event.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(sig, handler)
        except ValueError:  # not the main thread (tests)
            pass


# -- receive ---------------------------------------------------------------------------------------
def _parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen {text!r}: expected HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def cmd_receive(args: argparse.Namespace) -> int:
    from transfer_agent.wire.auth import TLSConfig, create_secret_file, load_secret
    from fstream_provider.model.statedir import default_secret_file
    from fstream_provider.model.units import parse_duration
    from transfer_agent.receiving.keyring import DEFAULT_KEY, ReceiverKey, load_keyring
    from transfer_agent.receiving.quota import default_quota_state
    from transfer_agent.receiving.receiver import Receiver
    from transfer_agent.storage import tree_hash

    max_age = parse_duration(args.max_part_age)
    if args.clean:
        return _clean_parts(args.root, max_age)
    quota_state = args.quota_state or str(default_quota_state(args.root))
    if args.quota_recount:
        return _quota_recount(args.root, args.keyring, quota_state)
    from transfer_agent.service.attach import ReceiverService

    service = ReceiverService(args)  # issue 30: --metrics-listen, --free-space-floor, --check (bad values: exit 2)
    if args.check:
        return service.check()
    if not args.listen:
        raise FStreamError("receive: --listen HOST:PORT is required (unless --clean)")
    tls = None
    if args.tls_cert or args.tls_key or args.tls_ca:
        if not (args.tls_cert and args.tls_key and args.tls_ca):
            raise FStreamError("TLS needs all of --tls-cert, --tls-key and --tls-ca")
        tls = TLSConfig(args.tls_cert, args.tls_key, args.tls_ca)
    keyring = load_keyring(args.keyring) if args.keyring else None
    secret_file = args.secret_file
    if secret_file is None and tls is None and keyring is None:
        secret_file = str(create_secret_file(default_secret_file()))
    secret = load_secret(secret_file) if secret_file else None
    if keyring is not None and secret is not None:  # the secret file is the key "default"
        if DEFAULT_KEY in keyring:
            raise FStreamError(f"--secret-file {secret_file} and --keyring {args.keyring}: the keyring defines key "
                               f"{DEFAULT_KEY!r} already; give its secret_file in the keyring, or drop --secret-file")
        keyring, secret = keyring.with_key(ReceiverKey(DEFAULT_KEY, secret)), None
    from transfer_agent.service import sdnotify

    parse_duration(args.drain_grace)  # a bad value: an error before anything starts
    stop, term = threading.Event(), threading.Event()
    _install_stop_signals(stop, term)
    if args.workers != 1 and args.handoff_fd is None:  # one port, several processes (issue 43)
        from transfer_agent.cli import receive_workers
        return receive_workers.run(args, keyring, quota_state, tls, _parse_listen(args.listen), stop, term)
    kw: dict[str, Any] = dict(listen=_parse_listen(args.listen), root=args.root, secret=secret, tls=tls,
                              fsync=not args.no_fsync, keyring=keyring, part_max_age=max_age,
                              handshake_timeout=parse_duration(args.handshake_timeout),
                              max_unauth=args.max_unauth, max_unauth_per_addr=args.max_unauth_per_addr,
                              require_encryption=args.require_encryption, quota_state=quota_state,
                              watchdog=sdnotify.Watchdog.from_env())  # a unit's WatchdogSec= (issue 39)
    if args.handoff_fd is not None:  # a worker of `receive --workers N` (cli.receive_workers)
        from transfer_agent.receiving.handoff import worker_receiver
        rcv = worker_receiver(args, kw, lambda: (term.set(), stop.set())).start()
    else:
        rcv = Receiver(**kw).start()
    from transfer_agent.cli.sighup import Hangup

    def _reloader():
        from transfer_agent.cli.reload import RECEIVER_LIVE, Reloader, receiver_apply
        return Reloader(args, RECEIVER_LIVE, receiver_apply(rcv, service, args))

    reloader = None
    try:
        service.start(rcv)  # issue 30: /metrics, /healthz and /readyz on --metrics-listen (nothing without it)
        reloader = Hangup(_reloader).install()  # SIGHUP (cli.reload is imported on the first one)
        print(f"fstream receive: {tree_hash.native_line()}", file=sys.stderr, flush=True)  # issue 39: once
        print(f"listening on {rcv.listen_addr[0]}:{rcv.port}", flush=True)  # ready: SIGHUP is handled from here
        sdnotify.ready(f"listening on {rcv.listen_addr[0]}:{rcv.port}, root {args.root}")
        if rcv.watchdog is not None:
            print(f"fstream receive: systemd watchdog: {rcv.watchdog.describe()}, from the flush loop",
                  file=sys.stderr, flush=True)
        stop.wait()
    finally:
        if reloader is not None:
            reloader.close()
        if term.is_set():  # SIGTERM (systemctl stop): open sessions finish within the grace; SIGINT: at once
            grace = parse_duration(args.drain_grace)  # as reloaded
            sdnotify.stopping(f"draining (up to {grace:.0f} s)", grace)
            rcv.drain(grace)
        else:
            rcv.stop()
        service.stop()
    return 0


def _clean_parts(root: str, max_age: float) -> int:
    """``fstream receive --clean``: remove orphaned parts older than ``max_age`` under ``root``, print them, exit."""
    from transfer_agent.storage.parts import sweep_parts

    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise FStreamError(f"--clean: cannot open destination root {root}: {exc.strerror}") from None
    try:
        removed = sweep_parts(root_fd, max_age)
    finally:
        os.close(root_fd)
    for rel in removed:
        print(f"removed {os.path.join(root, rel)}", flush=True)
    print(f"{len(removed)} orphaned part file(s) removed from {root}", flush=True)
    return 0


def _quota_recount(root: str, keyring_file: str | None, state: str) -> int:
    """``fstream receive --quota-recount``: walk the subtree of every key with a quota once, persist the counts
    (as a clean stop would), print them, exit; refused while a receiver holds the state file."""
    from fstream_provider.model.units import format_bytes
    from transfer_agent.receiving.keyring import load_keyring
    from transfer_agent.receiving.quota import Quotas

    if not keyring_file:
        raise FStreamError("--quota-recount: give the receiver's --keyring (its keys with a quota are counted)")
    ring = load_keyring(keyring_file)
    quotas = Quotas(os.path.abspath(root), state_path=state, keys=ring.values)
    quotas.open()
    try:
        for key_id, used in quotas.recount().items():
            quota = ring[key_id].quota or 0
            print(f"key {key_id}: {used} bytes ({format_bytes(used)}) of {format_bytes(quota)} under "
                  f"{ring[key_id].where()}", flush=True)
    finally:
        quotas.close()
    print(f"quota counts written to {state}", flush=True)
    return 0


# -- send ------------------------------------------------------------------------------------------
def cmd_send(args: argparse.Namespace) -> int:
    from transfer_agent.cli.exits import EXIT_RETRY, exit_code
    from transfer_agent.cli.manifest import Manifest, chain
    from transfer_agent.cli.progress import Progress, print_summary
    from transfer_agent.cli.options import history_from_args, spec_from_args
    from transfer_agent.sending.sender import Transfer

    spec = spec_from_args(args)
    cancel = threading.Event()
    _install_stop_signals(cancel)
    redis = None
    if args.redis or os.environ.get("FSTREAM_REDIS_URL"):
        from fstream_provider.bus.client import connect
        from fstream_provider.bus.embedded import resolve_redis_url
        redis = connect(resolve_redis_url(args.redis))
    manifest = Manifest(args.manifest, spec.destination) if args.manifest else None  # a bad path: before the bar
    show = not args.json and (args.progress or sys.stderr.isatty())
    progress = Progress(show)
    try:
        kw = {}
        if args.stall_timeout:
            from fstream_provider.model.units import parse_duration
            kw["stall_timeout"] = parse_duration(args.stall_timeout)
        result = Transfer(spec, on_event=chain(progress, manifest), cancel=cancel, redis=redis,
                          history=history_from_args(args), **kw).run()
    finally:
        progress.stop()
        if manifest is not None:
            manifest.close()
    out = result.to_dict()
    if args.json:
        print(json.dumps(out), flush=True)
    else:
        print_summary(out)
    code = exit_code(result)
    if code:
        msg = result.error or "; ".join(f"{f['path']}: {f['reason']}" for f in result.failures[:5])
        hint = " (retryable: a rerun resends only what is missing)" if code == EXIT_RETRY else ""
        print(f"fstream send: failed{hint}: {msg}", file=sys.stderr)
    return code


SEND_EPILOG = """exit codes:
  0    every file landed (or was already there, same size and checksum)
  1    a file failed and another try will not help without a change
  2    bad option, spec or configuration
  75   retryable: receiver unreachable, network, stall (a rerun resends only what is missing)
  130  interrupted (SIGINT/SIGTERM); a rerun resumes"""


# -- parser ----------------------------------------------------------------------------------------
# every built-in command but receive and send (this module's): the module and function that add its parser, in the
# order `fstream --help` lists them; ``build_parser(only=...)`` imports just the one a command needs
PARSERS = {"agent": ("jobs", "add_agent_parser"), "submit": ("jobs", "add_submit_parser"),
           "status": ("jobs", "add_status_parser"), "cancel": ("jobs", "add_cancel_parser"),
           "reconcile": ("bus_admin", "add_reconcile_parser"), "redis": ("bus_admin", "add_redis_parser"),
           "seen": ("seen", "add_seen_parser"), "history": ("history", "add_history_parser"),
           "calibrate": ("calibrate", "add_calibrate_parser"), "pools": ("pools", "add_pools_parser"),
           "schedule": ("schedule", "add_schedule_parser"), "redis-acl": ("acl", "add_acl_parser"),
           "audit": ("audit", "add_audit_parser"), "top": ("top", "add_top_parser"),
           "config": ("config_cmd", "add_config_parser"), "doctor": ("doctor", "add_doctor_parser"),
           "keys": ("keys", "add_keys_parser"), "gc": ("gc", "add_gc_parser")}
BUILTIN = frozenset({"receive", "send", *PARSERS})
WHOLE = frozenset({"config"})  # commands that read every other command's parser (`fstream config show`)


def build_parser(plugins: dict[str, Any] | None = None, *, only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; ``plugins`` (default: every installed one) adds the other packages' commands.

    ``only``: just that command (built-in, or one of ``plugins``) under ``fstream``, for a run that needs no other:
    its own parsing, help and errors are the same, and no other command's module is imported (``main``: a command
    that nothing configures; issue 29 for ``send``'s CPU, issue 42 so that a benchmark's processes import, and its
    provenance hashes, only the commands they run)."""
    parser = argparse.ArgumentParser(prog="fstream", description="Stream files over tuned parallel TCP channels.")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    from transfer_agent.cli.version import VersionAction

    parser.add_argument("--version", action=VersionAction)  # package and protocol versions, read only when asked
    parser.add_argument("--config", dest="config_file", metavar="FILE",
                        help="configuration file (default: $FSTREAM_CONFIG, else /etc/fstream/fstream.toml if it "
                             "exists; docs/config.md); the environment and the command line override it")
    sub = parser.add_subparsers(dest="command", required=True)
    if only in (None, "receive"):
        _add_receive_parser(sub)
    if only in (None, "send"):
        _add_send_parser(sub)
    import importlib

    for name, (module, add) in PARSERS.items():
        if only in (None, name):
            getattr(importlib.import_module(f"transfer_agent.cli.{module}"), add)(sub)
    plugins = plugin_commands() if plugins is None else plugins
    for name, register in plugins.items():
        if only in (None, name):
            register(sub)
    return parser


def _add_receive_parser(sub: Any) -> None:
    r = sub.add_parser("receive", help="run a receiver (destination side)")
    r.add_argument("--listen", metavar="HOST:PORT", help="address to listen on (port 0: any free); required "
                                                             "unless --clean")
    r.add_argument("--root", required=True, metavar="DIR", help="destination root; nothing is written outside it")
    r.add_argument("--secret-file", metavar="F",
                   help="shared secret (default: $FSTREAM_STATE_DIR/secret, created, unless --keyring or TLS is "
                        "given); with --keyring: the key 'default'")
    r.add_argument("--keyring", metavar="FILE",
                   help="TOML keyring: [keys.<id>] tables with secret_file, subtree (where under --root that key may "
                        "write) and quota (e.g. 10TiB); senders name their key (send --key)")
    r.add_argument("--tls-cert", metavar="C")
    r.add_argument("--tls-key", metavar="K")
    r.add_argument("--tls-ca", metavar="CA")
    r.add_argument("--require-encryption", action="store_true",
                   help="refuse senders that do not encrypt (send --encrypt); TLS connections count as encrypted")
    r.add_argument("--no-fsync", action="store_true", help="skip fsync on commit (faster, not crash-safe)")
    r.add_argument("--handshake-timeout", metavar="DURATION", default="10s",
                   help="total time a connection may take to authenticate (default 10s)")
    r.add_argument("--max-unauth", type=int, default=64, metavar="N",
                   help="unauthenticated connections held at once (default 64)")
    r.add_argument("--max-unauth-per-addr", type=int, default=16, metavar="N",
                   help="unauthenticated connections held at once from one source address (default 16)")
    r.add_argument("--max-part-age", metavar="DURATION", default="7d",
                   help="orphaned .part/.meta files untouched this long are removed (default 7d)")
    r.add_argument("--drain-grace", metavar="DURATION", default="30s",
                   help="on SIGTERM, refuse new sessions and let open ones finish for this long, then stop "
                        "(open parts stay resumable); SIGINT stops at once (default 30s)")
    from transfer_agent.service.options import add_service_options

    add_service_options(r, receiver=True)
    r.add_argument("--quota-state", metavar="FILE",
                   help="where the keys' quota counts persist between runs (default: "
                        "$FSTREAM_STATE_DIR/receiver-quota/<hash of --root>.json; one receiver per file)")
    r.add_argument("--quota-recount", action="store_true",
                   help="count what every key with a quota holds under its subtree (one walk each), write the "
                        "counts to --quota-state, print them, and exit; run it with the receiver stopped after "
                        "files were added or removed by hand")
    r.add_argument("--workers", type=int, default=1, metavar="N",
                   help="receiver processes behind the one port (default 1): the router hands each connection to "
                        "the process of its session (HMAC handshake only; not with TLS or --metrics-listen)")
    for hidden in ("--handoff-fd", "--worker-index", "--router-port"):  # set by the router for its workers
        r.add_argument(hidden, type=int, help=argparse.SUPPRESS).internal = True  # not in the file
    r.add_argument("--clean", action="store_true",
                   help="remove orphaned parts older than --max-part-age under --root, print them, and exit "
                        "(do not run it on a root a live receiver is writing)")
    r.set_defaults(func=cmd_receive)


def _add_send_parser(sub: Any) -> None:
    from transfer_agent.cli.options import add_history_options, add_transfer_options
    from transfer_agent.cli.redis_auth import add_redis_options

    s = sub.add_parser("send", help="send files now (source side)", epilog=SEND_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_transfer_options(s)
    add_redis_options(s, "Redis for the tuners' history: profiling, and HARP's transfer history read and recorded "
                         "(default: none for send)")
    add_history_options(s)
    s.add_argument("--json", action="store_true", help="print one JSON object when done")
    s.add_argument("--manifest", metavar="FILE",
                   help="write one JSON line per landed file (source, path, url, size, checksum, status) as it "
                        "lands; for the next step of a pipeline")
    s.add_argument("--progress", action="store_true", help="show the progress bar even when not on a terminal")
    s.add_argument("--stall-timeout", metavar="DURATION",
                   help="progress window: a session that moves less than the progress floor (64 kbit/s) "
                        "for this long with files outstanding is declared stalled and resumed (default 60s)")
    s.set_defaults(func=cmd_send)


def plugin_commands(name: str | None = None) -> dict[str, Any]:
    """Commands other installed packages add (entry-point group ``fstream.commands``: ``bench``, ``demo``); with
    ``name``, only that one if it is installed (else every one, so that a wrong name's error lists them).

    The agent never imports them: a transfer node without the benchmarks or Airflow simply has
    fewer commands. Each entry point is a ``register(subparsers)`` function; one with
    ``passthrough = True`` receives every argument after its name unparsed.
    """
    from importlib.metadata import entry_points

    out: dict[str, Any] = {}
    found = entry_points(group="fstream.commands")
    if name is not None and name in found.names:  # the command asked for: only its module is imported
        found = found.select(name=name)
    for ep in found:
        try:
            out[ep.name] = ep.load()
        except ImportError as exc:  # an optional dependency of that command is missing
            logging.getLogger(__name__).debug("command %s unavailable: %s", ep.name, exc)
    return out


def quiet_gc() -> None:
    """Fewer, cheaper cyclic collections for a transfer process (issue 13: ``gc`` was ~3 % of the sending
    core on small files): what start-up created (modules, classes, the parser) is frozen out of every
    later collection, and the youngest generation is collected after 20,000 allocations instead of 700.
    The per-file objects are mostly freed by reference counting; cycles are still collected, later: in
    the long-running ``receive`` and ``agent`` a cycle holding a buffer or a socket lives a little longer."""
    import gc

    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # a built-in command needs no plugin: reading the entry points and importing every plugin (the
    # benchmarks, the demo) cost `send` 50 ms of CPU per run (issue 13); help and plugin commands load them
    from transfer_agent.cli import config  # cheap: tomllib and pydantic only when there is something to read

    config_file, at = config.global_options(argv)  # the global --config FILE comes before the command
    command = argv[at] if at is not None else None
    from transfer_agent.cli import redis_auth

    secret = redis_auth.refusal(argv)  # a password in an argument: in every process listing (issue 40)
    if secret is not None:
        print(f"fstream{' ' + command if command else ''}: error: {secret}", file=sys.stderr)
        return 2
    version = command is None and "--version" in argv  # `fstream --version` needs no plugin either
    builtin = (command in BUILTIN or version) and not {"-h", "--help"} & set(argv[:at])
    plugins = {} if builtin else plugin_commands(None if at is None or {"-h", "--help"} & set(argv[:at])
                                                 else command)
    if builtin:  # nor pydantic's plugins (none is used here): their entry-point scan was another 15-25 ms
        os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    if at is not None and getattr(plugins.get(command), "passthrough", False):
        argv = [*argv[:at + 1], "--", *argv[at + 1:]]  # everything after the name (options too) belongs to it
    # a command that no file or variable configures needs no other command's parser (issue 29: building them all,
    # and importing their modules, cost every send ~20 ms of CPU; issue 42: a benchmark's processes import only the
    # commands they run); a configuration is checked whole, as ever
    alone = command is not None and command not in WHOLE and (builtin or command in plugins)
    only = command if alone and not config.may_configure(command, config_file, [*BUILTIN, *plugins]) else None
    parser = build_parser(plugins, only=only)
    try:  # the configuration file and FSTREAM_* variables become the command's defaults (docs/config.md)
        configured = config.apply(parser, argv, command, config_file) if only is None else config.unconfigured
    except FStreamError as exc:
        print(f"fstream {command}: error: {exc}", file=sys.stderr)
        return 2
    args, extra = parser.parse_known_args(argv)
    if extra:  # refused with the whole command line's usage, as ever
        (build_parser(plugins) if only is not None else parser).parse_args(argv)
    configured(args)
    # a daemon's SIGHUP parses its command line again with the configuration as it is then (cli.reload)
    # (the whole parser: the configuration that reload reads may be new, and it is checked whole)
    args.argv, args.parser_factory = argv, lambda: build_parser(plugins)
    rest = getattr(args, "passthrough_args", None)
    if rest and rest[:1] == ["--"]:
        args.passthrough_args = rest[1:]
    _setup_logging(args.verbose)
    if getattr(args, "log_level", None):  # the daemons' --log-level (issue 30) beats -v
        logging.getLogger().setLevel(args.log_level.upper())
    quiet_gc()
    try:
        redis_auth.resolve(args)  # --redis-password-file (or its variable, or [redis] password-file) into the URL
        return int(args.func(args) or 0)
    except (FStreamError, ValueError, FileNotFoundError) as exc:
        print(f"fstream {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a provider-only install asked to run the agent's code (issue 39)
        from fstream_provider.extras import agent_only

        hint = agent_only(exc, "this command")
        if hint is exc:
            raise
        print(f"fstream {args.command}: error: {hint}", file=sys.stderr)
        return 2
    except Exception as exc:  # a Redis below the floor, or none there (issue 39): what to do, not a traceback
        floor = sys.modules.get("fstream_provider.bus.server_floor")  # loaded with any Redis client; else not it
        bus = sys.modules.get("fstream_provider.bus.client")
        if floor is not None and isinstance(exc, floor.UnsupportedServerError):
            print(f"fstream {args.command}: error: {exc}", file=sys.stderr)
            return 2
        if bus is not None and isinstance(exc, bus.REDIS_UNREACHABLE):
            print(f"fstream {args.command}: error: Redis unreachable ({type(exc).__name__}: {exc}); is it running? "
                  "--redis or FSTREAM_REDIS_URL say where it is (unset: the embedded server)", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
