"""``fstream doctor --to URL`` (issue 30): diagnose a path before the first transfer and when it is slow.

Measures with ``sending.doctor_probe`` (RTT, clock skew, both ends' TCP buffers, congestion control and MTUs, one
stream's and several streams' rates into the receiver's discarding sink, the receiver's disk), checks the modes of
the key files used, judges with ``fstream_provider.tuning.host_advice`` and prints the measurements, the advice
and a one-line VERDICT (``--json``: one object). Exit codes: ``DOCTOR_EPILOG``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import stat
import sys
import textwrap
from typing import Any

from transfer_agent.cli.exits import EXIT_FAILED, EXIT_OK, EXIT_RETRY, EXIT_USAGE
from transfer_agent.errors import FStreamError, NetworkError

DOCTOR_EPILOG = """exit codes:
  0    nothing found that limits the path (the verdict is "none found")
  1    a limiting cause was named: buffer cap, bottleneck or destination disk
  2    bad option or configuration (a secret file others may read, a wrong secret, ...)
  75   the receiver is unreachable (a rerun may succeed)"""


def add_doctor_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "doctor", help="diagnose the path to a receiver: RTT, rates, TCP buffers, MTU, disk, clocks, advice",
        description="Measure the path to a receiver (a few seconds of rate probes into its sink: nothing is "
                    "written but one temp file of the disk probe, removed after) and say what limits it, with "
                    "host-tuning advice.", epilog=DOCTOR_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--to", required=True, dest="destination", metavar="URL",
                   help="fstream://HOST:PORT[/PATH] (the path is not used)")
    p.add_argument("--secret-file", metavar="F", help="shared secret (default: $FSTREAM_STATE_DIR/secret)")
    p.add_argument("--key", metavar="ID", help="the key's id in the receiver's keyring (default: default)")
    p.add_argument("--tls-cert", metavar="C")
    p.add_argument("--tls-key", metavar="K")
    p.add_argument("--tls-ca", metavar="CA")
    p.add_argument("--seconds", metavar="DURATION", default="3s",
                   help="length of each rate probe, one stream then --streams (default 3s, at most 10s)")
    p.add_argument("--streams", type=int, default=8, metavar="N", help="streams of the parallel probe (default 8)")
    p.add_argument("--bandwidth", metavar="RATE",
                   help="what the path should carry (e.g. 10Gbit): a path that delivers it is reported healthy, "
                        "and the advice sizes buffers for it")
    p.add_argument("--disk-bytes", metavar="SIZE", default="64MiB",
                   help="the receiver's disk probe writes at most this much (default 64MiB, at most 256MiB)")
    p.add_argument("--disk-seconds", metavar="DURATION", default="2s",
                   help="... for at most this long (default 2s)")
    p.add_argument("--no-disk", action="store_true", help="skip the receiver's disk probe")
    p.add_argument("--json", action="store_true", help="print one JSON object (measurements, advice, verdict)")
    p.set_defaults(func=cmd_doctor)
    return p


def _key_files(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(path, what) of the key files this run uses."""
    from fstream_provider.model.statedir import default_secret_file

    secret = args.secret_file
    if secret is None and not args.tls_cert and default_secret_file().exists():
        secret = str(default_secret_file())
    files = [(secret, "secret file")] if secret else []
    return files + ([(args.tls_key, "TLS key")] if args.tls_key else [])


def _modes(files: list[tuple[str, str]]) -> list[Any]:
    from fstream_provider.tuning.host_advice import SecretFile

    out = []
    for path, what in files:
        try:
            out.append(SecretFile(path, stat.S_IMODE(os.stat(path).st_mode), what))
        except OSError as exc:
            raise FStreamError(f"{what} {path}: {exc.strerror}") from None
    return out


def _plan(args: argparse.Namespace) -> Any:
    from fstream_provider.model.units import parse_duration, parse_size
    from transfer_agent.sending.doctor_probe import ProbePlan

    plan = ProbePlan(seconds=parse_duration(args.seconds), streams=args.streams,
                     disk_bytes=0 if args.no_disk else parse_size(args.disk_bytes),
                     disk_seconds=parse_duration(args.disk_seconds))
    plan.check()
    return plan


