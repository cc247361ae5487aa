"""The HARP benchmark's arithmetic (issue 26 item 2): total times and like-with-like windows from interval records.

All times are on one clock per run: seconds since the sender started the transfer (the agent's interval
records; each record covers ``[t - dt, t]`` and counts the bytes written to channels in it). For every
tuner alike:

- **first byte** (``first_byte_t``): inside the first record that carries bytes, at ``t - bytes / rate``
  where ``rate`` is the next record's rate (so a constant rate is located exactly, whatever the start-up
  delay), never before the record's start. Connection set-up and a tuner's start-up before it are not
  data time.
- **last byte landed** (``last_byte_t``): the end of the last record; the sender writes it when its loop
  ends, i.e. once every file is committed at the receiver.
- **total time** = last byte landed - first byte. HARP's sample transfer is inside it.
- **first window**: the rate over ``[first byte, first byte + W]``, the same ``W`` for every tuner (cut at
  the last byte when the transfer is shorter; ``first_window_s`` says how much was covered).
- **allocation-offset window** (HARP's settings against the others at the same stage): per repeat,
  ``a`` = HARP's allocation - HARP's first byte; every tuner of that repeat is measured over
  ``[its first byte + a, its first byte + a + W]``.

Records are not evenly spaced (the sender writes none while it opens channels), so a window counts each
record with the share of its bytes that falls inside it (``window_bytes``), the first data record's bytes
spread over ``[first byte, t]`` only (``from_first_byte``). The resolution is the sender's sample interval:
at 0.1 s two identical slow-start ramps shifted by different start-up delays give first windows within
~2 % of each other (tests/test_bench_harp.py); at 0.5 s they spread by ~17 %.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict

#: ratios within a repeat: (numerator tuner, denominator tuner)
#: ratios within a repeat; ``harp@default-sample-pays`` is the ablation: the paper's sample on every chunk
#: and ``harp-no-history`` HARP's chunks at the heuristic without any history (what the model adds)
PAIRS = (("harp", "static"), ("fstream+harp", "fstream"), ("harp@default-sample-pays", "static"),
         ("harp-no-history", "static"))


def window_bytes(intervals: list[dict], start: float, end: float) -> float:
    """Bytes in ``[start, end]``: each record counts with the share of its duration inside the window."""
    got = 0.0
    for r in intervals:
        dt = r.get("dt") or 0.0
        a, b = r["t"] - dt, r["t"]
        overlap = min(b, end) - max(a, start)
        if dt > 0 and overlap > 0:
            got += r["bytes"] * overlap / dt
    return got


def window_bps(intervals: list[dict], start: float, seconds: float) -> float:
    """Rate over ``[start, start + seconds]`` (bits/s), divided by the full ``seconds``."""
    return window_bytes(intervals, start, start + seconds) * 8 / seconds if seconds > 0 else 0.0


def first_byte_t(intervals: list[dict]) -> float | None:
    """When data starts (see the module text); None when no record carries bytes."""
    recs = [r for r in intervals if (r.get("dt") or 0) > 0]
    for i, r in enumerate(recs):
        if r["bytes"] <= 0:
            continue
        start = r["t"] - r["dt"]
        nxt = recs[i + 1] if i + 1 < len(recs) else None
        if nxt is not None and nxt["bytes"] > 0:
            return max(start, r["t"] - r["bytes"] * nxt["dt"] / nxt["bytes"])
        return start
    return None


def from_first_byte(intervals: list[dict]) -> list[dict]:
    """The records from the first byte on, the first one starting at the first byte (its bytes are spread
    over ``[first byte, t]``, not over the start-up before it); [] without data."""
    fb = first_byte_t(intervals)
    if fb is None:
        return []
    recs = [r for r in intervals if (r.get("dt") or 0) > 0 and r["t"] > fb]
    if recs and recs[0]["t"] - recs[0]["dt"] < fb:
        recs[0] = {**recs[0], "dt": recs[0]["t"] - fb}
    return recs


def last_byte_t(intervals: list[dict]) -> float | None:
    """The end of the last record: every file committed (None without records)."""
    return intervals[-1]["t"] if intervals else None


def aligned_window(intervals: list[dict], start: float, seconds: float) -> tuple[float, float]:
    """(bits/s, seconds covered) over ``[start, start + seconds]`` cut at the last byte landed."""
    last = last_byte_t(intervals)
    covered = min(seconds, (last if last is not None else start) - start)
    if covered <= 0:
        return 0.0, 0.0
    return window_bytes(intervals, start, start + covered) * 8 / covered, covered


def harp_times(tuning: list[dict]) -> tuple[float | None, str]:
    """(time of HARP's channel allocation, its reason); (None, "") when it never allocated."""
    for d in tuning:
        r = d.get("reason", "")
        if r.startswith("harp:") and re.search(r"(?:^harp: |; )start ", r):
            return d["t"], r
    return None, ""


def run_metrics(intervals: list[dict], tuning: list[dict], tuner: str, window_s: float) -> dict:
    """One run's aligned numbers (all seconds on the run's own clock unless named ``*_after_first_byte``)."""
    fb, last = first_byte_t(intervals), last_byte_t(intervals)
    out: dict = {"first_byte_s": fb, "last_byte_s": last, "total_s": None, "bytes": sum(r["bytes"] for r in intervals),
                 "total_bps": None, "first_window_bps": None, "first_window_s": 0.0, "alloc_s": None,
                 "alloc_after_first_byte_s": None, "harp_reason": ""}
    if fb is None or last is None or last <= fb:
        return out
    out["total_s"] = last - fb
    out["total_bps"] = out["bytes"] * 8 / out["total_s"]
    data = from_first_byte(intervals)
    out["first_window_bps"], out["first_window_s"] = aligned_window(data, fb, window_s)
    if tuner.partition("@")[0] in ("harp", "harp-no-history"):
        alloc, why = harp_times(tuning)
        out["harp_reason"] = why
        if alloc is not None:
            out["alloc_s"] = alloc
            out["alloc_after_first_byte_s"] = max(0.0, alloc - fb)
            sample = window_bytes(data, fb, alloc)
            after = window_bytes(data, alloc, last)
            out["sample_bytes"] = sample
            out["sample_bps"] = sample * 8 / max(alloc - fb, 1e-3)
            out["after_bps"] = after * 8 / max(last - alloc, 1e-3)
    return out


def amortisation_bytes(thr0: float, thr_h: float, thr_s: float, ds: float, c: float) -> float | None:
    """Smallest dataset (bytes) for which Eq. 7's t_H beats Eq. 6's t_0; None when HARP is not faster."""
    if thr_h <= thr0 or thr_s <= 0:
        return None
    b0, bh, bs = 8 / thr0, 8 / thr_h, 8 / thr_s  # seconds per byte
    return max(0.0, (ds * (bs - bh) + c) / (b0 - bh))


def stats(xs: list[float]) -> dict:
    """Median, range and every value (in run order)."""
    xs = [float(x) for x in xs]
    if not xs:
        return {"n": 0, "median": None, "min": None, "max": None, "all": []}
    return {"n": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs), "all": xs}


