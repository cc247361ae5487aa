"""Regression (found by the receiver-SIGKILL row): a file put back while the session is torn down
must go to the next session, not end "failed (terminal: error)" with no cause named."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from fstream_provider.model.spec import TransferSpec
from transfer_agent.sending.inflight import InFlight
from transfer_agent.errors import NetworkError
from fstream_provider.watch.sources import SrcFile
from transfer_agent.sending.sender import Transfer


def _transfer(tmp_path):
    (tmp_path / "a").write_bytes(b"x")
    spec = TransferSpec.from_options([str(tmp_path / "a")], "fstream://127.0.0.1:1/out", tuner="fixed")
    return Transfer(spec)


def test_file_put_back_during_teardown_is_kept_for_the_next_session(tmp_path):
    t = _transfer(tmp_path)
    pool = SimpleNamespace(stopping=threading.Event())
    pool.stopping.set()  # the session is failing: channels requeue what they opened ahead
    sf = SrcFile(str(tmp_path / "a"), "out/a", 1, 0)
    retry: list[SrcFile] = []
    f = InFlight(sf, 1, -1, 1, 0)
    f.outcome = "retry"  # requeue_unstarted: error None
    t._on_finished(f, pool, retry)
    assert retry == [sf] and t.result.failed_files == 0 and sf.tries == 0
    g = InFlight(sf, 2, -1, 1, 0)
    g.outcome, g.error = "retry", NetworkError("lost")
    retry.clear()
    t._on_finished(g, pool, retry)
    # a retryable failure is retried within the time budget, with backoff (issue 8, defect 6)
    assert retry == [sf] and t.result.failed_files == 0 and sf.retries == 2 and sf.retry_since > 0