def cmd_doctor(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from fstream_provider.model.spec import Destination
    from fstream_provider.model.units import parse_rate
    from fstream_provider.tuning.host_advice import diagnose, secret_advice
    from transfer_agent.sending.doctor_probe import PathProbe
    from transfer_agent.storage.tree_hash import native_status
    from transfer_agent.wire.auth import TLSConfig, load_secret

    dest = Destination.parse(args.destination)
    plan = _plan(args)
    bandwidth = parse_rate(args.bandwidth) if args.bandwidth else None
    if any((args.tls_cert, args.tls_key, args.tls_ca)) and not all((args.tls_cert, args.tls_key, args.tls_ca)):
        raise FStreamError("TLS needs all of --tls-cert, --tls-key and --tls-ca")
    files = _key_files(args)
    keyfiles = _modes(files)
    doc: dict[str, Any] = {"destination": f"fstream://{dest.host}:{dest.port}",
                           "secrets": [_secret_row(s) for s in keyfiles], "native_hashing": native_status()}
    refused = [s for s in keyfiles if s.what == "secret file" and s.mode & 0o077]
    if refused:  # fail closed: such a secret is not used; say so with the advice, and stop
        doc.update(advice=[asdict(a) for a in secret_advice(keyfiles)], verdict=None)
        return _fail(args, doc, EXIT_USAGE, f"secret file {refused[0].path} is mode {refused[0].mode:04o}: readable "
                                            f"or writable by group or others; refusing to use it: chmod 600 "
                                            f"{refused[0].path}")
    secret_file = next((p for p, what in files if what == "secret file"), None)
    secret = load_secret(secret_file) if secret_file else None
    tls = TLSConfig(args.tls_cert, args.tls_key, args.tls_ca) if args.tls_cert else None
    try:
        ssl_ctx = tls.client_context() if tls else None
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise FStreamError(f"TLS: cannot load --tls-cert {args.tls_cert} / --tls-key {args.tls_key} / --tls-ca "
                           f"{args.tls_ca}: {exc}") from None
    if secret is None and tls is None:
        raise FStreamError("no shared secret (--secret-file, or $FSTREAM_STATE_DIR/secret) and no TLS certificates "
                           "(--tls-cert/--tls-key/--tls-ca): doctor authenticates like send")
    say = (lambda line: print(f"fstream doctor: {line} ...", file=sys.stderr, flush=True)) \
        if not args.json and sys.stderr.isatty() else (lambda line: None)
    probe = PathProbe(dest.host, dest.port, secret, ssl_ctx, key_id=args.key, plan=plan, say=say)
    try:
        measured = probe.run()
    except FStreamError as exc:
        if not exc.retryable:
            raise
        gone = isinstance(exc, NetworkError)
        doc.update(reachable=not gone, verdict=None)
        return _fail(args, doc, EXIT_RETRY, f"receiver {dest.host}:{dest.port} {'unreachable' if gone else 'busy'}: "
                                            f"{exc}")
    diag = diagnose(report_of(measured, keyfiles, bandwidth))
    code = EXIT_OK if diag.verdict == "none found" else EXIT_FAILED
    doc.update(reachable=True, **measured, **diag.to_dict(), exit=code)
    if args.json:
        print(json.dumps(doc, default=str), flush=True)
    else:
        print(render(doc), flush=True)
    return code


def _secret_row(s: Any) -> dict[str, Any]:
    return {"path": s.path, "what": s.what, "mode": f"{s.mode:04o}", "ok": not s.mode & 0o077}


def _fail(args: argparse.Namespace, doc: dict[str, Any], code: int, message: str) -> int:
    doc.update(error=message, exit=code)
    if args.json:
        print(json.dumps(doc, default=str), flush=True)
    else:
        print(render(doc), flush=True)
    print(f"fstream doctor: error: {message}", file=sys.stderr, flush=True)
    return code


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def report_of(measured: dict[str, Any], keyfiles: list[Any], bandwidth_bps: float | None) -> Any:
    """The ``PathReport`` ``host_advice.diagnose`` judges, from ``PathProbe.run``'s measurements."""
    from fstream_provider.tuning.host_advice import HostTcp, PathReport

    rate = measured["rate"]
    disk = measured.get("disk") or {}
    root = measured["receiver"].get("root")
    root = root if isinstance(root, dict) else {}
    free, total = _num(root.get("free_bytes")), _num(root.get("total_bytes"))
    return PathReport(rtt_s=max(measured["rtt"]["median_s"], 1e-6), single_bps=rate["single"]["bps"],
                      parallel_bps=rate["parallel"]["bps"], streams=rate["streams"],
                      sender=HostTcp.from_facts(measured["sender"]), receiver=HostTcp.from_facts(measured["receiver"]),
                      disk_bps=_num(disk.get("bps")), free_bytes=int(free) if free is not None else None,
                      total_bytes=int(total) if total is not None else None,
                      clock_skew_s=measured["clock"]["skew_s"], secrets=tuple(keyfiles), bandwidth_bps=bandwidth_bps)


# -- the report ------------------------------------------------------------------------------------
SIDE_ROWS = (("tcp_rmem", "net.ipv4.tcp_rmem"), ("tcp_wmem", "net.ipv4.tcp_wmem"), ("rmem_max", "net.core.rmem_max"),
             ("wmem_max", "net.core.wmem_max"), ("congestion ctl", "net.ipv4.tcp_congestion_control"),
             ("default qdisc", "net.core.default_qdisc"))


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds is not None else "?"


def _measurements(doc: dict[str, Any], row: Any) -> None:
    from fstream_provider.tuning.host_advice import rate_text, size_text

    rtt, clock, rate = doc["rtt"], doc["clock"], doc["rate"]
    tcpi = f" (kernel tcpi_rtt {_ms(rtt['tcpi_rtt_s'])})" if rtt.get("tcpi_rtt_s") else ""
    row("RTT", f"{_ms(rtt['median_s'])}, median of {len(rtt['samples_s'])} round trips{tcpi}")
    if clock.get("skew_s") is not None:
        row("clock skew", f"receiver {clock['skew_s']:+.3f} s against ours (+-{clock['error_bound_s']:.3f} s)")
    retrans = rate["parallel"].get("retransmits")
    row("one stream", rate_text(rate["single"]["bps"]))
    row(f"{rate['streams']} streams", rate_text(rate["parallel"]["bps"])
        + (f" ({retrans} retransmitted segments)" if retrans else ""))
    if doc.get("window_bytes"):
        row("window", f"{size_text(doc['window_bytes'])} per stream (the smaller of the sender's tcp_wmem and the "
                      f"receiver's tcp_rmem max): {rate_text(doc['window_cap_bps'])} at this RTT")
    if doc.get("bdp_bytes"):
        row("BDP", f"{size_text(doc['bdp_bytes'])} ({rate_text(doc['path_bps'])} x RTT)")
    disk = doc.get("disk")
    if disk and disk.get("error"):
        row("receiver disk", f"not measured: {disk['error']}")
    elif disk:
        row("receiver disk", f"{size_text(disk['bytes'])} in {disk['seconds']:.2f} s with fdatasync: "
                             f"{rate_text(disk['bps'])} (a temp file under {disk.get('where')}, removed)")
    root = doc["receiver"].get("root") or {}
    if root.get("total_bytes"):
        row("receiver free", f"{size_text(root['free_bytes'])} of {size_text(root['total_bytes'])}")
    snd, rcv = doc["sender"], doc["receiver"]
    row("", f"{'sender (this host)':<34}receiver")
    for label, name in SIDE_ROWS:
        row(label, f"{str((snd.get('sysctl') or {}).get(name)):<34}{(rcv.get('sysctl') or {}).get(name)}")
    iface = [f"{side.get('interface')} (MTU {side.get('interface_mtu')})" for side in (snd, rcv)]
    row("interface", f"{iface[0]:<34}{iface[1]}")
    row("route MTU", f"{str(snd.get('route_mtu')):<34}{rcv.get('route_mtu')}")


def native_text(status: Any) -> str:
    """``tree_hash.native_status()`` (this host's, or a receiver's FACTS) as the report says it."""
    if not isinstance(status, dict) or not isinstance(status.get("in_use"), bool):
        return "unknown (a receiver older than this report)"
    if status["in_use"]:
        return "in use: received files are verified from their blocks as they land"
    return f"not in use ({status.get('why_not')}): one read-back per received file"


def render(doc: dict[str, Any]) -> str:
    """The human report: measurements, both ends side by side, key files, ADVICE, VERDICT."""
    lines = [f"fstream doctor: {doc['destination']}"]

    def row(label: str, value: str) -> None:
        lines.append(f"  {label:<16}{value}".rstrip())

    if "rtt" in doc:
        _measurements(doc, row)
    if "rtt" in doc:  # issue 39: the receiver verifies without reading files back, or not (and why)
        row("native hashing", f"receiver: {native_text(doc['receiver'].get('native_hashing'))}")
    row("native hashing" if "rtt" not in doc else "", f"this host: {native_text(doc.get('native_hashing'))}")
    for s in doc.get("secrets", []):
        row(s["what"], f"{s['path']} (mode {s['mode']}{'' if s['ok'] else ': group or others may read it'})")
    advice = doc.get("advice") or []
    if advice or doc.get("verdict"):
        lines += ["", "ADVICE" if advice else "ADVICE: nothing to change"]
    for a in advice:
        lines += textwrap.wrap(f"[{a['severity']}] {a['code']} ({a['side']}): {a['text']}", 112,
                               initial_indent="  ", subsequent_indent="      ")
        if a.get("settings"):
            where = {"receiver": " (on the receiver)", "sender": " (on this host)"}.get(a["side"], "")
            lines.append("      sysctl -w " + " ".join(f"{k}={shlex.quote(v)}" for k, v in a["settings"].items())
                         + f"{where}; persist it in /etc/sysctl.d/")
    if doc.get("verdict"):
        lines += ["", f"VERDICT: {doc['verdict']}: {doc['reason']}"]
    return "\n".join(lines)
