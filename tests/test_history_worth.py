"""Issue 42 (issue 28's cold facility): a job too small to use the transfer history does not load it.

With a million history rows, every cold agent that took a 64 KiB job started a 200,000-row parse (and
scikit-learn's import) that outlived the job by seconds; 32 cold agents doing so on 2 cores held the
facility's p99 submit → first byte at 3.5 s. A real loopback send with the ``fstream`` tuner and a real
Redis holding history rows: a one-file job says why it skips the load and starts no loader thread; a
job of enough bytes, and a stream (it may grow), still load it.
"""

from __future__ import annotations

import logging
import threading

import pytest

from agentkit import make_files
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.transfer_history import TransferHistory
from fstream_provider.model.spec import TransferSpec
from fstream_provider.tuning.base import PathInfo
from fstream_provider.watch.sources import SrcFile
from transfer_agent.sending import history_io
from transfer_agent.sending.sender import Transfer
from test_history_cache import row

LOG = logging.getLogger("fstream.test.history_worth")


@pytest.fixture
def history(redis_client):
    TransferHistory(redis_client, keys=Keys(), max_rows=0, max_age_s=0).append([row(i) for i in range(500)])
    return redis_client


def _loaders() -> int:
    return sum(t.name == "fstream-history-load" for t in threading.enumerate())


def test_a_one_file_job_skips_the_history_and_says_why(history, rx, secret, tmp_path, caplog):
    src = make_files(tmp_path / "src", {"probe.dat": 64 * 1024})
    spec = TransferSpec.from_options([str(src)], f"fstream://127.0.0.1:{rx.port}/out", secret_file=str(secret),
                                     tuner="fstream")
    seen: list[int] = []
    with caplog.at_level(logging.INFO):
        result = Transfer(spec, redis=history, on_event=lambda kind, _d: seen.append(_loaders())).run()
    assert result.ok and (tmp_path / "dst" / "out" / "probe.dat").stat().st_size == 64 * 1024
    assert "transfer history not loaded: 1 file(s), 65536 bytes" in caplog.text
    assert "row(s) loaded" not in caplog.text and max(seen, default=0) == 0


def test_enough_bytes_or_a_stream_still_load_it(history, caplog):
    path = PathInfo(bandwidth_bps=1e9, rtt_s=0.04)
    big = [SrcFile(f"/d/f{i}", f"f{i}", 100 << 20, 0) for i in range(3)]  # 2.5 s at 1 Gbit/s
    small = [SrcFile("/d/a", "a", 64 << 10, 0)]
    with caplog.at_level(logging.INFO):
        loaded = history_io.background(history, LOG, None, big, False, path)
        streamed = history_io.background(history, LOG, None, small, True, path)
        skipped = history_io.background(history, LOG, None, small, False, path)
    assert loaded is not None and loaded.wait(30) is not None and len(loaded()) == 500
    assert streamed is not None and streamed.wait(30) is not None
    assert skipped is None
