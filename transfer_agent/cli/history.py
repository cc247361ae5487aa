"""``fstream history export|import|stats|validate|clear``: HARP's transfer history in Redis, through pandas.

``export``/``import`` write and read CSV or Parquet (pyarrow) with ``tuning.harp_history.COLUMNS``; an
import validates every row first and writes nothing if one is bad. ``validate`` prints the paper's
validation accuracy (§IV-A: optimum of 70 % of the groups projected onto each test group's model) and
the Optimizer's prediction and time for a chunk of the path you describe.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from typing import Any

from transfer_agent.cli.redis_auth import add_redis_options

EXIT_OK, EXIT_BAD = 0, 2


def add_history_parser(subparsers: Any) -> argparse.ArgumentParser:
    """One sub-command per action, so options may come before the file (``import --format csv FILE``).

    A flat ``action [file]`` pair lost the file when an option came between them: argparse binds both
    positionals at the first one it meets and then refuses the file as an unrecognized argument.
    """
    common = argparse.ArgumentParser(add_help=False)
    add_redis_options(common, "Redis URL (default: $FSTREAM_REDIS_URL, else the embedded one)")
    common.add_argument("--namespace", default="fstream", help="key namespace (default fstream)")
    fmt = argparse.ArgumentParser(add_help=False)
    fmt.add_argument("--format", choices=("csv", "parquet"), default=None, help="default: from the file name, else csv")
    p = subparsers.add_parser("history", help="HARP's transfer history: export, import, stats, validate, clear")
    acts = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    e = acts.add_parser("export", parents=[common, fmt], help="write every row to a CSV or Parquet file")
    e.add_argument("file", nargs="?", help="the file to write (- for stdout, CSV only); or -o FILE")
    e.add_argument("-o", "--output", metavar="FILE", help="the file to write (same as the FILE argument)")
    i = acts.add_parser("import", parents=[common, fmt], help="append the rows of a CSV or Parquet file "
                                                              "(every row validated first; a bad row: nothing written)")
    i.add_argument("file", help="the file to read")
    st = acts.add_parser("stats", parents=[common], help="rows per chunk and kind, per path, oldest and newest")
    st.add_argument("--json", action="store_true", help="one JSON object")
    c = acts.add_parser("clear", parents=[common], help="delete the whole transfer history")
    c.add_argument("--yes", action="store_true", help="really delete the whole history")
    v = acts.add_parser("validate", parents=[common], help="the paper's validation accuracy (§IV-A) and the "
                                                          "Optimizer's prediction (defaults: the newest row's path)")
    v.add_argument("--chunk", choices=("tiny", "small", "medium", "large"))
    v.add_argument("--bandwidth", metavar="RATE")
    v.add_argument("--rtt", metavar="DURATION")
    v.add_argument("--tcp-buffer", metavar="SIZE")
    v.add_argument("--file-size", metavar="SIZE")
    v.add_argument("--files", type=int)
    v.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=cmd_history)
    return p


def _fmt(path: str | None, given: str | None) -> str:
    if given:
        return given
    return "parquet" if path and path.endswith((".parquet", ".pq")) else "csv"


def cmd_history(args: argparse.Namespace) -> int:
    """Run one action; an unreachable Redis is a clear error (exit 2) naming the URL, not a traceback."""
    import redis

    from fstream_provider.bus.embedded import resolve_redis_url
    try:
        return _run(args)
    except redis.exceptions.ConnectionError as exc:
        raise ValueError(f"Redis {resolve_redis_url(args.redis)!r} not reachable: {exc}") from None


def _run(args: argparse.Namespace) -> int:
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.embedded import resolve_redis_url
    from fstream_provider.bus.keys import Keys
    from fstream_provider.bus.transfer_history import TransferHistory

    if getattr(args, "output", None):
        if args.file and args.file != args.output:
            raise ValueError(f"history export: two files named ({args.file!r} and -o {args.output!r}); give one")
        args.file = args.output
    store = TransferHistory(connect(resolve_redis_url(args.redis)), keys=Keys(args.namespace))
    if args.action in ("export", "import") and not args.file:
        raise ValueError(f"history {args.action}: name the file (e.g. fstream history {args.action} history.csv)")
    fmt = _fmt(getattr(args, "file", None), getattr(args, "format", None))
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401 - pandas' Parquet engine
        except ImportError:
            raise ValueError("Parquet needs pyarrow: pip install 'fstream[analysis]' (or use --format csv)") from None
    if args.action == "export":
        frame = store.frame()
        if args.file == "-":
            print(frame.to_csv(index=False), end="")
        elif fmt == "parquet":
            frame.to_parquet(args.file, index=False)
        else:
            frame.to_csv(args.file, index=False)
        if args.file != "-":
            print(f"exported {len(frame)} row(s) to {args.file} ({fmt})")
        return EXIT_OK
    if args.action == "import":
        return _import(store, args.file, fmt)
    if args.action == "clear":
        if not args.yes:
            raise ValueError("history clear deletes every row: add --yes")
        print(f"removed {store.clear()} row(s) of transfer history")
        return EXIT_OK
    if args.action == "stats":
        return _stats(store, args.json)
    return _validate(store, args)


def _import(store: Any, path: str, fmt: str) -> int:
    import pandas as pd

    from fstream_provider.tuning.harp_history import from_frame

    frame = pd.read_parquet(path) if fmt == "parquet" else pd.read_csv(path)
    try:
        rows = from_frame(frame)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}; nothing imported") from None
    print(f"imported {store.append(rows, now=max((r.time for r in rows), default=None))} row(s) from {path}")
    return EXIT_OK


def _stats(store: Any, as_json: bool) -> int:
    per = collections.Counter()
    paths = collections.Counter()
    first = last = None
    n = 0
    for r in store.iter_rows():
        n += 1
        per[(r.chunk, r.kind)] += 1
        paths[f"{r.source} -> {r.destination}"] += 1
        first = r.time if first is None else min(first, r.time)
        last = r.time if last is None else max(last, r.time)
    doc = {"rows": n, "by_chunk_and_kind": {f"{c}/{k}": v for (c, k), v in sorted(per.items())},
           "paths": dict(paths.most_common()), "oldest": first, "newest": last}
    if as_json:
        print(json.dumps(doc))
        return EXIT_OK
    print(f"{n} row(s) of transfer history" + (f", {time.strftime('%Y-%m-%d %H:%M', time.gmtime(first))} to "
                                               f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(last))} UTC" if n else ""))
    for key, v in doc["by_chunk_and_kind"].items():
        print(f"  {key:<20} {v}")
    for key, v in doc["paths"].items():
        print(f"  {key:<40} {v}")
    return EXIT_OK


def _validate(store: Any, args: argparse.Namespace) -> int:
    from fstream_provider.model.units import parse_duration, parse_rate, parse_size
    from fstream_provider.tuning.harp_model import HarpOptimizer, validation_accuracy
    from fstream_provider.tuning.harp_similarity import HarpRequest

    frame = store.frame()
    if len(frame) == 0:
        raise ValueError("no transfer history to validate (run fstream calibrate, or transfers with --redis)")
    last = frame.iloc[-1]
    req = HarpRequest(
        bandwidth_bps=parse_rate(args.bandwidth) if args.bandwidth else float(last["bandwidth_bps"]),
        rtt_s=parse_duration(args.rtt) if args.rtt else float(last["rtt_s"]),
        tcp_buffer=parse_size(args.tcp_buffer) if args.tcp_buffer else int(last["tcp_buffer"]),
        chunk=args.chunk or str(last["chunk"]),
        avg_file_size=parse_size(args.file_size) if args.file_size else float(last["avg_file_size"]),
        file_count=args.files or int(last["file_count"]))
    opt = HarpOptimizer()
    t0 = time.perf_counter()
    pred = opt.optimize(frame, req, None)
    secs = time.perf_counter() - t0
    val = validation_accuracy(frame, req, optimizer=opt)
    doc = {"request": req.__dict__, "rows": len(frame), "optimizer_seconds": secs,
           "prediction": {"cc": pred.cc, "p": pred.p, "pp": pred.pp, "throughput_bps": pred.throughput_bps,
                          "fallback": pred.fallback, "reason": pred.reason},
           "validation": {k: v for k, v in val.items() if k != "per_group"}}
    if args.json:
        print(json.dumps(doc, default=str))
        return EXIT_OK
    print(f"{req.chunk} chunk, {req.avg_file_size / 1e6:.3g} MB x {req.file_count}, "
          f"{req.bandwidth_bps / 1e9:.3g} Gbit/s, {req.rtt_s * 1e3:.3g} ms: {len(frame)} row(s) of history")
    print(f"optimizer ({secs:.2f} s): {pred.reason}")
    acc = val.get("accuracy")
    print("validation accuracy: " + (f"{acc:.1%} ({val['reason']})" if acc is not None else val["reason"]))
    return EXIT_OK
