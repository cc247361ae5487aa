"""The WAN benchmark rig the tuning benchmarks share: our own emulated path, its selfcheck, report lines.

``open_bench`` builds a ``WanPath`` under the benchmark's own run id and selfchecks it (or describes a
loopback smoke run); ``send_json`` runs ``fstream send --json`` at the source site and keeps the agent's
full records. Used by ``qos_bench``, ``harp_bench``, ``breakdown_bench`` and ``tuning_wan``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from fstream_bench.peers.base import Sites
from fstream_bench.core.report import machine_info
from fstream_bench.core import RESULTS_DIR

from fstream_provider.model.units import parse_duration, parse_rate


# -- the path ---------------------------------------------------------------------------------------
@dataclass
class Bench:
    """An open test path: where each end runs, its selfcheck, and the ``WanPath`` (None on loopback).

    :param sites: how to run a command at each end.
    :param selfcheck: the testbed's selfcheck of the path (or ``{"path": "loopback"}``).
    :param path: the ``WanPath`` this benchmark built (torn down by :meth:`close`).
    :param bandwidth_bps: what the tuners are told the link is.
    :param rtt_s: what the tuners are told the RTT is.
    """

    sites: Sites
    selfcheck: dict
    path: object | None
    bandwidth_bps: float
    rtt_s: float

    def close(self) -> None:
        if self.path is not None:
            self.path.down()  # only our own run id: never ``down --all``


def add_path_args(ap: argparse.ArgumentParser, run_id: str) -> None:
    """The options every benchmark here shares (path shape, own run id, results directory)."""
    ap.add_argument("--rate", default="1Gbit", help="bottleneck rate (default 1Gbit)")
    ap.add_argument("--rtt", default="40ms", help="round-trip time (default 40ms)")
    ap.add_argument("--buffer", default="1MiB", help="TCP buffer cap (default 1MiB)")
    ap.add_argument("--run-id", default=run_id, help=f"own WAN run id (default {run_id}; never shared)")
    ap.add_argument("--loopback", action="store_true", help="smoke run on 127.0.0.1 (no WAN, no root)")
    ap.add_argument("--force-path", action="store_true", help="measure even if the selfcheck fails (noted)")
    ap.add_argument("--results", default=str(RESULTS_DIR),
                    help="where the result directory goes")
    ap.add_argument("--workdir", default=None, help="scratch directory (default under /dev/shm)")


def result_dirs(args: argparse.Namespace, name: str) -> tuple[Path, Path]:
    """A WAN bench's two directories: ``<--results>/<name>-<UTC stamp>/`` (made) for its result, and ``--workdir``
    or ``/dev/shm/fstream-<name>-<stamp>`` for the run's files."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out = Path(args.results) / f"{name}-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    return out, Path(args.workdir or f"/dev/shm/fstream-{name}-{stamp}")


def write_summary(out: Path, summary: dict, md: str | None = None) -> None:
    """``summary.json`` (every run raw; what JSON cannot hold as its text) in a result directory, and ``report.md``
    beside it when given: after every run (a run cut short keeps what it measured) and at the end."""
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    if md is not None:
        (out / "report.md").write_text(md)


def open_bench(args, log=print) -> Bench:
    """Build our own WAN path (``--run-id``) and selfcheck it, or describe loopback."""
    bw, rtt = parse_rate(args.rate), parse_duration(args.rtt)
    if args.loopback:
        return Bench(Sites(), {"path": "loopback"}, None, bw, rtt)
    if os.geteuid() != 0:
        raise SystemExit("the emulated WAN needs root (network namespaces); use --loopback for a smoke run")
    from fstream_bench.wan import netns
    from fstream_bench.wan.path import WanConfig, WanPath
    from fstream_bench.wan.selfcheck import selfcheck

    path = WanPath(WanConfig.from_text(rate=args.rate, rtt=args.rtt, buffer=args.buffer, run_id=args.run_id))
    path.up()
    try:
        check: dict = {}
        for attempt in range(3):
            check = selfcheck(path, duration=3.0, raise_on_failure=False)
            if check.get("ok", True) and not check.get("failures"):
                break
            log(f"selfcheck attempt {attempt + 1} failed: {json.dumps(check.get('failures', check))[:300]}")
        else:
            if not args.force_path:
                raise SystemExit(f"WAN selfcheck failed 3 times: {json.dumps(check)[:600]} (use --force-path)")
            check = {**check, "forced": True}
        sites = Sites(src_host=path.src_ip, dst_host=path.dst_ip,
                      src_prefix=tuple(netns.ns_exec_argv(path.src_ns, [])),
                      dst_prefix=tuple(netns.ns_exec_argv(path.dst_ns, [])), name="wan")
    except BaseException:
        path.down()
        raise
    return Bench(sites, check, path, bw, rtt)


