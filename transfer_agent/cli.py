"""The ``fstream`` command: receive, send, agent, submit, status, cancel, bench, demo."""

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


def _install_stop_signals(event: threading.Event) -> None:
    def handler(signum: int, _frame: Any) -> None:
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
    from transfer_agent.auth import TLSConfig, create_secret_file, load_secret
    from transfer_agent.options import default_secret_file
    from fstream_provider.units import parse_duration
    from transfer_agent.receiver import Receiver

    max_age = parse_duration(args.max_part_age)
    if args.clean:
        return _clean_parts(args.root, max_age)
    if not args.listen:
        raise FStreamError("receive: --listen HOST:PORT is required (unless --clean)")
    tls = None
    if args.tls_cert or args.tls_key or args.tls_ca:
        if not (args.tls_cert and args.tls_key and args.tls_ca):
            raise FStreamError("TLS needs all of --tls-cert, --tls-key and --tls-ca")
        tls = TLSConfig(args.tls_cert, args.tls_key, args.tls_ca)
    secret_file = args.secret_file
    if secret_file is None and tls is None:
        secret_file = str(create_secret_file(default_secret_file()))
    secret = load_secret(secret_file) if secret_file else None
    stop = threading.Event()
    _install_stop_signals(stop)
    rcv = Receiver(listen=_parse_listen(args.listen), root=args.root, secret=secret, tls=tls,
                   fsync=not args.no_fsync, handshake_timeout=parse_duration(args.handshake_timeout),
                   part_max_age=max_age, max_unauth=args.max_unauth,
                   max_unauth_per_addr=args.max_unauth_per_addr,
                   require_encryption=args.require_encryption).start()
    print(f"listening on {rcv.listen_addr[0]}:{rcv.port}", flush=True)
    try:
        stop.wait()
    finally:
        rcv.stop()
    return 0


def _clean_parts(root: str, max_age: float) -> int:
    """``fstream receive --clean``: remove orphaned parts older than ``max_age`` under ``root``, print them, exit."""
    from transfer_agent.parts import sweep_parts

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


