"""The transfer options shared by ``fstream send`` and ``fstream submit`` (one definition, two commands)."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from fstream_provider.model.spec_plain import spec_from_options
from fstream_provider.model.statedir import default_secret_file
from fstream_provider.model.validation import SpecError
from fstream_provider.model.units import parse_size, parse_until
from fstream_provider.tuning.registry import DEFAULT_TUNER, TUNER_NAMES, TUNERS
from fstream_provider.tuning.variants import HARP_SWITCHES, SWITCHES

if TYPE_CHECKING:
    from fstream_provider.model.spec import TransferSpec
    from fstream_provider.model.spec_plain import PlainSpec


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _layout_help(what: str) -> str:
    fixed = ", ".join(t.name for t in TUNERS.values() if t.layout == "settings")
    start = ", ".join(t.name for t in TUNERS.values() if t.adaptive)
    return f"{what}: used by --tuner {fixed}, the starting point of {start}; the other tuners refuse it"


def add_transfer_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", nargs="+", metavar="SRC", help="files, directories or globs to send")
    p.add_argument("--to", required=True, dest="destination", metavar="URL",
                   help="fstream://HOST:PORT/DEST/PATH")
    p.add_argument("--tuner", choices=TUNER_NAMES, default=DEFAULT_TUNER,
                   help=f"how to choose cc/p/pp (default {DEFAULT_TUNER}): "
                        + "; ".join(f"{t.name}: {t.summary}" for t in TUNERS.values()))
    p.add_argument("--cc", type=int, help=_layout_help("concurrency: channels"))
    p.add_argument("--p", type=int, help=_layout_help("parallelism: TCP streams per channel"))
    p.add_argument("--pp", type=int, help=_layout_help("pipelining: files queued ahead per channel"))
    p.add_argument("--max-cc", type=int, default=32, help="upper bound on channels (default 32)")
    p.add_argument("--bandwidth", metavar="RATE", help="path bandwidth, e.g. 1Gbit, 800Mbps, 100MB/s")
    p.add_argument("--rtt", metavar="DURATION", help="round-trip time, e.g. 40ms (default: measured)")
    p.add_argument("--target-throughput", metavar="RATE", help="QoS target, e.g. 600Mbps")
    p.add_argument("--deadline", metavar="TIME",
                   help="land everything by this time (ISO-8601, UTC unless zoned) or within this duration (2h): "
                        "steers the fstream tuner's QoS target to what the deadline needs, so the transfer uses no "
                        "more of the path than that; says early when even the path's best rate cannot make it")
    p.add_argument("--on-deadline-risk", choices=("warn", "fail"), default=None,
                   help="with --deadline, when even the path's best rate cannot meet it: warn (default: a "
                        "WARNING and a 'deadline' job event) or fail (stop the transfer)")
    p.add_argument("--profile-interval", metavar="DURATION",
                   help="profiling interval: how often the tuner decides (default: the tuner's own; fstream "
                        "max(2s, 50 RTT), its thesis variant and the other tuners 10s); used by --tuner "
                        + ", ".join(t.name for t in TUNERS.values() if t.takes_interval)
                        + "; the other tuners refuse it")
    p.add_argument("--variant", metavar="NAME",
                   help="fstream: 'thesis' (Alg. 1-3 as written) or 'default', with switches added or removed, "
                        "e.g. thesis+jump or default-pacing; switches: " + ", ".join(SWITCHES)
                        + ". harp: 'paper' (SC'16 as written) or 'default'; switches: " + ", ".join(HARP_SWITCHES))
    p.add_argument("--utilisation", type=float, metavar="P",
                   help="fstream only: share of the bandwidth online profiling aims for (default 0.9; thesis 0.8)")
    p.add_argument("--band", type=float, metavar="X",
                   help="fstream only: accepted distance from that target (default 0.15)")
    p.add_argument("--sample-interval", metavar="DURATION", default="1s",
                   help="how often an interval record is taken (default 1s)")
    p.add_argument("--watch", action="store_true", help="keep scanning the sources and ship new files")
    p.add_argument("--interval", metavar="DURATION", default="2s", help="scan interval with --watch (default 2s)")
    p.add_argument("--idle-exit", metavar="DURATION", help="with --watch: stop after this long with nothing new")
    p.add_argument("--until", metavar="TIME", help="with --watch: stop scanning at this time (ISO-8601, UTC unless "
                                                   "zoned) or after this duration (30m), then finish what was found")
    p.add_argument("--connect-timeout", metavar="DURATION",
                   help="time one connection attempt may take: TCP connect, TLS and the handshake (default 10s)")
    p.add_argument("--max-attempts", metavar="N", type=int,
                   help="session tries (the first included) in one outage, such as an unreachable receiver, before "
                        "giving up as retryable (exit 75); default 5, and no limit with --watch (a stream retries "
                        "while it runs)")
    p.add_argument("--retry-for", metavar="DURATION",
                   help="how long one outage may be retried before giving up as retryable (exit 75); no other "
                        "limit unless --max-attempts is given too")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the end-to-end checksum (sizes and byte ranges are still checked)")
    p.add_argument("--secret-file", metavar="F", help="shared secret (default: $FSTREAM_STATE_DIR/secret; "
                                                      "not for submit: an agent uses its own keyring)")
    p.add_argument("--key", metavar="ID", help="the key's id in the receiver's keyring (default: default); for "
                                               "submit, also the key of the agent's keyring the job runs with")
    p.add_argument("--pool", action="store_true",
                   help="share the path's stream pool with other agents: never open more streams than the pool "
                        "grants (needs --redis; `fstream pools` shows and sets the grants)")
    p.add_argument("--priority", choices=("interactive", "batch"), default=None,
                   help="how agents scheduling with STEAL treat the job (default interactive): batch runs on the "
                        "bandwidth interactive jobs leave and never preempts (`fstream agent --scheduler steal`)")
    p.add_argument("--encrypt", action="store_true",
                   help="encrypt data and control frames (ChaCha20-Poly1305; needs the shared secret)")
    p.add_argument("--tls-cert", metavar="C")
    p.add_argument("--tls-key", metavar="K")
    p.add_argument("--tls-ca", metavar="CA")
    p.add_argument("--block-size", metavar="SIZE", type=_size, default="4MiB", help="bytes per data block (default 4MiB)")
    p.add_argument("--tcp-buffer", metavar="SIZE", type=_size,
                   help="TCP buffer cap per stream the tuners assume (default: this host's net.ipv4.tcp_wmem max)")


def spec_from_args(args: argparse.Namespace, *, job: bool = False) -> TransferSpec | PlainSpec:
    """Build a validated ``TransferSpec`` from parsed options (errors name the option and what is accepted).

    ``job``: for an agent (``fstream submit``): key files are refused (jobs refer to keys by id, ``--key``),
    and no default secret is filled in. Otherwise (``fstream send``) the spec is checked without pydantic when
    it passes (``model.spec_plain``: the same rules; an error is still the model's own message, issue 29)."""
    secret = args.secret_file
    if job:
        named = [o for o, v in (("--secret-file", secret), ("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key),
                                ("--tls-ca", args.tls_ca)) if v]
        if named:
            raise SpecError(f"{', '.join(named)}: a job may not name key files on the agent's host; the agent "
                            "authenticates with its own keyring: pass --key ID (default: its 'default' key)")
    elif secret is None and not args.tls_cert and default_secret_file().exists():
        secret = str(default_secret_file())
    build = spec_from_options
    if job:  # the job goes to Redis as the model (``bus.jobs``); an agent reads it back with the model
        from fstream_provider.model.spec import TransferSpec

        build = TransferSpec.from_options
    return build(
        [os.path.abspath(s) if not s.startswith("sftp://") else s for s in args.sources],
        args.destination,
        tuner=args.tuner, cc=args.cc, p=args.p, pp=args.pp, max_cc=args.max_cc,
        bandwidth=args.bandwidth, rtt=args.rtt, target_throughput=args.target_throughput,
        variant=args.variant, utilisation=args.utilisation, band=args.band, profile_interval=args.profile_interval, sample_interval=args.sample_interval,
        watch=args.watch, interval=args.interval, idle_exit=args.idle_exit, until=_until(args),
        verify=not args.no_verify, secret_file=secret, tls_cert=args.tls_cert, tls_key=args.tls_key,
        tls_ca=args.tls_ca, encrypt=args.encrypt, pool=args.pool, block_size=args.block_size, tcp_buffer=args.tcp_buffer,
        priority_class=args.priority, public_checksum=bool(getattr(args, "manifest", None)), key=args.key,
        deadline=_deadline(args), on_deadline_risk=args.on_deadline_risk,
        connect_timeout=args.connect_timeout, max_attempts=args.max_attempts, retry_for=args.retry_for,
    )


def _deadline(args: argparse.Namespace) -> float | None:
    if args.on_deadline_risk and not args.deadline:
        raise ValueError("--on-deadline-risk: only with --deadline")
    if not args.deadline:
        return None
    try:
        return parse_until(args.deadline, what="--deadline")
    except ValueError as exc:
        raise ValueError(str(exc)) from None


def _until(args: argparse.Namespace) -> float | None:
    if not args.until:
        return None
    if not args.watch:
        raise ValueError("--until: only with --watch (a plain send ends when its files landed)")
    try:
        return parse_until(args.until)
    except ValueError as exc:
        raise ValueError(f"--until: {exc}") from None


def add_history_options(p: argparse.ArgumentParser) -> None:
    """``--no-history``, ``--history-max-rows``, ``--history-max-age`` (``fstream send --redis`` and ``fstream agent``)."""
    from fstream_provider.bus.keys import HISTORY_MAXLEN

    p.add_argument("--no-history", action="store_true",
                   help="record no transfer history (HARP's rows in Redis; the tuners still read what exists)")
    p.add_argument("--history-max-rows", type=int, default=HISTORY_MAXLEN, metavar="N",
                   help=f"transfer-history rows kept in Redis, oldest trimmed first (default {HISTORY_MAXLEN:,})")
    p.add_argument("--history-max-age", metavar="DURATION", default="90d",
                   help="transfer-history rows older than this are trimmed (default 90d)")


def history_from_args(args: argparse.Namespace, *, keys: object = None, source: str = "") -> object:
    """``HistoryOptions`` from the options above (a bad value names the option)."""
    from fstream_provider.bus.keys import Keys
    from fstream_provider.model.units import parse_duration
    from transfer_agent.sending.history_io import HistoryOptions

    if args.history_max_rows < 1:
        raise ValueError(f"--history-max-rows {args.history_max_rows}: must be >= 1")
    try:
        age = parse_duration(args.history_max_age)
    except ValueError as exc:
        raise ValueError(f"--history-max-age {args.history_max_age!r}: {exc}") from None
    if age <= 0:
        raise ValueError(f"--history-max-age {args.history_max_age!r}: must be a positive duration")
    return HistoryOptions(record=not args.no_history, max_rows=args.history_max_rows, max_age_s=age,
                          keys=keys if keys is not None else Keys(), source=source)


def _retention(text: str) -> float:
    """``--job-retention``'s type: a positive duration of at least a second (the file's value goes through it too)."""
    from fstream_provider.model.units import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--job-retention {text!r}: {exc}") from None
    if seconds < 1:
        raise argparse.ArgumentTypeError(f"--job-retention {text!r}: must be a positive duration of at least 1s, "
                                         "such as 7d or 12h (how long a finished job is kept)")
    return seconds


def add_retention_option(p: argparse.ArgumentParser, what: str) -> None:
    """``--job-retention DURATION`` (``fstream agent``, ``submit``, ``cancel``, ``gc``; ``[<command>] job-retention``
    in the configuration file): how long a finished job's hash, events, idempotency key and index entry stay."""
    from fstream_provider.bus.keys import JOB_RETENTION_S

    default = f"{JOB_RETENTION_S // 86400}d" if JOB_RETENTION_S % 86400 == 0 else f"{JOB_RETENTION_S}s"
    p.add_argument("--job-retention", metavar="DURATION", type=_retention, default=default,
                   help=f"how long a finished job's state, events, idempotency key and index entry are kept in "
                        f"Redis; {what} (default {default})")
