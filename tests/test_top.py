"""``fstream top`` (issue 27): the frame drawn from a snapshot, its keys, and the real command in a real
terminal (tmux: send-keys, capture-pane) watching a real agent's job change, sorting, opening the job's
files, cancelling it and quitting."""

from __future__ import annotations

import io
import os
import queue
import random
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console

from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.model.spec import TransferSpec
from transfer_agent.cli.top import (TopState, handle_key, keep_selection, parse_keys, render, sorted_rows,
                                    sparkline)
import authkit
from agentkit import wait_until

FSTREAM = str(Path(sys.executable).with_name("fstream"))


def _text(renderable: Any, width: int = 220) -> str:
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def _row(job_id: str, state: str = "running", **kw: Any) -> dict:
    row = {"job_id": job_id, "state": state, "worker": "dtn1-7", "attempt": 1, "throughput_bps": None,
           "spark": [], "files_done": None, "files_total": None, "files_failed": None, "bytes_done": None,
           "bytes_total": None, "lag": None, "eta": None, "deadline": None, "cc": None, "p": None, "pp": None,
           "reason": None, "error": None}
    return {**row, **kw}


SNAPSHOT = {
    "generated_at": 1_800_000_000.0,
    "agents": [{"name": "dtn1-7", "host": "dtn1", "pid": 7, "alive": True, "job_id": "aaaa111122223333",
                "attempt": 1, "heartbeat_age_s": 0.4}],
    "jobs": [
        _row("aaaa111122223333", throughput_bps=7.5e8, spark=[1e8, 3e8, 7.5e8], files_done=12, files_total=40,
             bytes_done=12 * 2**30, bytes_total=40 * 2**30, cc=4, p=2, pp=8,
             eta={"s": 42.0, "lo": 31.0, "hi": 61.0, "rate_bps": 7.5e8, "basis": "bytes"},
             lag={"oldest_s": 3.5, "p50_s": 1.25, "p99_s": 2.75, "landed": 12},
             deadline={"at": 1_800_000_100.0, "target_bps": 6e8, "state": "at-risk", "message": "short by 1 min"},
             reason="deadline: target raised to 600 Mbit/s for the remaining 28 GiB in 100 s"),
        _row("bbbb111122223333", throughput_bps=9e8, eta={"s": 5.0, "lo": 4.0, "hi": 7.0},
             lag={"oldest_s": 20.0, "p99_s": 9.0}),
        _row("cccc111122223333", state="queued", worker=None),
    ],
    "pools": [{"src": "dtn1", "dst": "dtn2:9000", "policy": "greedy", "s_pmax": 128, "allocated": 8,
               "grants": {"dtn1-7": {"streams": 8, "expires_in_s": 20.0}}}],
    "board": {},
}


def test_render_shows_the_job_its_rate_eta_lag_deadline_agents_and_pools():
    text = _text(render(SNAPSHOT, TopState(selected="aaaa111122223333")))
    line = next(ln for ln in text.splitlines() if "aaaa111122223333" in ln)
    for part in ("running", "dtn1-7", "750.00 Mbit/s", "12/40", "12.00 GiB/40.00 GiB", "3.5s p50 1.2s p99 2.8s",
                 "42s (31s..1m01s)", "at-risk", "4/2/8", "deadline: target raised", sparkline([1e8, 3e8, 7.5e8])):
        assert part in line, (part, line)
    assert "sort: state" in text and "3 jobs (2 running), 1/1 agents alive" in text
    assert "dtn1 -> dtn2:9000" in text and "dtn1-7:8" in text and "0.4s ago" in text
    assert "…" in line  # the reason is cut to its column


def test_sort_cycles_and_orders_by_rate_eta_and_lag():
    state = TopState()
    rows = SNAPSHOT["jobs"]
    seen = []
    for _ in range(4):
        handle_key(state, "s", rows)
        seen.append((state.sort, [r["job_id"][:4] for r in sorted_rows(rows, state.sort)]))
    assert seen == [("rate", ["bbbb", "aaaa", "cccc"]), ("eta", ["bbbb", "aaaa", "cccc"]),
                    ("lag", ["bbbb", "aaaa", "cccc"]), ("state", ["aaaa", "bbbb", "cccc"])]
    assert "sort: lag" in _text(render(SNAPSHOT, TopState(sort="lag")))


