"""``fstream bench trust``: run order, the summary over every run, ratios to hmac within a round, the WAN
buffer, the report and the runner's bookkeeping — on synthetic numbers, nothing is sent or timed."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from fstream_bench.ops import trust as tb, trust_report as tr

GB = 10**9


def run(where="loopback", case="big", mode="hmac", rep=0, *, bps=1e9, tx=1.0, rx=2.0, nbytes=GB, wall=2.0,
        ok=True, files=1, verified=1) -> dict:
    return {"where": where, "case": case, "mode": mode, "rep": rep, "ok": ok, "bytes": nbytes if ok else 0,
            "files": files, "verified_files": verified, "wall_s": wall if ok else 0.0, "bps": bps,
            "tx_cpu_s": tx if ok else None, "rx_cpu_s": rx if ok else None, "error": "" if ok else "boom"}


def cell(summary, where, case, mode):
    (c,) = [c for c in summary if (c["where"], c["case"], c["mode"]) == (where, case, mode)]
    return c


def test_schedule_interleaves_every_mode_within_each_round_and_case():
    order = tr.schedule(["big", "small"], ["A", "B", "C"], 2)
    assert [(r, c, m) for r, c, m in order] == [
        (0, "big", "A"), (0, "big", "B"), (0, "big", "C"), (0, "small", "A"), (0, "small", "B"), (0, "small", "C"),
        (1, "big", "A"), (1, "big", "B"), (1, "big", "C"), (1, "small", "A"), (1, "small", "B"), (1, "small", "C")]
    assert [m for _, c, m in order if c == "big"] == ["A", "B", "C", "A", "B", "C"]


def test_summary_is_median_and_range_of_every_successful_run():
    runs = [run(rep=0, bps=1e9, tx=1.0, rx=3.0, wall=2.0), run(rep=1, bps=3e9, tx=2.0, rx=2.0, wall=4.0),
            run(rep=2, bps=2e9, tx=4.0, rx=1.0, nbytes=2 * GB, wall=1.0), run(rep=3, ok=False)]
    c = cell(tr.summarise(runs), "loopback", "big", "hmac")
    assert (c["runs"], c["failed"], c["verified"]) == (3, 1, True)
    assert c["bps"] == {"median": 2e9, "min": 1e9, "max": 3e9, "n": 3}
    assert c["tx_cpu_per_gb"] == {"median": 2.0, "min": 1.0, "max": 2.0, "n": 3}  # 1/1, 2/1, 4/2
    assert c["rx_cpu_per_gb"] == {"median": 2.0, "min": 0.5, "max": 3.0, "n": 3}
    assert c["cpu_per_gb"] == {"median": 4.0, "min": 2.5, "max": 4.0, "n": 3}
    assert c["tx_busy"]["median"] == 0.5 and c["tx_busy"]["max"] == 4.0  # CPU-s per wall-s
    assert c["vs_hmac"] is None


def test_ratios_to_hmac_are_taken_within_a_round_then_summarised():
    hmac = [1e9, 2e9, 4e9]
    enc = [1e9, 1e9, 4e9]  # ratio of medians would be 0.5; per round 1.0, 0.5, 1.0
    runs = []
    for i in range(3):
        runs += [run(mode="hmac", rep=i, bps=hmac[i], tx=1.0, rx=1.0),
                 run(mode="hmac+encrypt", rep=i, bps=enc[i], tx=2.0 + i, rx=1.0)]
    runs.append(run(mode="hmac+encrypt", rep=3, bps=9e9))  # no hmac run in round 3: not paired
    vs = cell(tr.summarise(runs), "loopback", "big", "hmac+encrypt")["vs_hmac"]
    assert vs["bps"] == {"median": 1.0, "min": 0.5, "max": 1.0, "n": 3}
    assert vs["cpu_per_gb"] == {"median": 2.0, "min": 1.5, "max": 2.5, "n": 3}  # (2+i+1)/2
    assert vs["tx_cpu_per_gb"]["median"] == 3.0 and vs["rx_cpu_per_gb"]["median"] == 1.0
    assert tr.paired_ratios(runs, "loopback", "big", "hmac+encrypt", "bps") == [1.0, 0.5, 1.0]


def test_a_failed_hmac_round_drops_that_round_from_the_ratios_only():
    runs = [run(mode="hmac", rep=0, bps=2e9), run(mode="tls", rep=0, bps=1e9),
            run(mode="hmac", rep=1, ok=False), run(mode="tls", rep=1, bps=5e9)]
    c = cell(tr.summarise(runs), "loopback", "big", "tls")
    assert c["runs"] == 2 and c["vs_hmac"]["bps"] == {"median": 0.5, "min": 0.5, "max": 0.5, "n": 1}


def test_cells_follow_run_order_then_mode_order_and_wan_gets_share_of_path():
    runs = []
    for where in ("loopback", "wan"):
        for case in ("big", "small"):
            for mode in reversed(tr.MODES):
                runs.append(run(where, case, mode, bps=0.9e9, files=3, verified=3 if mode != "tls" else 2))
    s = tr.summarise(runs, goodput_bps={"wan": 0.96e9})
    assert [(c["where"], c["case"]) for c in s[::4]] == [("loopback", "big"), ("loopback", "small"), ("wan", "big"),
                                                         ("wan", "small")]
    assert [c["mode"] for c in s[:4]] == list(tr.MODES)
    assert "of_path" not in s[0] and cell(s, "wan", "big", "hmac")["of_path"]["median"] == pytest.approx(0.9375)
    assert cell(s, "wan", "big", "tls")["verified"] is False
    assert cell(s, "wan", "big", "hmac --no-verify")["verified"] is None


def test_wan_buffer_is_a_power_of_two_at_least_twice_the_bdp():
    assert tr.wan_buffer(1e9, 0.040) == 16 << 20  # BDP 5 MB
    for rate, rtt in ((1e9, 0.040), (10e9, 0.1), (1e8, 0.01), (2.5e9, 0.077)):
        b = tr.wan_buffer(rate, rtt)
        assert b >= 2 * rate * rtt / 8 and b >= 4 << 20 and b & (b - 1) == 0


def test_markdown_from_a_result_document():
    runs = [run(mode=m, rep=i, bps=b * 1e9, tx=t) for i in range(2)
            for m, b, t in (("hmac", 3.0, 1.0), ("hmac+encrypt", 2.0, 2.0), ("tls", 2.5, 2.0))]
    runs.append(run(mode="tls", rep=2, ok=False))
    doc = {"provenance": {"command": "fstream bench trust", "commit": "abc", "code_hash": "sha256:0123456789abcdef0",
                          "machine": {"nproc": 2}, "load_start": [0.1, 0.2, 0.3], "load_end": [1, 1, 1]},
           "memory": "held", "order": "o", "runs": runs, "summary": tr.summarise(runs),
           "sites": {"wan": {"single_stream_of_path": 0.97, "note": "path"}}}
    md = tr.markdown(doc)
    assert "| loopback | big | hmac+encrypt | 2 | 2.00 (2.00–2.00) | 0.67 (0.67–0.67) |" in md
    assert "| loopback | big | tls | 2 (1 failed) |" in md and "round 2: failed: boom" in md


def test_auth_args_per_mode_and_side(tmp_path):
    certs = {k: k for k in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}
    s = tmp_path / "secret"
    assert tb.auth_args("send", "hmac", s, certs) == ["--secret-file", str(s)]
    assert tb.auth_args("receive", "hmac+encrypt", s, certs) == ["--secret-file", str(s)]
    assert tb.auth_args("send", "hmac+encrypt", s, certs)[-1] == "--encrypt"
    assert tb.auth_args("send", "hmac --no-verify", s, certs)[-1] == "--no-verify"
    assert tb.auth_args("send", "tls", s, certs) == ["--tls-cert", "client.pem", "--tls-key", "client.key",
                                                     "--tls-ca", "ca.pem"]
    assert tb.auth_args("receive", "tls", s, certs)[:2] == ["--tls-cert", "server.pem"]


def test_runner_keeps_every_run_in_schedule_order(tmp_path, monkeypatch):
    """The bookkeeping of ``run_cases`` with the agents replaced: nothing is started."""
    from fstream_bench.core import cpu_meter
    from fstream_bench.peers import base

    sent = []

    class FakeRx:
        def __init__(self, mode, root):
            self.mode, self.root, self.log = mode, root, root / "rx.log"
            self.proc = SimpleNamespace(pid=1)

        def url(self, dest):
            return f"fstream://h:1/{dest}"

    @contextlib.contextmanager
    def fake_receiver(mode, *, sites, workdir, root, secret, certs):
        yield FakeRx(mode, root)

    def fake_client(argv, timeout, log_path=None, env=None):
        sent.append(argv)
        dest = argv[argv.index("--to") + 1].rsplit("/", 1)[1]
        (tmp_path / "dst" / "loopback" / dest).mkdir(parents=True)
        failed = "--encrypt" in argv and len(sent) > 4
        doc = {"bytes": GB, "files": 1, "verified_files": 0 if failed else 1, "throughput_bps": 1e9, "seconds": 1.0}
        return SimpleNamespace(status=0, wall=1.5, out="log line\n" + json.dumps(doc), cpu_s=0.7)

    class FakeMeter:
        def __init__(self, pid):
            pass

        def start(self):
            return self

        def stop(self):
            return 0.4

    monkeypatch.setattr(tb, "_receiver", fake_receiver)
    monkeypatch.setattr(base, "run_client", fake_client)
    monkeypatch.setattr(cpu_meter, "ServerCpu", FakeMeter)
    cases = {"big": ([Path("/src/big")], ["--cc", "1"]), "small": ([Path("/src/small")], ["--cc", "4"])}
    runs = tb.run_cases("loopback", base.Sites(src_prefix=("taskset", "-c", "0")), cases,
                        ["hmac", "hmac+encrypt"], 2, tmp_path, tmp_path / "secret", {}, 60.0)
    order = tr.schedule(["big", "small"], ["hmac", "hmac+encrypt"], 2)
    assert [(r["rep"], r["case"], r["mode"]) for r in runs] == order
    assert [r["seq"] for r in runs] == list(range(8))
    assert all(a[:3] == ["taskset", "-c", "0"] and "--json" in a for a in sent)
    assert runs[0]["tx_cpu_s"] == 0.7 and runs[0]["rx_cpu_s"] == 0.4 and runs[0]["bps"] == 1e9
    assert [r["ok"] for r in runs] == [True, True, True, True, True, False, True, False]  # unverified = failed
    assert not any((tmp_path / "dst" / "loopback").iterdir())  # every destination removed after its run


def test_cli_parses_and_refuses_what_cannot_run(capsys):
    a = tb.parser().parse_args([])
    assert (a.repeat, a.wan_repeat, a.wan_buffer, a.wan, a.no_loopback) == (5, 4, "auto", False, False)
    assert tb.parser().parse_args(["--wan-buffer", "32MiB"]).wan_buffer == 32 << 20
    for bad in (["--no-loopback"], ["--modes", "tls"], ["--modes", "hmac,rot13"], ["--repeat", "0"]):
        with pytest.raises(SystemExit) as e:
            tb.main(bad)
        assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        tb.main(["--help"])
    assert e.value.code == 0 and "--wan-buffer" in capsys.readouterr().out


def test_wan_site_says_whether_the_path_or_the_window_limits(monkeypatch):
    from fstream_bench.wan import rig as wan_rig
    from fstream_bench.peers.base import Sites
    from fstream_bench.wan.path import WanConfig

    closed = []
    cfg = WanConfig(rate_bps=1e9, rtt_s=0.040, buffer_bytes=16 << 20, run_id="trust")
    bench = SimpleNamespace(path=SimpleNamespace(config=cfg), selfcheck={"single_stream_bps": 0.95e9},
                            sites=Sites(src_host="10.0.0.1", dst_host="10.0.0.2",
                                        src_prefix=("ip", "netns", "exec", "s"),
                                        dst_prefix=("ip", "netns", "exec", "d"), name="wan"),
                            close=lambda: closed.append(1))
    seen = {}
    monkeypatch.setattr(wan_rig, "open_bench", lambda ns, log=None: seen.update(vars(ns)) or bench)
    args = tb.parser().parse_args(["--wan"])
    _, sites, info = tb._wan_site(args, 16 << 20, pin=True)
    assert seen["buffer"] == str(16 << 20) and seen["run_id"] == "trust" and not seen["loopback"]
    assert sites.argv("dst", ["x"]) == ["taskset", "-c", "1", "ip", "netns", "exec", "d", "x"]
    assert info["single_stream_of_path"] == pytest.approx(0.95e9 / cfg.expected_goodput_bps)
    assert "3.4x the bandwidth-delay product" in info["note"] and "the path, not the window, limits" in info["note"]
    bench.selfcheck = {"single_stream_bps": 0.3e9}
    assert "something other than the path" in tb._wan_site(args, 16 << 20, pin=False)[2]["note"]
    assert not closed


def test_mode_receiver_is_the_peer_receiver_with_the_modes_auth(tmp_path):
    """The trust bench's receiver for ``tls`` is ``FStreamReceiver`` given TLS options: a real ``fstream send``
    with the client certificate moves a file through it, verified."""
    from fstream_bench.peers.base import Sites
    from fstream_bench.peers.fstream import FStreamReceiver

    certs = tb._certs(tmp_path / "certs")
    src = tmp_path / "src" / "a.dat"
    src.parent.mkdir()
    src.write_bytes(os.urandom(300_000))
    secret = tmp_path / "secret"
    with tb._receiver("tls", sites=Sites(), workdir=tmp_path / "rx", root=tmp_path / "dst", secret=secret,
                      certs=certs) as rx:
        assert type(rx) is FStreamReceiver and rx.secret == secret and "--no-fsync" in rx.proc.args
        r = tb._one("tls", rx, Sites(), [src], ["--cc", "1"], "landed", secret, certs, tmp_path, 60.0)
        assert r["ok"], r["error"]
        assert r["files"] == 1 and r["verified_files"] == 1 and r["bytes"] == 300_000