def med_range(s: dict, fmt: str = "{:.2f}", scale: float = 1.0) -> str:
    """``median (min–max, n runs)`` of a ``stats`` dict: every run, never a chosen one."""
    if not s or not s.get("n"):
        return "-"
    m = fmt.format(s["median"] * scale)
    if s["n"] == 1:
        return f"{m} (1 run)"
    return f"{m} ({fmt.format(s['min'] * scale)}–{fmt.format(s['max'] * scale)}, {s['n']} runs)"


def summarize(runs: list[dict], window_s: float, bandwidth_bps: float = 1e9) -> list[dict]:
    """Per (dataset, condition): each tuner's totals and windows over all its ok repeats, and ratios within repeats.

    ``runs`` are the benchmark's run records (``dataset``, ``condition``, ``tuner``, ``ok``, ``repeat``,
    ``intervals``, ``tuning``); the aligned numbers are recomputed from the records, so an older
    summary.json is read the same way.
    """
    cases: dict[tuple[str, str], dict[int, dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
    failed: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in runs:
        key = (r["dataset"], r["condition"])
        cases[key]  # keep the case even when every run of it failed
        if not r.get("ok"):
            failed[key].append(f"{r['tuner']} (repeat {r.get('repeat', 0)})")
            continue
        m = run_metrics(r.get("intervals", []), r.get("tuning", []), r["tuner"], window_s)
        if m["total_s"] is None:
            failed[key].append(f"{r['tuner']} (repeat {r.get('repeat', 0)}: no data)")
            continue
        cases[key][r.get("repeat", 0)][r["tuner"]] = {**m, "data": from_first_byte(r.get("intervals", []))}
    out = []
    for (dataset, condition), reps in cases.items():
        tuners = list(dict.fromkeys(t for rep in reps.values() for t in rep))
        per_tuner: dict[str, dict] = {}
        at_alloc: dict[int, dict[str, float]] = {}  # repeat -> tuner -> rate at HARP's allocation offset
        for t in tuners:
            ks = [k for k in sorted(reps) if t in reps[k]]
            ms = [reps[k][t] for k in ks]
            per_tuner[t] = {"repeats": ks,
                            "total_s": stats([m["total_s"] for m in ms]),
                            "total_bps": stats([m["total_bps"] for m in ms]),
                            "first_byte_s": stats([m["first_byte_s"] for m in ms]),
                            "first_window_bps": stats([m["first_window_bps"] for m in ms])}
        alloc_offsets, amort, never = [], [], 0
        for k in sorted(reps):
            hp, st = reps[k].get("harp"), reps[k].get("static")
            if not hp or hp["alloc_after_first_byte_s"] is None:
                continue
            a = hp["alloc_after_first_byte_s"]
            alloc_offsets.append(a)
            at_alloc[k] = {t: aligned_window(m["data"], m["first_byte_s"] + a, window_s)[0]
                           for t, m in reps[k].items()}
            if st and hp.get("sample_bps"):
                d = amortisation_bytes(st["total_bps"], hp["after_bps"], hp["sample_bps"], hp["sample_bytes"], 0.0)
                if d is None:
                    never += 1
                else:
                    amort.append(d / (bandwidth_bps / 8))
        for t in tuners:
            per_tuner[t]["alloc_offset_window_bps"] = stats([v[t] for v in at_alloc.values() if t in v])
        ratios = {}
        for num, den in PAIRS:
            both = [k for k in sorted(reps) if num in reps[k] and den in reps[k]]
            for field, name in (("total_s", "total"), ("first_window_bps", "first_window")):
                ratios[f"{num}/{den} {name}"] = stats(
                    [reps[k][num][field] / reps[k][den][field] for k in both if reps[k][den][field]])
        ratios["harp/static alloc_offset_window"] = stats(
            [v["harp"] / v["static"] for v in at_alloc.values() if "static" in v and v["static"]])
        out.append({"dataset": dataset, "condition": condition, "tuners": per_tuner, "ratios": ratios,
                    "harp_alloc_after_first_byte_s": stats(alloc_offsets),
                    "amortisation_bw_seconds": stats(amort), "amortisation_never": never,
                    "failed": failed.get((dataset, condition), [])})
    return out