def test_keys_select_open_back_and_cancel_only_on_y():
    assert parse_keys(b"q\x1b[A\x1b[Bjk\r\n\x1b\x7f") == ["q", "up", "down", "j", "k", "enter", "enter", "esc",
                                                         "backspace"]
    rows = SNAPSHOT["jobs"]
    state = TopState()
    keep_selection(state, rows)
    assert state.selected == "aaaa111122223333"
    assert handle_key(state, "down", rows) is None and state.selected == "bbbb111122223333"
    handle_key(state, "j", rows)
    handle_key(state, "j", rows)  # stays on the last
    assert state.selected == "cccc111122223333"
    handle_key(state, "k", rows)
    assert handle_key(state, "c", rows) is None and state.confirm == "bbbb111122223333"
    assert "cancel job bbbb111122223333? [y/N]" in _text(render(SNAPSHOT, state))
    assert handle_key(state, "n", rows) is None and state.confirm is None and "not cancelled" in state.message
    handle_key(state, "c", rows)
    assert handle_key(state, "y", rows) == "cancel" and state.to_cancel == "bbbb111122223333"
    assert handle_key(state, "enter", rows) == "open" and (state.view, state.detail_job) == ("job",
                                                                                          "bbbb111122223333")
    handle_key(state, "esc", rows)
    assert state.view == "jobs"
    assert handle_key(state, "q", rows) == "quit"


def test_render_of_the_job_view_lists_files_and_intervals():
    detail = {**SNAPSHOT["jobs"][0], "files": [
        {"path": "run42/img_0001.h5", "status": "committed", "size": 4096, "resumed": 0, "checksum": "0123456789abcdef",
         "algo": "xxh3_128", "retries": 0, "reason": None},
        {"path": "run42/img_0002.h5", "status": "failed", "size": 10, "resumed": 0, "retries": 2,
         "reason": "checksum mismatch"}],
        "intervals": [{"t": 1.0, "throughput_bps": 2e8, "cc": 2, "p": 1, "pp": 4, "target_bps": 6e8,
                       "reason": "initial layout"}]}
    state = TopState(view="job", detail_job=detail["job_id"])
    text = _text(render({**SNAPSHOT, "detail": detail}, state))
    assert "job aaaa111122223333" in text and "files (2)" in text
    f1 = next(ln for ln in text.splitlines() if "img_0001.h5" in ln)
    assert "committed" in f1 and "xxh3_128:0123456789ab" in f1
    f2 = next(ln for ln in text.splitlines() if "img_0002.h5" in ln)
    assert "failed" in f2 and "checksum mismatch" in f2 and " 2 " in f2
    assert any("200.00 Mbit/s" in ln and "initial layout" in ln for ln in text.splitlines())


def test_top_once_prints_a_frame(redis_url, redis_client, capsys):
    from transfer_agent.cli.main import main

    store = JobStore(redis_client, keys=Keys("once"), signer=authkit.signer())
    job_id, _ = store.submit(TransferSpec(sources=["/d"], destination="fstream://127.0.0.1:1/x", tuner="fixed"))
    assert main(["top", "--once", "--redis", redis_url, "--namespace", "once"]) == 0
    out = capsys.readouterr().out
    assert job_id in out and "queued" in out and "sort: state" in out
    assert main(["top", "--redis", redis_url, "--namespace", "once"]) == 0  # output not a terminal: one frame
    assert job_id in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ in tmux
class Tmux:
    """A private tmux server (its own socket) with one 200x50 window."""

    def __init__(self, command: str) -> None:
        assert shutil.which("tmux"), "tmux is needed (bench/install-deps.sh installs it)"
        self.socket = f"fstream-top-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.run("new-session", "-d", "-s", "top", "-x", "200", "-y", "50", command)
        self.path = self.run("display", "-p", "-t", "top", "#{socket_path}").strip()

    def run(self, *argv: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *argv], check=True, text=True,
                              capture_output=True, timeout=30).stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "top")

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "top", *keys)

    def wait_for(self, *parts: str, timeout: float = 30.0) -> str:
        seen = [""]

        def shown() -> bool:
            seen[0] = self.screen()
            return all(p in seen[0] for p in parts)

        try:
            wait_until(shown, timeout, f"{parts} on the screen")
        except AssertionError:
            size = self.run("display", "-p", "-t", "top", "#{window_width}x#{window_height}").strip()
            raise AssertionError(f"{parts} not on the {size} screen; it shows:\n{seen[0]}") from None
        return seen[0]

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)
        if self.path.endswith(self.socket):
            Path(self.path).unlink(missing_ok=True)  # kill-server leaves the socket file behind


class FeedTransfer:
    """The agent's data plane stand-in: emits what the test puts in ``feed`` until the job is cancelled."""

    feed: "queue.Queue[tuple[str, dict]]" = queue.Queue()

    def __init__(self, spec: TransferSpec, *, on_event: Any, cancel: threading.Event, **_kw: Any) -> None:
        self.on_event, self.cancel = on_event, cancel

    def run(self) -> Any:
        while not self.cancel.is_set():
            try:
                kind, data = self.feed.get(timeout=0.05)
            except queue.Empty:
                continue
            self.on_event(kind, data)

        class Result:
            ok, failures = False, [{"path": "x", "reason": "cancelled", "retryable": False}]

            def to_dict(self) -> dict:
                return {"bytes": 0, "throughput_bps": 0.0, "verified_files": 0, "skipped_files": 0,
                        "failed_files": 0, "failures": self.failures, "intervals": []}
        return Result()


