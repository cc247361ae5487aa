"""The oracle: the best fixed (cc, p, pp) per workload batch, found by a grid search on the same path.

Each batch is sent on its own with our agent's ``fixed`` tuner at every grid point; the best
time per batch is kept. The oracle's time for the streaming workload replays the arrivals:
batch k starts at max(its arrival, the end of batch k-1) and takes its best time. This is an
upper bound no single fixed setting reaches (the best setting changes between batches), so
"ratio to oracle" says how close a tuner comes to the best possible with hindsight.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Callable, Sequence

from fstream_bench.peers import fstream as fs_peer
from fstream_bench.peers.base import PeerError, Sites
from fstream_bench.core.workload_gen import Staged

DEFAULT_GRID = {"cc": (1, 4, 8), "p": (1, 4), "pp": (1, 8)}


def replay(arrivals: Sequence[float], best_seconds: Sequence[float]) -> float:
    """Finish time of batches that arrive at ``arrivals`` and take ``best_seconds`` one after another."""
    end = 0.0
    for a, d in zip(arrivals, best_seconds):
        end = max(end, a) + d
    return end


def search(w, staged: Staged, sites: Sites, workdir: Path, sc, *, grid: dict | None = None,
           log: Callable[[str], None] = print) -> dict:
    """Grid-search each batch of ``w`` (already materialised in ``staged``); return the oracle summary."""
    grid = grid or DEFAULT_GRID
    points = list(itertools.product(grid["cc"], grid["p"], grid["pp"]))
    why = fs_peer.available()
    if why:
        return {"error": why}
    best: list[dict] = []
    tried: list[dict] = []
    dst = Path(workdir) / "dst"
    try:
        with fs_peer.FStreamReceiver(sites=sites, workdir=Path(workdir) / "rx", root=dst) as rx:
            for k, batch in enumerate(w.batches):
                top = None
                for i, (cc, p, pp) in enumerate(points):
                    d = f"b{k}-{i}"
                    shutil.rmtree(dst / d, ignore_errors=True)
                    r = fs_peer.send(rx, [staged.staging / f.path for f in batch.files], d, tuner="fixed",
                                     options={"cc": cc, "p": p, "pp": pp}, label=f"oracle-{k}-{i}",
                                     timeout=sc.timeout_s)
                    shutil.rmtree(dst / d, ignore_errors=True)
                    secs = float(r.extra.get("self_seconds") or r.seconds)
                    row = {"batch": k + 1, "cc": cc, "p": p, "pp": pp, "seconds": secs, "ok": r.ok,
                           "error": r.error[:200]}
                    tried.append(row)
                    if r.ok and (top is None or secs < top["seconds"]):
                        top = row
                if top is None:
                    return {"error": f"batch {k + 1}: every grid point failed", "tried": tried}
                best.append(top)
                log(f"oracle: {w.name} batch {k + 1}: best cc={top['cc']} p={top['p']} pp={top['pp']} "
                    f"in {top['seconds']:.2f} s")
    except PeerError as e:
        return {"error": str(e), "tried": tried}
    finally:
        shutil.rmtree(dst, ignore_errors=True)
    seconds = replay([b.t for b in w.batches], [b["seconds"] for b in best])
    return {"seconds": seconds, "throughput_bps": w.total_bytes * 8 / seconds, "best": best, "tried": tried,
            "grid": grid}
