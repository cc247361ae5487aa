"""The pure half of ``fstream bench trust``: run order, summary, ratios to ``hmac``, the report text.

A *run* is one ``fstream send`` of one case with one mode: a dict with ``where`` ("loopback",
"wan"), ``case``, ``mode``, ``rep`` (the round), ``ok``, ``bytes``, ``files``, ``verified_files``,
``wall_s``, ``bps`` (the agent's own throughput) and both sides' CPU-seconds ``tx_cpu_s`` (the
sender) and ``rx_cpu_s`` (the receiver). Every run is kept in the result; the summary is the
median and the range over all successful runs of a cell, and a ratio to ``hmac`` is taken within
one round (the mode's run against the ``hmac`` run of the same case in the same round, minutes
apart at most), then summarised the same way.
"""

from __future__ import annotations

import statistics
from typing import Callable, Iterable

#: Every mode the agent offers, in the order each round runs them.
MODES = ("hmac", "hmac+encrypt", "tls", "hmac --no-verify")
BASE = "hmac"


def schedule(cases: list[str], modes: list[str] | tuple[str, ...], repeat: int) -> list[tuple[int, str, str]]:
    """(round, case, mode) in the order they run: per round, per case, every mode in turn
    (A B C D, A B C D, ...), so a slow minute of the machine falls on every mode alike."""
    return [(rep, case, mode) for rep in range(repeat) for case in cases for mode in modes]


def spread(xs: Iterable[float]) -> dict | None:
    """Median, min, max and count of ``xs``; None when there are none."""
    xs = [float(x) for x in xs]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def per_gb(r: dict, key: str) -> float:
    """CPU-seconds ``r[key]`` per GB (1e9 bytes) the run moved."""
    return r[key] / (r["bytes"] / 1e9)


#: name -> value of one run; each is summarised per cell and, as a ratio, against ``hmac``
METRICS: dict[str, Callable[[dict], float]] = {
    "bps": lambda r: r["bps"],
    "tx_cpu_per_gb": lambda r: per_gb(r, "tx_cpu_s"),
    "rx_cpu_per_gb": lambda r: per_gb(r, "rx_cpu_s"),
    "cpu_per_gb": lambda r: (r["tx_cpu_s"] + r["rx_cpu_s"]) / (r["bytes"] / 1e9),
    # CPU-seconds per wall second: how many cores a side kept busy (1.0 = one core saturated)
    "tx_busy": lambda r: r["tx_cpu_s"] / r["wall_s"],
    "rx_busy": lambda r: r["rx_cpu_s"] / r["wall_s"],
}
RATIOS = ("bps", "cpu_per_gb", "tx_cpu_per_gb", "rx_cpu_per_gb")


def _good(r: dict) -> bool:
    return bool(r.get("ok")) and r.get("bytes", 0) > 0 and r.get("wall_s", 0) > 0


def paired_ratios(runs: list[dict], where: str, case: str, mode: str, metric: str, base: str = BASE) -> list[float]:
    """``metric(mode's run) / metric(base's run)`` for every round where both succeeded."""
    f = METRICS[metric]
    by_rep: dict[str, dict[int, dict]] = {mode: {}, base: {}}
    for r in runs:
        if _good(r) and r["where"] == where and r["case"] == case and r["mode"] in by_rep:
            by_rep[r["mode"]][r["rep"]] = r
    a, b = by_rep[mode], by_rep[base]
    return [f(a[i]) / f(b[i]) for i in sorted(a) if i in b and f(b[i])]


def _order(runs: list[dict]) -> list[tuple[str, str]]:
    seen: dict[tuple[str, str], None] = {}
    for r in runs:
        seen.setdefault((r["where"], r["case"]), None)
    return list(seen)


def summarise(runs: list[dict], goodput_bps: dict[str, float] | None = None) -> list[dict]:
    """One cell per (where, case, mode), in run order and ``MODES`` order: every metric's spread over
    the successful runs, the ratios to ``hmac`` within each round, and for a ``where`` with a known
    path goodput the share of it each run reached (``of_path``)."""
    goodput_bps = goodput_bps or {}
    out = []
    for where, case in _order(runs):
        here = [r for r in runs if r["where"] == where and r["case"] == case]
        modes = sorted({r["mode"] for r in here}, key=lambda m: (MODES.index(m) if m in MODES else len(MODES), m))
        for mode in modes:
            mine = [r for r in here if r["mode"] == mode]
            good = [r for r in mine if _good(r)]
            cell: dict = {"where": where, "case": case, "mode": mode, "runs": len(good),
                          "failed": len(mine) - len(good),
                          "verified": all(r.get("verified_files") == r.get("files") for r in good)
                          if "--no-verify" not in mode else None}
            for name, f in METRICS.items():
                cell[name] = spread(f(r) for r in good)
            if where in goodput_bps:
                cell["of_path"] = spread(r["bps"] / goodput_bps[where] for r in good)
            cell["vs_" + BASE] = ({m: spread(paired_ratios(runs, where, case, mode, m)) for m in RATIOS}
                                  if mode != BASE else None)
            out.append(cell)
    return out


