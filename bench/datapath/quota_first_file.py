"""First-file latency of a key with a quota on a large subtree (issue 40 item 7): one walk, or the persisted count.

    fstream bench quota-first-file                       # the issue's 1M-file subtree (run it alone)
    fstream bench quota-first-file --files 2000 --repeats 1        # CI-sized (tests/test_bench_quota_first_file.py)
    fstream bench quota-first-file --dir /lustre/scratch/qbench --keep     # on the filesystem in question

A tree of ``--files`` one-byte files (1,000 per directory) is made under ``<dir>/root/q`` (kept between runs with
``--keep``: making 1M files takes minutes). Each repeat starts a real ``Receiver`` on that root, sends one small file
with the real sender under ``q/`` and times the send from its start to its COMMITTED answer, in three modes:

* ``no-quota``: key ``q`` without a quota: the baseline (no counting at all);
* ``first-count``: key ``q`` with a quota and no persisted count (a new root, or after an unclean stop): its first
  OPEN waits for one walk of the subtree;
* ``persisted``: the same after a clean stop of the receiver (``--quota-state`` from the run before): no walk.

The receiver's sweep of orphaned parts at start (a walk of the whole root in the background) is off in every mode,
so only the quota path is measured. Page caches are warm after the tree is made (a cold Lustre client walks slower:
run it there with ``--dir``). Writes ``quota-first-file-<stamp>.json`` (provenance) and its ``.md`` table under
``--results`` (``runstats.write_result``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fstream_bench.core import RESULTS_DIR

MODULES = ("transfer_agent.receiving", "fstream_bench.datapath.quota_first_file")
MODES = ("no-quota", "first-count", "persisted")
PER_DIR = 1000


def make_tree(top: Path, files: int) -> float:
    """``files`` one-byte files under ``top`` (``PER_DIR`` per directory); seconds taken (0 when already there)."""
    marker = top / f".made-{files}"
    if marker.exists():
        return 0.0
    shutil.rmtree(top, ignore_errors=True)
    t0 = time.monotonic()
    for i in range(files):
        d = top / f"d{i // PER_DIR:05d}"
        if i % PER_DIR == 0:
            d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / f"f{i:07d}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, b"x")
        os.close(fd)
    marker.write_text("")
    return time.monotonic() - t0


def first_file(root: Path, secret: Path, state: Path | None, quota: int | None, src: Path, n: int) -> dict:
    """Start a receiver, send one file under ``q/``, stop it cleanly: the send's seconds and the walks done."""
    from fstream_provider.model.spec import TransferSpec
    from transfer_agent.receiving.keyring import Keyring, ReceiverKey
    from transfer_agent.receiving.receiver import Receiver
    from transfer_agent.sending.sender import Transfer
    from transfer_agent.wire.auth import load_secret

    ring = Keyring([ReceiverKey("q", load_secret(secret), "q", quota=quota)])
    rx = Receiver(root=str(root), keyring=ring, part_max_age=None, fsync=False,
                  quota_state=str(state) if state else None).start()
    try:
        spec = TransferSpec.from_options([str(src)], f"fstream://127.0.0.1:{rx.port}/q/new{n}", secret_file=str(secret),
                                         key="q", tuner="fixed")
        t0 = time.monotonic()
        res = Transfer(spec).run()
        dt = time.monotonic() - t0
        used = rx._quotas.used(ring["q"])
        walks = rx._quotas.walks
    finally:
        rx.stop()
    return {"s": dt, "ok": bool(res.ok), "walks": walks, "used": used}


def run(work: Path, files: int, repeats: int) -> dict:
    from transfer_agent.wire.auth import create_secret_file

    root = work / "root"
    made = make_tree(root / "q", files)
    secret = create_secret_file(work / "secret")
    src = work / "one.bin"
    src.write_bytes(b"y" * 4096)
    quota = 1 << 50
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    n = 0
    for r in range(repeats):
        for mode in MODES:
            n += 1
            # first-count: no state yet (one walk); persisted: the state that run's clean stop left (no walk)
            state = None if mode == "no-quota" else work / f"state-{r}.json"
            out = first_file(root, secret, state, None if mode == "no-quota" else quota, src, n)
            runs[mode].append(out)  # (the file sent stays: removed by hand, it would stay counted)
    summary = {m: {"median_s": statistics.median(x["s"] for x in v), "walks": [x["walks"] for x in v],
                   "ok": all(x["ok"] for x in v)} for m, v in runs.items()}
    return {"files": files, "tree_made_s": made, "repeats": repeats, "runs": runs, "summary": summary}


def report(res: dict) -> str:
    lines = [f"first-file latency, {res['files']:,} files under the key's subtree ({res['repeats']} repeat(s))"]
    base = res["summary"]["no-quota"]["median_s"]
    for m in MODES:
        s = res["summary"][m]
        lines.append(f"  {m:12s} {s['median_s'] * 1000:9.1f} ms  ({s['median_s'] / base:5.2f} x no-quota)  "
                     f"walks {s['walks']}  {'ok' if s['ok'] else 'FAILED'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="fstream bench quota-first-file", description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the tree is made (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the tree (and reuse one of the same size)")
    ap.add_argument("--results", default=str(RESULTS_DIR))
    a = ap.parse_args(argv)
    from fstream_bench.core import provenance, runstats

    prov = provenance.start("quota-first-file", argv, MODULES)
    work = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="fstream-quota-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        for old in work.glob("state-*"):
            old.unlink()
        res = {"bench": "quota-first-file", "provenance": prov, **run(work, a.files, a.repeats)}
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    provenance.finish(prov)
    text = report(res)
    out, _md = runstats.write_result(a.results, "quota-first-file", res, text)
    print(text)
    print(f"\nresults: {out}")
    return 0 if all(s["ok"] for s in res["summary"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
