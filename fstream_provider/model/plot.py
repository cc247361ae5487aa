"""The transfer plot: throughput vs target, channels and streams per cluster, files pending, tuner decisions.

Pure rendering (no Airflow, no Redis): :func:`render_plot` builds a matplotlib ``Figure`` (Agg, no display)
and :func:`plot_png` gives its PNG bytes, so the Airflow face can write them wherever ``plot_dir`` points
(``ObjectStoragePath``: local, ``file://``, ``s3://``, ...). :func:`save_plot` keeps the old local-path API.
"""

from __future__ import annotations

import io
import os
from typing import Any

from fstream_provider.model.intervals import fold_slivers

PANELS = ("throughput", "channels", "pending")
HEADROOM = 0.15  # the throughput panel's top: this much above the highest line (target or throughput)
PLOT_MOUNT = "/fstream"  # where the provider's Airflow plugin serves plots (``fstream_provider.ui``)


def plot_route(dag_id: str, run_id: str, task_id: str, map_index: int | str) -> str:
    """The path of a task instance's plot on the Airflow api-server (each part URL-quoted)."""
    from urllib.parse import quote

    parts = "/".join(quote(str(p), safe="") for p in (dag_id, run_id, task_id, map_index))
    return f"{PLOT_MOUNT}/plot/{parts}.png"


def _num(v: Any, default: float = 0.0) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def _clusters(rec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{cluster: {"cc","p","pp",...}}`` of an interval; one pseudo-cluster ``all`` when it has none."""
    c = rec.get("clusters")
    if isinstance(c, dict) and c:
        return {str(k): v for k, v in c.items() if isinstance(v, dict)}
    if isinstance(c, list) and c:
        return {str(v.get("name") or v.get("cluster") or f"c{i}"): v for i, v in enumerate(c) if isinstance(v, dict)}
    return {"all": {"cc": rec.get("cc"), "p": rec.get("p"), "pp": rec.get("pp")}}


def layout_key(rec: dict[str, Any]) -> tuple:
    """The per-cluster layout of an interval, comparable between intervals (a change = a tuner decision)."""
    return tuple(sorted((k, int(_num(v.get("cc"))), int(_num(v.get("p"))), int(_num(v.get("pp"))))
                        for k, v in _clusters(rec).items()))


def decisions(intervals: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """``(t, reason)`` at every interval whose per-cluster layout differs from the one before."""
    out = []
    for prev, rec in zip(intervals, intervals[1:]):
        if layout_key(prev) != layout_key(rec):
            out.append((_num(rec.get("t")), str(rec.get("reason") or "settings changed")))
    return out


def _short(text: str, n: int = 28) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def render_plot(intervals: list[dict[str, Any]], target_bps: float | None = None, title: str = "FStream transfer"):
    """A 3-panel ``Figure`` sharing the time axis, or ``None`` without intervals or matplotlib.

    Panels: throughput (Mbit/s) and the target; channels (cc) and TCP streams (cc×p) per cluster, with
    integer ticks; files pending. A dotted vertical line marks each tuner decision in every panel, with
    its reason (shortened, numbered; the full text is in the task log) on the throughput panel. A last sliver
    is folded into the interval before it (``model.intervals``), as the log and the live views show it.
    """
    if not intervals:
        return None
    intervals = fold_slivers(intervals)
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return None
    t = [_num(r.get("t")) for r in intervals]
    fig = Figure(figsize=(9, 7.5))
    ax_tp, ax_ch, ax_pend = fig.subplots(3, 1, sharex=True)
    ax_tp.plot(t, [_num(r.get("throughput_bps")) / 1e6 for r in intervals], color="tab:blue", marker=".",
               label="throughput")
    if target_bps:
        ax_tp.axhline(target_bps / 1e6, color="tab:red", linestyle="--", label="target")
    ax_tp.set_ylabel("Mbit/s")
    top = max([_num(r.get("throughput_bps")) / 1e6 for r in intervals] + [(target_bps or 0) / 1e6])
    ax_tp.set_ylim(bottom=0, top=top * (1 + HEADROOM) if top > 0 else None)  # lines never on the frame
    ax_tp.set_title(title)
    names = sorted({k for r in intervals for k in _clusters(r)})
    for i, name in enumerate(names):
        color = f"C{(i + 2) % 10}"
        cc = [_num(_clusters(r).get(name, {}).get("cc")) for r in intervals]
        streams = [_num(_clusters(r).get(name, {}).get("cc")) * max(1.0, _num(_clusters(r).get(name, {}).get("p"), 1))
                   if name in _clusters(r) else 0.0 for r in intervals]
        ax_ch.step(t, cc, where="post", color=color, label=f"{name} channels")
        ax_ch.step(t, streams, where="post", color=color, linestyle=":", label=f"{name} streams")
    ax_ch.set_ylabel("channels / streams")
    ax_ch.set_ylim(bottom=0)
    ax_ch.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_pend.step(t, [_num(r.get("files_pending")) for r in intervals], where="post", color="tab:purple",
                 label="files pending")
    ax_pend.set_ylabel("files pending")
    ax_pend.set_ylim(bottom=0)
    ax_pend.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_pend.set_xlabel("elapsed (s)")
    for n, (td, reason) in enumerate(decisions(intervals), 1):
        for ax in (ax_tp, ax_ch, ax_pend):
            ax.axvline(td, color="grey", linestyle=":", linewidth=0.8)
        ax_tp.annotate(f"{n}: {_short(reason)}", xy=(td, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                       va="top", ha="right", fontsize="x-small", color="dimgrey")
    for ax in (ax_tp, ax_ch, ax_pend):
        ax.legend(loc="upper left", fontsize="x-small")
    fig.tight_layout()
    return fig


def plot_png(intervals: list[dict[str, Any]], target_bps: float | None = None,
             title: str = "FStream transfer") -> bytes | None:
    """The PNG bytes of :func:`render_plot`, or ``None`` when there is nothing (or no matplotlib) to draw."""
    fig = render_plot(intervals, target_bps, title)
    if fig is None:
        return None
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def save_plot(intervals: list[dict[str, Any]], path: str, target_bps: float | None = None,
              title: str = "FStream transfer") -> str | None:
    """Write the PNG to a local ``path``; return it, or ``None`` without matplotlib/data (CLI and bench use this)."""
    data = plot_png(intervals, target_bps, title)
    if data is None:
        return None
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
    return path