# ---- the report ------------------------------------------------------------------------------------

def _mr(s: dict | None, scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    """``median (min–max)``, or ``median`` alone for one run; ``–`` for none."""
    if not s:
        return "–"
    m = fmt.format(s["median"] / scale)
    if s["n"] == 1:
        return m
    return f"{m} ({fmt.format(s['min'] / scale)}–{fmt.format(s['max'] / scale)})"


def table(summary: list[dict]) -> list[str]:
    """The markdown table of a summary: one row per cell."""
    lines = ["| where | case | mode | runs | Gbit/s, median (min–max) | / hmac, per round | sender CPU-s per GB "
             "| receiver CPU-s per GB | both CPU-s per GB | both per GB / hmac, per round "
             "| busy cores, sender / receiver |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in summary:
        vs = c.get("vs_" + BASE)
        name = c["mode"] + ("" if c["verified"] in (True, None) else " (NOT VERIFIED)")
        runs = f"{c['runs']}" + (f" ({c['failed']} failed)" if c["failed"] else "")
        gbit = _mr(c["bps"], 1e9)
        if c.get("of_path"):
            gbit += f"; {_mr(c['of_path'])} of the path"
        busy = f"{_mr(c['tx_busy'])} / {_mr(c['rx_busy'])}"
        lines.append(f"| {c['where']} | {c['case']} | {name} | {runs} | {gbit} | "
                     f"{_mr(vs['bps']) if vs else '1'} | {_mr(c['tx_cpu_per_gb'])} | {_mr(c['rx_cpu_per_gb'])} | "
                     f"{_mr(c['cpu_per_gb'])} | {_mr(vs['cpu_per_gb']) if vs else '1'} | {busy} |")
    return lines


def markdown(doc: dict) -> str:
    """The whole report of a result document (``trust_bench`` writes both)."""
    prov = doc.get("provenance", {})
    m = prov.get("machine", {})
    load = " / ".join(" ".join(f"{x:.2f}" for x in prov[k]) for k in ("load_start", "load_end") if prov.get(k))
    lines = ["# Cost of each authentication mode (issue 8; reworked for issue 26)", "",
             f"Command: `{prov.get('command', '?')}`  ",
             f"Commit: {prov.get('commit', '?')}{' (dirty)' if prov.get('dirty') else ''}, code "
             f"{prov.get('code_hash', '?')[:19]}  ",
             f"Machine: {m.get('nproc', '?')} CPUs ({m.get('cpu', '?')}), kernel {m.get('kernel', '?')}, "
             f"{m.get('date', '?')}; load average at start / end {load or '?'}  ",
             f"Memory: {doc.get('memory', 'not recorded')}  ",
             f"Order: {doc.get('order', '')}  "]
    for where, info in doc.get("sites", {}).items():
        lines.append(f"{where}: {info.get('note', '')}  ")
    lines += ["", *table(doc["summary"]), "",
              "CPU-s per GB: user + system of every thread of a side per 1e9 bytes moved (the sender's start-up "
              "included); busy cores: a side's CPU-seconds per wall second of the run (1.00 = one core saturated); "
              "ratios to hmac: the mode's run over the hmac run of the same case and round, median (min–max) over "
              "rounds.", ""]
    failed = [r for r in doc["runs"] if not r.get("ok")]
    lines += [f"- {r['where']} {r['case']} {r['mode']} round {r['rep']}: failed: {r.get('error', '')[:300]}"
              for r in failed]
    return "\n".join(lines) + "\n"


def wan_buffer(rate_bps: float, rtt_s: float) -> int:
    """The TCP buffer cap for a WAN run: the smallest power of two at least twice the bandwidth-delay
    product (Linux counts socket overhead against the cap, so a stream's window is about half of it),
    and never under 4 MiB. 1 Gbit/s x 40 ms: BDP 5 MB, cap 16 MiB."""
    need = max(4 << 20, int(2 * rate_bps * rtt_s / 8))
    return 1 << (need - 1).bit_length()
