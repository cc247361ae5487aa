"""Two senders on one path share its stream pool (issue #11, ADAPT): neither opens more streams than its grant,
the second gets what the first leaves, and every stream returns to the pool when they finish."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from agentkit import PacedReceiver, make_files, start_receiver, trees_identical, wait_until
from fstream_provider.bus.keys import Keys
from fstream_provider.bus.pools import StreamPools
from fstream_provider.model.spec import TransferSpec
from fstream_provider.tuning.policy import GreedyPolicy
from transfer_agent.sending.history_io import HistoryOptions
from transfer_agent.sending.sender import Transfer

MiB = 1 << 20
HOST = socket.gethostname()  # the pair's source: the transfer node, whichever agent on it sends


def _streams(iv: dict) -> int:
    return sum(c["cc"] * c["p"] for c in iv["clusters"].values())


def test_two_senders_share_one_pool_and_give_every_stream_back(tmp_path: Path, secret: Path, redis_client) -> None:
    keys = Keys("t-pool-agents")
    pools = StreamPools(redis_client, keys)
    rx = start_receiver(tmp_path / "dst", secret, cls=PacedReceiver, rate=24 * MiB)
    dst = f"127.0.0.1:{rx.port}"
    pools.configure(HOST, dst, GreedyPolicy(s_pmax=6, s_cmax=4, s_i=4, s_u=2))
    results, events = {}, {"a": [], "b": []}
    try:
        def run(name: str) -> None:
            src = make_files(tmp_path / f"src-{name}", {f"f{i}.dat": 6 * MiB for i in range(8)}, seed=ord(name))
            spec = TransferSpec.from_options([str(src)], f"fstream://{dst}/{name}", secret_file=str(secret),
                                             tuner="fixed", cc=4, p=2, pp=1, pool=True)  # asks for 8 streams
            t = Transfer(spec, job_id=f"job-{name}", redis=redis_client,
                         on_event=lambda kind, data: events[name].append(data) if kind == "log" else None,
                         history=HistoryOptions(record=False, keys=keys, source=f"agent-{name}"))
            results[name] = t.run()

        first = threading.Thread(target=run, args=("a",))
        first.start()
        wait_until(lambda: pools.status(HOST, dst)["allocated"] > 0, 10, "the first grant")
        second = threading.Thread(target=run, args=("b",))
        second.start()
        first.join(60)
        second.join(60)
    finally:
        rx.stop()
    for name in ("a", "b"):
        r = results[name]
        assert r.ok, r.error or r.failures
        assert trees_identical(tmp_path / f"src-{name}", tmp_path / "dst" / name)
        granted = [int(e["message"].split()[2]) for e in events[name] if e["message"].startswith("pool grant:")]
        assert granted, f"{name}: no grant was logged"
        used = [_streams(iv) for iv in r.intervals if iv["clusters"]]
        assert used and max(used) <= max(granted), f"{name} opened {max(used)} streams on a grant of {granted}"
    # the first took s_i = 4 (s_cmax); the second got the 2 left, never more: 6 = s_pmax in all
    first_grant = int(next(e for e in events["a"] if e["message"].startswith("pool grant:"))["message"].split()[2])
    second_grant = int(next(e for e in events["b"] if e["message"].startswith("pool grant:"))["message"].split()[2])
    assert (first_grant, second_grant) == (4, 2)
    assert pools.status(HOST, dst)["allocated"] == 0  # both gave every stream back


def test_pool_without_a_redis_fails_with_a_clear_error(tmp_path: Path, secret: Path, rx) -> None:
    src = make_files(tmp_path / "src", {"a.dat": 1000})
    spec = TransferSpec.from_options([str(src)], f"fstream://127.0.0.1:{rx.port}/x", secret_file=str(secret),
                                     tuner="fixed", pool=True)
    r = Transfer(spec).run()
    assert not r.ok and "pool" in r.error and "needs a Redis" in r.error