def _interval(rate: float, done: int, eta_s: float, lag_s: float, deadline: str) -> dict:
    return {"t": float(done), "throughput_bps": rate, "cc": 3, "p": 2, "pp": 4, "files_done": done, "files_total": 50,
            "bytes_done": done * 2**20, "bytes_total": 50 * 2**20, "reason": "",
            "eta": {"s": eta_s, "lo": eta_s * 0.75, "hi": eta_s * 1.5, "rate_bps": rate, "basis": "bytes"},
            "lag": {"oldest_s": lag_s, "p50_s": 1.0, "p99_s": 2.0, "landed": done},
            "deadline": {"at": 2e9, "target_bps": 1e8, "state": deadline, "message": ""}}


def test_fstream_top_in_a_real_terminal(redis_url, redis_client, tmp_path):
    from transfer_agent.daemon.worker import Agent

    keys = Keys("tmuxtop")
    store = JobStore(redis_client, keys=keys, signer=authkit.signer())
    FeedTransfer.feed = queue.Queue()
    agent = Agent(redis_url, name="dtn-top-1", keys=keys, block_ms=50, flush_interval=0.02, poll_interval=0.05,
                  policy=authkit.policy(authkit.key_file()), rng=random.Random(1),
                  transfer_factory=lambda spec, **kw: FeedTransfer(spec, **kw))
    th = threading.Thread(target=agent.run, daemon=True)
    th.start()
    tmux = None
    try:
        spec = TransferSpec(sources=[str(tmp_path)], destination="fstream://127.0.0.1:1/d", tuner="fixed")
        job, _ = store.submit(spec)
        wait_until(lambda: store.get(job).state == "running", 20, "the agent running the job")
        other, _ = store.submit(spec)  # queued behind it: the agent is busy
        FeedTransfer.feed.put(("file", {"path": "run42/img_0001.h5", "source": f"{tmp_path}/run42/img_0001.h5",
                                        "size": 2**20, "status": "committed", "resumed": 0}))
        FeedTransfer.feed.put(("interval", _interval(1.5e8, 10, 40.0, 3.5, "on-track")))

        tmux = Tmux(f"{FSTREAM} top --redis {redis_url} --namespace {keys.namespace} --interval 0.3; "
                    "echo fstream top exited with $?; stty -a | tr ' ;' '\\n\\n' | grep -x -- '-*icanon' | "
                    "sed 's/^/terminal: /'; sleep 600")
        tmux.wait_for(job, other, "running", "queued", "150.00 Mbit/s", "10/50", "40s (30s..1m00s)", "on-track",
                      "3.5s p50 1.0s p99 2.0s", "sort: state", "dtn-top-1")
        FeedTransfer.feed.put(("interval", _interval(3.25e8, 20, 20.0, 7.0, "at-risk")))
        tmux.wait_for("325.00 Mbit/s", "20/50", "20s (15s..30s)", "at-risk", "7.0s p50")

        tmux.keys("s")
        tmux.wait_for("sort: rate")
        tmux.keys("s")
        tmux.wait_for("sort: eta")

        tmux.keys("Down")  # the queued job (no ETA: listed last)
        tmux.keys("Enter")
        tmux.wait_for(f"job {other}", "files (0)")
        tmux.keys("Escape")
        tmux.wait_for("sort: eta", "ETA (lo..hi)", "heartbeat")  # the job list's and the agents' headers
        tmux.keys("Up")
        tmux.keys("Enter")
        tmux.wait_for(f"job {job}", "files (1)", "run42/img_0001.h5", "committed", "recent intervals")
        tmux.keys("BSpace")
        tmux.wait_for("sort: eta", "ETA (lo..hi)", "heartbeat")

        tmux.keys("c")
        tmux.wait_for(f"cancel job {job}? [y/N]")
        tmux.keys("y")
        wait_until(lambda: store.get(job).cancel_requested or store.get(job).state == "cancelled", 20,
                   "the cancel request")
        wait_until(lambda: store.get(job).state == "cancelled", 20, "the job cancelled by its agent")
        assert store.get(job).error == "cancelled from fstream top"
        tmux.wait_for("cancelled")
        assert store.get(other).state in ("queued", "running")  # only the selected job was cancelled

        tmux.keys("q")
        screen = tmux.wait_for("fstream top exited with 0", "terminal: ")
        assert "terminal: icanon" in screen.splitlines(), screen  # cbreak undone: line editing is back
    finally:
        if tmux is not None:
            tmux.kill()
        agent.stop()
        th.join(10)
