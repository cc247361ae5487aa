"""HARP as the paper writes it beside ours, in the simulator, against the same grid oracle (issue #16).

Pure compute, returns rows; the path, storage and the simulator's calibration are ``ablation``'s.

*History* is what ``fstream calibrate`` would record on this path (§III-B's experiment sets): per
chunk type, a probe dataset of the chunk's file size (``harp_history.SIZE_OF_CHUNK`` x BDP, about
``probe_s`` seconds of data) moved with every setting of ``fstream calibrate``'s grid (120 settings, a
cubic needs 20), one pass per background load in ``LOADS`` (the paper's groups differ in background traffic),
each rate the steady rate (start-up excluded) with a seeded multiplicative noise of ``noise``.

*Evaluation*: each backlogged workload runs under a constant background (one of the calibration
loads and one between them) with ``harp`` in the ``paper`` variant, each departure alone and the
default, and ``fstream``'s default; each is reported as a fraction of the grid oracle under the same
background (``ablation.oracle``).
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

from fstream_provider.tuning.ablation import ORACLE_GRID, SIM_KW, Setup, oracle
from fstream_provider.tuning.base import FileInfo
from fstream_provider.tuning.fixed import FixedTuner
from fstream_provider.tuning.fstream import FStreamTuner
from fstream_provider.tuning.harp import HarpTuner
from fstream_provider.tuning.harp_history import CALIBRATION_GRID, CHUNKS, SIZE_OF_CHUNK, HistoryRow, chunk_of, to_frame
from fstream_provider.tuning.variants import HARP_PAPER, HARP_SWITCHES, HarpVariant
from fstream_provider.tuning.workloads import Batch, Workload

CAL_GRID = tuple(CALIBRATION_GRID[k] for k in ("cc", "p", "pp"))  # ``fstream calibrate``'s grid
LOADS = (0.0, 300e6, 600e6)  # background traffic of each calibration pass, bits/s
EVAL_LOADS = (0.0, 450e6)  # one load the history has, one between two it has
MAX_LARGE = 256 * 2**20


def calibration_history(setup: Setup = Setup(), *, loads=LOADS, grid=CAL_GRID, probe_s: float = 1.0,
                        noise: float = 0.03, seed: int = 0) -> Any:
    """The rows a calibration sweep would record on ``setup.path``, as a ``harp_history`` DataFrame."""
    path = setup.path
    bdp = path.bandwidth_bps * path.rtt_s / 8
    rng = random.Random(seed)
    rows = []
    for chunk in CHUNKS:
        size = int(min(SIZE_OF_CHUNK[chunk] * bdp, MAX_LARGE))
        if chunk_of(size, bdp) != chunk:
            continue
        count = max(4, math.ceil(probe_s * path.bandwidth_bps / 8 / size))
        w = Workload(f"cal-{chunk}", [Batch(0.0, [FileInfo(f"c{i}.dat", size, "dat") for i in range(count)])])
        for k, load in enumerate(loads):
            for cc, p, pp in itertools.product(*grid):
                r = setup.run(FixedTuner(cc=min(cc, count), p=p, pp=pp), w, background_bps=load)
                steady = max(r.total_time_s - SIM_KW["startup_s"], 1e-3)
                bps = r.total_bytes * 8 / steady * rng.uniform(1 - noise, 1 + noise)
                rows.append(HistoryRow("sim", "sim:1", path.bandwidth_bps, path.rtt_s, path.tcp_buffer, chunk,
                                       float(size), count, min(cc, count), p, pp, min(bps, path.bandwidth_bps),
                                       1e6 + k * 7200.0, steady, f"calibrate:sim:{chunk}:load{k}", "probe"))
    return to_frame(rows)


def harp_variants() -> dict[str, HarpVariant]:
    """paper, paper + each departure alone, default."""
    out = {"harp paper": HARP_PAPER}
    for sw in HARP_SWITCHES:
        out[f"harp paper+{sw}"] = HarpVariant(frozenset({sw}))
    out["harp default"] = HarpVariant()
    return out


def harp_rows(setup: Setup = Setup(), *, workloads=("w1", "w3", "sra", "lcls"), loads=EVAL_LOADS,
              history: Any = None, grid=ORACLE_GRID) -> list[dict]:
    """One row per (workload, background, tuner): throughput, fraction of the oracle, the decision's reason."""
    history = calibration_history(setup) if history is None else history
    rows = []
    for name, load in itertools.product(workloads, loads):
        w = setup.workload(name, "backlogged")
        best, note = oracle(setup, w, grid, background_bps=load)
        tuners: dict[str, Any] = {label: HarpTuner(path=setup.path, history=history, variant=v)
                                  for label, v in harp_variants().items()}
        tuners["fstream default"] = FStreamTuner(path=setup.path)
        for label, tuner in tuners.items():
            r = setup.run(tuner, w, background_bps=load)
            reason = next((iv["reason"] for iv in r.intervals if "->" in str(iv.get("reason", ""))), "")
            rows.append({"workload": name, "background_bps": load, "tuner": label, "throughput_bps": r.throughput_bps,
                         "of_oracle": r.throughput_bps / best if best else 0.0, "oracle_bps": best, "oracle": note,
                         "seconds": r.total_time_s, "reason": reason})
    return rows
