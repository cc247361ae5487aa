"""A real transfer's live ETA takes the path rate the user stated as its floor (issue 44)."""

from __future__ import annotations

from agentkit import PacedReceiver, make_files, start_receiver
from fstream_provider.model.spec import TransferSpec
from transfer_agent.sending.sender import Transfer


def _run(tmp_path, secret, name: str, **options):
    src = make_files(tmp_path / f"src-{name}", {f"f{i}.dat": 1_000_000 for i in range(80)})
    rx = start_receiver(tmp_path / f"dst-{name}", secret, cls=PacedReceiver, rate=40e6)  # 320 Mbit/s of storage
    try:
        spec = TransferSpec.from_options([str(src)], f"fstream://127.0.0.1:{rx.port}/d", secret_file=str(secret),
                                         tuner="fixed", cc=2, p=1, pp=2, sample_interval="0.25s", **options)
        res = Transfer(spec).run()
    finally:
        rx.stop()
    assert res.ok and res.verified_files == 80
    return [r for r in res.intervals if r.get("eta") and r["eta"]["basis"] != "done" and r["bytes_left"] > 0]


def test_a_stated_bandwidth_below_the_measured_rate_bounds_the_eta(tmp_path, secret):
    """The receiver takes 320 Mbit/s; the user says the path carries 100 Mbit/s: every ETA while bytes are left is
    those bytes at 100 Mbit/s ("link"). Without the statement the same transfer's ETA comes from the measured rate."""
    stated = _run(tmp_path, secret, "stated", bandwidth="100Mbit")
    assert stated, "no interval with an ETA"
    for r in stated:
        assert r["eta"]["basis"] == "link" and abs(r["eta"]["s"] - r["bytes_left"] * 8 / 100e6) < 0.01, r
    free = _run(tmp_path, secret, "free")
    assert free and all(r["eta"]["basis"] in ("rate", "rate+files") for r in free)
    assert all(r["eta"]["s"] < r["bytes_left"] * 8 / 100e6 for r in free)  # the measured rate is faster