def selfcheck_line(check: dict) -> str:
    """One line for the top of a report."""
    if check.get("path") == "loopback":
        return "selfcheck: loopback smoke run (no WAN path, numbers are not WAN measurements)"
    keep = {k: check.get(k) for k in ("ok", "failures", "rtt_ms", "parallel", "parallel_bps", "expected_goodput_bps",
                                       "rate_ratio", "single_stream_bps", "cc", "load_before", "load_after",
                                       "forced") if k in check}
    if not keep:
        keep = check
    return "selfcheck: " + json.dumps(keep, default=str)


def machine_line() -> str:
    m = machine_info()
    return (f"machine: nproc {m['nproc']}, {m['cpu']}, kernel {m['kernel']}, load average {m['loadavg']}, "
            f"{m['date']}")


def concurrent_benchmarks() -> list[str]:
    """Other benchmark processes running now (``fstream_bench.cli run`` etc.), for the report."""
    out = []
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = " ".join(a.decode(errors="replace") for a in argv if a)
        if "fstream_bench.cli run" in text or ("fstream_bench." in text and "_bench" in text and
                                                "qos_bench" not in text and "breakdown_bench" not in text):
            out.append(f"{d.name}: {text[:160]}")
    return out



@dataclass
class SendRun:
    """One ``fstream send --json``: status, wall time and the agent's full JSON records.

    :param ok: exit status 0, JSON printed, no failed files.
    :param error: why not (with the log tail).
    :param seconds: wall time of the process.
    :param self_seconds: the agent's own ``seconds``.
    :param self_throughput_bps: the agent's own ``throughput_bps``.
    :param intervals: the agent's interval records, unabridged.
    :param tuning: the agent's tuning decisions.
    :param doc: the whole JSON object.
    """

    ok: bool
    error: str
    seconds: float
    self_seconds: float | None
    self_throughput_bps: float | None
    intervals: list
    tuning: list
    doc: dict


def send_json(sites: Sites, rx, sources: list[Path], dest: str, *, tuner: str, options: dict,
              watch: dict | None = None, label: str, timeout: float) -> SendRun:
    """``fstream send SOURCES --to URL --tuner T [options] --json`` at the source site; keep the full JSON.

    (``fstream_bench.peers.fstream.send`` keeps only a few fields of each interval record; the
    QoS error needs ``dt`` and ``bytes``.)
    """
    from fstream_bench.peers.base import PeerError, log_tail, run_timed
    from fstream_bench.peers.fstream import _last_json, send_argv

    argv = send_argv(rx.url(dest), rx.secret, sources, tuner, options, watch)
    log = rx.workdir / f"{label}.log"
    env = {**os.environ, "FSTREAM_STATE_DIR": str(rx.workdir / "state-send")}
    try:
        status, wall, out = run_timed(sites.argv("src", argv), timeout, log, env=env)
    except PeerError as e:
        return SendRun(False, str(e), timeout, None, None, [], [], {})
    doc = _last_json(out) or {}
    failed = doc.get("failed_files", 0)
    nfailed = len(failed) if isinstance(failed, list) else int(failed or 0)
    ok = status == 0 and bool(doc) and nfailed == 0
    err = "" if ok else f"status {status}, failed files {nfailed}, error {doc.get('error')!r}: {log_tail(log, 400)}"
    return SendRun(ok, err, wall, doc.get("seconds"), doc.get("throughput_bps"), list(doc.get("intervals", [])),
                   list(doc.get("tuning", [])), doc)