# -- send ------------------------------------------------------------------------------------------
class Progress:
    """A live progress line on stderr (rich), fed by the transfer's interval records."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._live = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

            self._p = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(),
                                   TextColumn("{task.completed}/{task.total} files"),
                                   TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[params]}"),
                                   TimeElapsedColumn(), console=Console(stderr=True), transient=False)
            self._task = self._p.add_task("fstream", total=None, rate="", params="")
            self._p.start()

    def __call__(self, kind: str, data: dict) -> None:
        if not self.enabled:
            return
        from fstream_provider.units import format_rate

        if kind == "interval":
            total = data.get("files_total") or None
            self._p.update(self._task, completed=data.get("files_done", 0), total=total,
                           rate=format_rate(data.get("throughput_bps", 0.0)),
                           params=f"cc={data.get('cc')} p={data.get('p')} pp={data.get('pp')}")
        elif kind == "tuning":
            self._p.console.print(f"[dim]tuning @{data.get('t', 0):.1f}s: {data.get('reason', '')}[/]")
        elif kind == "file" and data.get("status") == "failed":
            self._p.console.print(f"[red]failed[/] {data.get('path')}: {data.get('reason')}")

    def stop(self) -> None:
        if self.enabled:
            self._p.stop()


def print_summary(result: dict, stream: Any = None) -> None:
    """The end-of-transfer table."""
    from rich.console import Console
    from rich.table import Table

    from fstream_provider.units import format_bytes, format_rate

    t = Table(title="fstream transfer", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("files verified", str(result["verified_files"]))
    t.add_row("files skipped (already there)", str(result["skipped_files"]))
    t.add_row("files failed", str(result["failed_files"]))
    t.add_row("data", format_bytes(result["bytes"]))
    t.add_row("resumed (not re-sent)", format_bytes(result.get("resumed_bytes", 0)))
    t.add_row("time", f"{result['seconds']:.2f} s")
    t.add_row("throughput", format_rate(result["throughput_bps"]))
    t.add_row("tuner", result.get("tuner", ""))
    t.add_row("tuning decisions", str(len(result.get("tuning", []))))
    Console(file=stream or sys.stderr).print(t)
    for f in result.get("failures", [])[:20]:
        Console(file=stream or sys.stderr).print(f"[red]failed[/] {f['path']}: {f['reason']}")


def cmd_send(args: argparse.Namespace) -> int:
    from transfer_agent.options import spec_from_args
    from transfer_agent.sender import Transfer

    spec = spec_from_args(args)
    cancel = threading.Event()
    _install_stop_signals(cancel)
    redis = None
    if args.redis or os.environ.get("FSTREAM_REDIS_URL"):
        from fstream_provider.bus import connect
        from fstream_provider.embedded import resolve_redis_url
        redis = connect(resolve_redis_url(args.redis))
    show = not args.json and (args.progress or sys.stderr.isatty())
    progress = Progress(show)
    try:
        kw = {}
        if args.stall_timeout:
            from fstream_provider.units import parse_duration
            kw["stall_timeout"] = parse_duration(args.stall_timeout)
        result = Transfer(spec, on_event=progress, cancel=cancel, redis=redis, **kw).run()
    finally:
        progress.stop()
    out = result.to_dict()
    if args.json:
        print(json.dumps(out), flush=True)
    else:
        print_summary(out)
    if not result.ok:
        msg = result.error or "; ".join(f"{f['path']}: {f['reason']}" for f in result.failures[:5])
        print(f"fstream send: failed: {msg}", file=sys.stderr)
        return 1
    return 0


# -- parser ----------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from transfer_agent.options import add_transfer_options

    parser = argparse.ArgumentParser(prog="fstream", description="Stream files over tuned parallel TCP channels.")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    sub = parser.add_subparsers(dest="command", required=True)

    r = sub.add_parser("receive", help="run a receiver (destination side)")
    r.add_argument("--listen", metavar="HOST:PORT", help="address to listen on (port 0: any free); required "
                                                             "unless --clean")
    r.add_argument("--root", required=True, metavar="DIR", help="destination root; nothing is written outside it")
    r.add_argument("--secret-file", metavar="F", help="shared secret (default: $FSTREAM_STATE_DIR/secret, created)")
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
    r.add_argument("--clean", action="store_true",
                   help="remove orphaned parts older than --max-part-age under --root, print them, and exit "
                        "(do not run it on a root a live receiver is writing)")
    r.set_defaults(func=cmd_receive)

    s = sub.add_parser("send", help="send files now (source side)")
    add_transfer_options(s)
    s.add_argument("--redis", metavar="URL", help="Redis for profiling history (default: none for send)")
    s.add_argument("--json", action="store_true", help="print one JSON object when done")
    s.add_argument("--progress", action="store_true", help="show the progress bar even when not on a terminal")
    s.add_argument("--stall-timeout", metavar="DURATION",
                   help="progress window: a session that moves less than the progress floor (64 kbit/s) "
                        "for this long with files outstanding is declared stalled and resumed (default 60s)")
    s.set_defaults(func=cmd_send)

    try:
        from transfer_agent import cli_jobs
    except ImportError:
        cli_jobs = None  # type: ignore[assignment]
    if cli_jobs is not None:
        for name in ("add_agent_parser", "add_submit_parser", "add_status_parser", "add_cancel_parser"):
            fn = getattr(cli_jobs, name, None)
            if fn is not None:
                fn(sub)
        for name in dir(cli_jobs):
            if name.startswith("add_") and name.endswith("_parser") and name not in (
                    "add_agent_parser", "add_submit_parser", "add_status_parser", "add_cancel_parser"):
                getattr(cli_jobs, name)(sub)

    b = sub.add_parser("bench", help="benchmarks and the emulated WAN testbed", add_help=False)
    b.add_argument("bench_args", nargs=argparse.REMAINDER)
    b.set_defaults(func=cmd_bench)

    d = sub.add_parser("demo", help="the whole story on one machine")
    d.add_argument("--files", type=int, default=0, help="override the number of generated files")
    d.add_argument("--no-airflow", action="store_true", help="skip the Airflow part")
    d.set_defaults(func=cmd_demo)
    return parser


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        from fstream_bench.cli import main as bench_main
    except ImportError as exc:
        raise FStreamError(f"benchmarks are not installed with this package ({exc})") from None
    return int(bench_main(args.bench_args) or 0)


def cmd_demo(args: argparse.Namespace) -> int:
    from transfer_agent.demo import run_demo

    return run_demo(files=args.files, airflow=not args.no_airflow)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # everything after "bench" (options too) belongs to the bench CLI
        argv = ["bench", "--", *argv[1:]]
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "bench" and args.bench_args[:1] == ["--"]:
        args.bench_args = args.bench_args[1:]
    _setup_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except (FStreamError, ValueError, FileNotFoundError) as exc:
        print(f"fstream {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
