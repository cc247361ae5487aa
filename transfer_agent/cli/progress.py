"""The live progress line and the end-of-transfer table of ``fstream send``/``submit`` (rich)."""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    """A live progress line on stderr (rich), fed by the transfer's interval records."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._live = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

            self._p = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(),
                                   TextColumn("{task.completed}/{task.total} files"),
                                   TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[params]}"),
                                   TextColumn("{task.fields[live]}"),
                                   TimeElapsedColumn(), console=Console(stderr=True), transient=False)
            self._task = self._p.add_task("fstream", total=None, rate="", params="", live="")
            self._p.start()

    def __call__(self, kind: str, data: dict) -> None:
        if not self.enabled:
            return
        from fstream_provider.model.live_text import live_text
        from fstream_provider.model.units import format_rate

        if kind == "interval":
            total = data.get("files_total") or None
            self._p.update(self._task, completed=data.get("files_done", 0), total=total,
                           rate=format_rate(data.get("throughput_bps", 0.0)),
                           params=f"cc={data.get('cc')} p={data.get('p')} pp={data.get('pp')}", live=live_text(data))
        elif kind == "tuning":
            self._p.console.print(f"[dim]tuning @{data.get('t', 0):.1f}s: {data.get('reason', '')}[/]")
        elif kind == "deadline":
            colour = "red" if data.get("state") in ("infeasible", "missed") else (
                "yellow" if data.get("state") == "at-risk" else "dim")
            self._p.console.print(f"[{colour}]deadline {data.get('state')}: {data.get('message', '')}[/]")
        elif kind == "file" and data.get("status") == "failed":
            self._p.console.print(f"[red]failed[/] {data.get('path')}: {data.get('reason')}")

    def stop(self) -> None:
        if self.enabled:
            self._p.stop()


def print_summary(result: dict, stream: Any = None) -> None:
    """The end-of-transfer table."""
    from rich.console import Console
    from rich.table import Table

    from fstream_provider.model.units import format_bytes, format_rate

    t = Table(title="fstream transfer", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("files verified", str(result["verified_files"]))
    t.add_row("files skipped (already there)", str(result["skipped_files"]))
    t.add_row("files failed", str(result["failed_files"]))
    t.add_row("data", format_bytes(result["bytes"]))
    t.add_row("resumed (not re-sent)", format_bytes(result.get("resumed_bytes", 0)))
    t.add_row("time", f"{result['seconds']:.2f} s")
    t.add_row("throughput", format_rate(result["throughput_bps"]))
    t.add_row("tuner", result.get("tuner", ""))
    t.add_row("tuning decisions", str(len(result.get("tuning", []))))
    Console(file=stream or sys.stderr).print(t)
    for f in result.get("failures", [])[:20]:
        Console(file=stream or sys.stderr).print(f"[red]failed[/] {f['path']}: {f['reason']}")
