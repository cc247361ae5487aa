"""``fstream top``: an htop-like live view of the bus for people on the DTN without Airflow (issue 27).

Jobs (state, worker, rate with a sparkline of recent rates, files, bytes, lag, ETA with its interval, the
deadline's state, cc/p/pp, the tuner's reason), agents and pools, refreshed every ``--interval`` seconds
from ``fstream_provider.bus.live`` (the same data as the Airflow UI's overview and ``status --json``).

Keys: ``q`` quits; ``s`` cycles the sort (state, rate, eta, lag); up/down (``j``/``k``) move the selection;
Enter opens the selected job's files and recent intervals, Esc/Backspace goes back; ``c`` asks to cancel
the selected job and only ``y`` cancels it. ``render(snapshot, state)`` draws a frame and is pure: it
reads no terminal and no Redis, so tests call it directly. ``--once`` prints one frame and exits, as
``fstream top`` does when its output is not a terminal (a script, a pipe).
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import time
from dataclasses import dataclass
from typing import Any

from fstream_provider.model.live_text import eta_span, lag_span
from fstream_provider.model.units import format_bytes, format_rate
from transfer_agent.cli.exits import EXIT_OK, EXIT_USAGE

SORTS = ("state", "rate", "eta", "lag")
BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 20
REASON_WIDTH = 40
DEADLINE_STYLE = {"on-track": "green", "met": "green", "at-risk": "yellow", "infeasible": "bold red", "missed": "red"}
STATE_STYLE = {"running": "bold green", "queued": "cyan", "preempted": "yellow", "succeeded": "green",
               "failed": "red", "cancelled": "magenta"}
ENDED = ("succeeded", "failed", "cancelled")
KEYS_HELP = "q quit · s sort · ↑↓/j k select · Enter files · Esc back · c cancel"


@dataclass
class TopState:
    """What the person at the terminal chose: the sort, the selected job, the view, a pending confirmation.

    :param sort: one of ``SORTS``.
    :param selected: the selected job's id (kept across refreshes, wherever the sort puts it).
    :param view: ``jobs`` (the overview) or ``job`` (the selected job's files and intervals).
    :param confirm: the job a cancel waits to be confirmed for (``y``), or None.
    :param message: one line shown under the header (what the last action did).
    :param height: the terminal's rows (the job list is cut to fit, around the selection).
    :param to_cancel: the job a confirmed cancel is for (``handle_key`` returned ``cancel``).
    """

    sort: str = "state"
    selected: str | None = None
    view: str = "jobs"
    confirm: str | None = None
    message: str = ""
    height: int = 50
    namespace: str = ""
    detail_job: str | None = None
    to_cancel: str | None = None


# ------------------------------------------------------------------------------------------------ formatting
def sparkline(values: list[float], width: int = SPARK_WIDTH) -> str:
    """The last ``width`` values as block characters, scaled to their maximum ("" without values)."""
    vals = [max(0.0, float(v or 0.0)) for v in values[-width:]]
    if not vals:
        return ""
    top = max(vals)
    if top <= 0:
        return BLOCKS[0] * len(vals)
    return "".join(BLOCKS[min(len(BLOCKS) - 1, int(v / top * (len(BLOCKS) - 1) + 0.5))] for v in vals)


def rate(bps: Any) -> str:
    return format_rate(float(bps)) if bps is not None else "-"


def size(n: Any) -> str:
    return format_bytes(float(n)) if n is not None else "-"


def files_text(row: dict) -> str:
    done, total, failed = row.get("files_done"), row.get("files_total"), row.get("files_failed")
    if done is None and total is None:
        return "-"
    text = f"{done if done is not None else '?'}/{total if total else '?'}"
    return text + (f" ✗{failed}" if failed else "")


def bytes_text(row: dict) -> str:
    done, total = row.get("bytes_done"), row.get("bytes_total")
    if done is None:
        return "-"
    return size(done) + (f"/{size(total)}" if total else "")


def settings_text(row: dict) -> str:
    if row.get("cc") is None:
        return "-"
    return f"{row.get('cc')}/{row.get('p', '?')}/{row.get('pp', '?')}"


def sorted_rows(rows: list[dict], sort: str) -> list[dict]:
    """The jobs in the order the sort asks: state (the overview's: running, queued, finished), rate (fastest
    first), eta (soonest first), lag (furthest behind first); rows without the value last, in state order."""
    def num(row: dict) -> float | None:
        if sort == "rate":
            return row.get("throughput_bps") if row.get("state") == "running" else None
        if sort == "eta":
            return (row.get("eta") or {}).get("s")
        if sort == "lag":
            lag = row.get("lag") or {}
            return lag.get("oldest_s") if lag.get("oldest_s") is not None else lag.get("p99_s")
        return None

    if sort not in ("rate", "eta", "lag"):
        return list(rows)
    sign = 1.0 if sort == "eta" else -1.0
    keyed = [(num(r) is None, sign * float(num(r) or 0.0), i) for i, r in enumerate(rows)]
    return [rows[i] for _none, _v, i in sorted(keyed)]


# ------------------------------------------------------------------------------------------------ rendering
def render(snapshot: dict, state: TopState) -> Any:
    """One frame: the header, then the job list with agents and pools, or the selected job's files."""
    from rich.console import Group
    from rich.text import Text

    agents = snapshot.get("agents") or []
    alive = sum(1 for a in agents if a.get("alive"))
    rows = sorted_rows(snapshot.get("jobs") or [], state.sort)
    running = sum(1 for r in rows if r.get("state") == "running")
    when = time.strftime("%H:%M:%S", time.localtime(snapshot.get("generated_at") or time.time()))
    ns = f" [{state.namespace}]" if state.namespace else ""
    header = Text.assemble(("fstream top", "bold"), f"{ns}  {when}  {len(rows)} jobs ({running} running), "
                           f"{alive}/{len(agents)} agents alive  ", ("sort: " + state.sort, "bold cyan"),
                           "  " + KEYS_HELP)
    parts: list[Any] = [header]
    if state.confirm:
        parts.append(Text(f"cancel job {state.confirm}? [y/N]", style="bold yellow"))
    elif state.message:
        parts.append(Text(state.message, style="italic"))
    if state.view == "job":
        parts.append(_job_view(snapshot.get("detail"), state))
        return Group(*parts)
    budget = max(3, state.height - 10 - (len(agents) + 4 if agents else 1) - (len(snapshot.get("pools") or []) + 4))
    parts.append(_jobs_table(rows, state, budget))
    parts.append(_agents_table(agents) if agents else Text("agents: none alive (start one with `fstream agent`)"))
    if snapshot.get("pools"):
        parts.append(_pools_table(snapshot["pools"]))
    return Group(*parts)


def _jobs_table(rows: list[dict], state: TopState, budget: int) -> Any:
    from rich.table import Table
    from rich.text import Text

    t = Table(expand=False, pad_edge=False, show_edge=False, box=None, header_style="bold")
    for name in ("job", "state", "worker", "rate", "recent", "files", "bytes", "lag", "ETA (lo..hi)", "deadline",
                 "cc/p/pp", "reason"):
        t.add_column(name, no_wrap=True, justify="right" if name in ("rate", "files", "bytes") else "left")
    ids = [r["job_id"] for r in rows]
    at = ids.index(state.selected) if state.selected in ids else 0
    start = max(0, min(at - budget // 2, len(rows) - budget))
    for row in rows[start:start + budget]:
        deadline = row.get("deadline") or {}
        dstate = deadline.get("state") or "-"
        reason = (row.get("reason") or row.get("error") or "")
        selected = row["job_id"] == state.selected
        ended = row.get("state") in ENDED  # its last ETA and lag are history; the deadline's met/missed is not
        t.add_row(row["job_id"], Text(row.get("state") or "?", style=STATE_STYLE.get(row.get("state"), "")),
                  row.get("worker") or "-", rate(row.get("throughput_bps")), sparkline(row.get("spark") or []),
                  files_text(row), bytes_text(row), "-" if ended else lag_span(row.get("lag")),
                  "-" if ended else eta_span(row.get("eta")),
                  Text(dstate, style=DEADLINE_STYLE.get(dstate, "")), settings_text(row),
                  reason[:REASON_WIDTH] + ("…" if len(reason) > REASON_WIDTH else ""),
                  style="reverse" if selected else None)
    if not rows:
        t.add_row("(no jobs)", *[""] * 11)
    elif len(rows) > budget:
        t.caption = f"jobs {start + 1}-{min(len(rows), start + budget)} of {len(rows)}"
    return t


def _table(title: str, columns: tuple[str, ...]) -> Any:
    from rich.table import Table

    t = Table(title=title, title_justify="left", box=None, header_style="bold", show_edge=False)
    for name in columns:
        t.add_column(name, no_wrap=True)
    return t


def _agents_table(agents: list[dict]) -> Any:
    t = _table("agents", ("agent", "host", "alive", "job", "heartbeat"))
    for a in agents:
        age = a.get("heartbeat_age_s")
        t.add_row(a.get("name") or "?", a.get("host") or "-", "yes" if a.get("alive") else "no",
                  a.get("job_id") or "-", f"{age:.1f}s ago" if age is not None else "-")
    return t


def _pools_table(pools: list[dict]) -> Any:
    t = _table("pools", ("source -> destination", "policy", "streams", "grants"))
    for p in pools:
        grants = ", ".join(f"{c}:{g.get('streams')}" for c, g in sorted((p.get("grants") or {}).items()))
        t.add_row(f"{p.get('src')} -> {p.get('dst')}", str(p.get("policy", "-")),
                  f"{p.get('allocated', 0)}/{p.get('s_pmax', '?')}", grants or "-")
    return t


def _job_view(detail: dict | None, state: TopState) -> Any:
    from rich.console import Group
    from rich.text import Text

    if detail is None:
        return Text(f"job {state.detail_job}: not found (expired?)  Esc: back")
    deadline = detail.get("deadline") or {}
    head = Text.assemble((f"job {detail['job_id']}", "bold"), f"  {detail.get('state')}",
                         f"  worker {detail.get('worker') or '-'}  {rate(detail.get('throughput_bps'))} ",
                         sparkline(detail.get("spark") or []),
                         f"  files {files_text(detail)}  bytes {bytes_text(detail)}  lag {lag_span(detail.get('lag'))}"
                         f"  ETA {eta_span(detail.get('eta'))}  deadline ",
                         (deadline.get("state") or "-", DEADLINE_STYLE.get(deadline.get("state"), "")),
                         f" {deadline.get('message') or ''}  (Esc: back)")
    files = detail.get("files") or []
    budget = max(3, state.height - 22)
    ft = _table(f"files ({len(files)})", ("path", "status", "size", "resumed", "checksum", "retries", "reason"))
    shown = [f for f in files if f.get("status") == "failed"][-budget:]
    shown += [f for f in files if f.get("status") != "failed"][-(budget - len(shown)):] if len(shown) < budget else []
    for f in shown:
        algo = f"{f['algo']}:{str(f['checksum'])[:12]}" if f.get("checksum") else "-"
        ft.add_row(str(f.get("path")), Text(str(f.get("status")), style="red" if f.get("status") == "failed" else ""),
                   size(f.get("size")), size(f.get("resumed")) if f.get("resumed") else "-", algo,
                   str(f.get("retries", 0)), (f.get("reason") or "")[:60])
    it = _table("recent intervals", ("t", "rate", "cc/p/pp", "target", "reason"))
    for rec in (detail.get("intervals") or [])[-8:]:
        it.add_row(f"{rec.get('t') or 0:.1f}s", rate(rec.get("throughput_bps")), settings_text(rec),
                   rate(rec.get("target_bps")) if rec.get("target_bps") else "-", (rec.get("reason") or "")[:60])
    return Group(head, ft, it)


# ------------------------------------------------------------------------------------------------ keys
def parse_keys(data: bytes) -> list[str]:
    """Key names from bytes read off a terminal in cbreak mode: ``up``, ``down``, ``enter``, ``esc``,
    ``backspace`` or the character itself."""
    out: list[str] = []
    text = data.decode("utf-8", "replace")
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\x1b":
            seq = text[i + 1:i + 3]
            if seq in ("[A", "OA"):
                out.append("up")
            elif seq in ("[B", "OB"):
                out.append("down")
            elif seq[:1] in ("[", "O") and len(seq) == 2:
                out.append("other")
            else:
                out.append("esc")
                i += 1
                continue
            i += 3
            continue
        out.append({"\r": "enter", "\n": "enter", "\x7f": "backspace", "\x08": "backspace"}.get(ch, ch))
        i += 1
    return out


def keep_selection(state: TopState, rows: list[dict]) -> None:
    """Select the first job when the selected one is not listed (none yet, or it dropped out of the list)."""
    if rows and state.view == "jobs" and state.selected not in {r["job_id"] for r in rows}:
        state.selected = rows[0]["job_id"]


def handle_key(state: TopState, key: str, rows: list[dict]) -> str | None:
    """Apply one key to ``state`` (``rows``: the jobs as shown); returns ``quit``, ``cancel``, ``open`` or None."""
    if state.confirm is not None:
        job, state.confirm = state.confirm, None
        if key in ("y", "Y"):
            state.to_cancel = job
            return "cancel"
        state.message = f"job {job}: not cancelled"
        return None
    ids = [r["job_id"] for r in rows]
    if key in ("q", "Q"):
        return "quit"
    if key == "s":
        state.sort = SORTS[(SORTS.index(state.sort) + 1) % len(SORTS)] if state.sort in SORTS else SORTS[0]
        return None
    if key in ("up", "k", "down", "j") and ids and state.view == "jobs":
        at = ids.index(state.selected) if state.selected in ids else 0
        state.selected = ids[max(0, at - 1) if key in ("up", "k") else min(len(ids) - 1, at + 1)]
        return None
    if key == "enter" and state.view == "jobs" and ids:
        state.detail_job = state.selected if state.selected in ids else ids[0]
        state.selected, state.view = state.detail_job, "job"
        return "open"
    if key in ("esc", "backspace") and state.view == "job":
        state.view = "jobs"
        return None
    if key == "c":
        target = state.detail_job if state.view == "job" else (state.selected if state.selected in ids else
                                                               (ids[0] if ids else None))
        if target:
            state.confirm = target
    return None


# ------------------------------------------------------------------------------------------------ command
def add_top_parser(subparsers: Any) -> argparse.ArgumentParser:
    from transfer_agent.cli.jobs import _common

    p = subparsers.add_parser("top", help="live view of jobs, rates, lag, ETA, deadlines, agents and pools")
    _common(p)
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="refresh every SECONDS (default 1)")
    p.add_argument("--limit", type=int, default=200, help="jobs to show at most (default 200)")
    p.add_argument("--once", action="store_true", help="print one frame and exit (what it does when stdout is not a terminal)")
    p.set_defaults(func=cmd_top)
    return p


def cmd_top(args: argparse.Namespace) -> int:
    from rich.console import Console

    from transfer_agent.cli.jobs import _store

    if args.interval <= 0:
        print("fstream top: --interval must be > 0 seconds", file=sys.stderr)
        return EXIT_USAGE
    store = _store(args)
    view = Top(store, TopState(namespace=args.namespace if args.namespace != "fstream" else ""), args.limit)
    if args.once or not sys.stdout.isatty():  # a script's (or a pipe's) frame: printed once, whole
        view.state.height = 10_000
        Console(width=None if sys.stdout.isatty() else 200).print(render(view.snapshot(), view.state))
        return EXIT_OK
    return view.run(args.interval)


class Top:
    """The live loop: snapshot, draw, read keys until the next refresh; the terminal restored on any exit."""

    def __init__(self, store: Any, state: TopState, limit: int = 200) -> None:
        from fstream_provider.bus.live import SparkTrail

        self.store, self.state, self.limit = store, state, limit
        self.trail = SparkTrail()  # each frame reads only the events since the last one
        self._detail: dict | None = None

    def snapshot(self) -> dict:
        from fstream_provider.bus.live import overview

        snap = overview(self.store.client, self.store.keys, limit=self.limit, trail=self.trail,
                            owner=self.store.signer.submitter if self.store.signer else None)
        if self.state.view == "job" and self.state.detail_job:
            snap["detail"] = self._refresh_detail(self.state.detail_job)
        return snap

    def _refresh_detail(self, job_id: str) -> dict | None:
        """The job's detail, read incrementally: only the events after the last call's (``after=``)."""
        from fstream_provider.bus.live import job_detail

        old = self._detail if self._detail is not None and self._detail.get("job_id") == job_id else None
        new = job_detail(self.store, job_id, after=old["events_last_id"] if old else "0-0")
        if new is None or old is None:
            self._detail = new
            return new
        files = {f["path"]: f for f in old["files"]}
        for f in new["files"]:
            prev = files.get(f["path"])
            if prev is not None:
                f["retries"] += prev["retries"] + (1 if prev.get("status") == "failed" else 0)
            files[f["path"]] = f
        merged = {**new, "files": list(files.values()), "intervals": (old["intervals"] + new["intervals"])[-500:],
                  "tuning": (old["tuning"] + new["tuning"])[-100:]}
        merged["spark"] = [r.get("throughput_bps") or 0.0 for r in merged["intervals"][-30:]]
        merged["reason"] = new["reason"] or old["reason"]
        self._detail = merged
        return merged

    def run(self, interval: float) -> int:
        import signal

        from rich.console import Console
        from rich.live import Live

        from fstream_provider.bus.client import REDIS_UNREACHABLE

        console = Console()
        fd = sys.stdin.fileno() if sys.stdin.isatty() else None
        restore = _cbreak(fd) if fd is not None else None
        previous = signal.signal(signal.SIGTERM, _interrupt)  # a kill restores the terminal too
        snap: dict = {}
        try:
            with Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False,
                      redirect_stderr=False) as live:
                due = 0.0
                while True:
                    _fit(console)
                    self.state.height = console.size.height
                    if time.monotonic() >= due:
                        due = time.monotonic() + interval
                        try:
                            snap = self.snapshot()
                        except REDIS_UNREACHABLE as exc:  # keep the last frame; try again at the next refresh
                            self.state.message = f"Redis unreachable ({exc}); retrying every {interval:g} s"
                    keep_selection(self.state, sorted_rows(snap.get("jobs") or [], self.state.sort))
                    live.update(render(snap, self.state), refresh=True)
                    wait = max(0.0, due - time.monotonic())
                    if fd is None:
                        time.sleep(wait)  # no keyboard: refresh until interrupted
                        continue
                    if not select.select([fd], [], [], wait)[0]:
                        continue
                    data = os.read(fd, 64)
                    if not data:
                        return EXIT_OK  # the terminal closed
                    for key in parse_keys(data):
                        action = handle_key(self.state, key, sorted_rows(snap.get("jobs") or [], self.state.sort))
                        if action == "quit":
                            return EXIT_OK
                        if action == "cancel":
                            self._cancel(self.state.to_cancel)
                        if action in ("open", "cancel"):
                            due = 0.0
        except KeyboardInterrupt:
            return EXIT_OK
        finally:
            signal.signal(signal.SIGTERM, previous)
            if restore is not None:
                restore()

    def _cancel(self, job_id: str) -> None:
        ok = self.store.cancel(job_id, "cancelled from fstream top")
        job = self.store.get(job_id)
        state = job.state if job is not None else "not found"
        self.state.message = (f"job {job_id}: " + ("cancelled" if state == "cancelled" else "cancel requested; "
                              "its agent stops it") if ok else f"job {job_id}: {state}; nothing to cancel")


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def _fit(console: Any) -> None:
    """Size the frame to the terminal as it is now (a resized window; COLUMNS/LINES a shell exported can be stale)."""
    try:
        console.size = os.get_terminal_size(sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _cbreak(fd: int) -> Any:
    """Put the terminal in cbreak mode (keys arrive at once, unechoed); returns the function that restores it."""
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def restore() -> None:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)

    return restore
