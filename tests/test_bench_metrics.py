"""The metrics bench's daemons (``fstream_bench.peers.fstream``'s agent and receiver kit), run small and for real."""

from __future__ import annotations

import pytest

from fstream_bench.ops import metrics
from fstream_bench.peers.base import PeerError, Sites
from fstream_bench.peers.fstream import FStreamAgent


@pytest.mark.slow
def test_metrics_bench_moves_a_job_through_fresh_daemons_with_metrics_off_and_on(tmp_path):
    doc = metrics.run(tmp_path, repeats=1, total=1 << 20, files=2, knobs={"cc": 1, "p": 2, "pp": 1},
                      scrape_interval=0.2, pin=False, timeout=120, log=lambda *_: None)
    assert [r["mode"] for r in doc["runs"]] == ["off", "on"]
    # a returned run landed every byte of a succeeded job (metrics.run raises otherwise); the CPU of a 1 MiB job
    # can be under the kernel's 10 ms accounting tick, so only its presence is asserted (CI saw 0.0)
    assert all(r["seconds"] > 0 and r["cpu_rx_s"] >= 0 and r["cpu_agent_s"] >= 0 for r in doc["runs"])
    off, on = doc["runs"]
    assert off["scrapes"] is None and on["scrapes"]["ok"] >= 2 and on["scrapes"]["bytes"] > 0


def test_an_agent_that_cannot_start_is_reported_with_its_log(tmp_path):
    """``FStreamAgent`` waits for ``consuming jobs on``; an agent that exits first (its policy file is missing)
    fails the start, naming it and showing its log, and is not left running."""
    agent = FStreamAgent(sites=Sites(), redis_url="redis://127.0.0.1:9", policy=tmp_path / "missing.toml",
                         name="never", log=tmp_path / "agent.log", env={"FSTREAM_STATE_DIR": str(tmp_path / "s")})
    with pytest.raises(PeerError, match=r"fstream agent: exited with status [1-9]") as e:
        agent.__enter__()
    assert "missing.toml" in str(e.value)
    assert agent.proc is not None and agent.proc.poll() is not None
