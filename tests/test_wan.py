"""The emulated WAN testbed: build a small path, measure it, fault it, tear it down, leave nothing."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fstream_bench.wan import cli, netns
from fstream_bench.wan.background import set_background
from fstream_bench.wan.netns import WanError

RATE, RTT = "200Mbit", "20ms"


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, TUN devices, tc)"
    missing = netns.missing_tools()
    if shutil.which("ss") is None:
        missing.append("ss (iproute2)")
    return ("missing " + ", ".join(missing)) if missing else None


_REASON = _why_not()


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory):
    old = os.environ.get("FSTREAM_STATE_DIR")
    d = tmp_path_factory.mktemp("wanstate")
    os.environ["FSTREAM_STATE_DIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("FSTREAM_STATE_DIR", None)
    else:
        os.environ["FSTREAM_STATE_DIR"] = old


def _run_id() -> str:
    return "t" + secrets.token_hex(4)


def _config(run_id: str):
    from fstream_bench.wan.path import WanConfig

    return WanConfig.from_text(rate=RATE, rtt=RTT, buffer="1MiB", run_id=run_id)


@pytest.fixture(scope="module")
def wan_path(state_dir):
    if _REASON is not None:
        pytest.skip(f"WAN testbed: {_REASON}")
    from fstream_bench.wan.path import WanPath

    path = WanPath(_config(_run_id()))
    with path:
        pid = path.delayline_pid
        yield path
    _assert_nothing_left(path.config.run_id, [pid])


def _assert_nothing_left(run_id: str, pids: list[int]) -> None:
    src, dst = netns.ns_names(run_id)
    assert src not in netns.list_namespaces() and dst not in netns.list_namespaces()
    assert not [p for p in pids if netns.pid_alive(p)], "processes of the run survived down"
    devs = netns.dev_names(run_id)
    links = netns.run(["ip", "-o", "link", "show"]).stdout
    assert not any(d in links for d in devs), "a TUN device of the run is still there"
    from fstream_bench.wan.path import _delaylines_of
    from fstream_bench.wan.build import state_dir

    assert _delaylines_of(run_id) == []
    assert not list(state_dir().glob(f"{run_id}.*")), "state files survived down"


def test_not_root_is_a_clear_error_with_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["up", "--run-id", "x1"]) == 2
    assert "needs root" in capsys.readouterr().err


def test_bad_run_id_is_refused():
    with pytest.raises(WanError, match="run id"):
        netns.check_run_id("Bad-Name")


@pytest.mark.wan
@pytest.mark.skipif(_REASON is not None, reason=f"WAN testbed: {_REASON}")
def test_selfcheck_measures_the_configured_path(wan_path):
    from fstream_bench.wan.selfcheck import SelfcheckError, selfcheck

    # The delay line and iperf3 are user-space processes on a shared 2-core machine: one measurement
    # can come out starved (CI once saw RTT 22.6 ms and 0.87 of the rate with load under 2). A path
    # that is really wrong fails every try (the next test shows the check catching a 28 ms path).
    failures = []
    for _ in range(3):
        try:
            res = selfcheck(wan_path, duration=3.0)
            break
        except SelfcheckError as exc:
            failures.append(str(exc))
            time.sleep(2.0)
    else:
        raise AssertionError("selfcheck failed three times running:\n" + "\n".join(failures))
    assert res["ok"], res["failures"]
    assert abs(res["rtt_ms"] - 20.0) <= 2.0
    assert abs(res["parallel_bps"] / wan_path.config.expected_goodput_bps - 1) <= 0.05
    assert res["single_stream_bps"] <= 1.1 * res["buffer_limit_bps"]
    assert res["tcp_rmem"][-1] == str(1 << 20) and res["tcp_wmem"][-1] == str(1 << 20)
    assert res["delayline_drops"]["drop_full"] == 0
    json.dumps(res)  # what `selfcheck --json` prints


@pytest.mark.wan
@pytest.mark.skipif(_REASON is not None, reason=f"WAN testbed: {_REASON}")
def test_selfcheck_fails_loudly_when_the_path_is_off(wan_path, capsys):
    from fstream_bench.wan.selfcheck import SelfcheckError, selfcheck

    wan_path.control("delay 14000")  # 28 ms RTT instead of 20
    try:
        with pytest.raises(SelfcheckError, match="RTT") as info:
            selfcheck(wan_path, duration=1.0, parallel=2, rtt_samples=5)
        assert info.value.result["ok"] is False
    finally:
        wan_path.control("delay 10000")


_HALF_OPEN = textwrap.dedent("""
    import json, socket, sys, time
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    def echo():
        t = time.monotonic(); s.sendall(b"ping"); got = b""
        while len(got) < 4:
            chunk = s.recv(4 - len(got))
            if not chunk: raise SystemExit("connection closed")
            got += chunk
        return time.monotonic() - t
    first = echo()
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps({"first": first, "during": echo()}), flush=True)
""")


@pytest.mark.wan
@pytest.mark.skipif(_REASON is not None, reason=f"WAN testbed: {_REASON}")
def test_blackhole_drops_everything_but_connections_survive(wan_path):
    from fstream_bench.wan.path import wait_listening
    from fstream_bench.wan.selfcheck import PROBE_PORT

    server = wan_path.exec("dst", [sys.executable, "-m", "fstream_bench.wan.probe", "serve",
                                   "--host", wan_path.dst_ip, "--port", str(PROBE_PORT)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = None
    try:
        wait_listening(wan_path, "dst", PROBE_PORT)
        client = wan_path.exec("src", [sys.executable, "-c", _HALF_OPEN, wan_path.dst_ip,
                                       str(PROBE_PORT)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert client.stdout.readline().strip() == "ready"
        dropped0 = wan_path.stats()["drop_blackhole"]
        wan_path.blackhole(1.0)
        client.stdin.write("go\n")
        client.stdin.flush()
        out = json.loads(client.stdout.readline())
        assert client.wait(timeout=10) == 0
        assert out["first"] < 0.1
        # Nothing got through for the black-hole second, then the same connection recovered.
        assert 0.9 <= out["during"] < 5.0, out
        assert wan_path.stats()["drop_blackhole"] > dropped0
    finally:
        for p in (client, server):
            if p is not None and p.poll() is None:
                netns.kill_and_wait([p.pid])
                p.wait()


@pytest.mark.wan
@pytest.mark.skipif(_REASON is not None, reason=f"WAN testbed: {_REASON}")
def test_background_flows_switch_on_and_off(wan_path):
    from fstream_bench.wan.background import background_flows

    set_background(wan_path, 3)
    try:
        assert background_flows(wan_path) == 3
        pids = [wan_path.state.background["server"], wan_path.state.background["client"]]
        assert all(netns.pid_alive(p) for p in pids)
        before = wan_path.stats()["a_rx_bytes"]
        out = wan_path.run("src", ["ss", "-Htn", "state", "established", "dport = :5290"]).stdout
        assert len(out.splitlines()) >= 3
    finally:
        set_background(wan_path, 0)
    assert wan_path.stats()["a_rx_bytes"] > before
    assert background_flows(wan_path) == 0
    assert not [p for p in pids if netns.pid_alive(p)]


@pytest.mark.wan
@pytest.mark.skipif(_REASON is not None, reason=f"WAN testbed: {_REASON}")
def test_down_removes_leftovers_of_a_crashed_run_and_nothing_else(state_dir):
    run_id = _run_id()
    # A process that builds a path, starts a flow inside it, and dies without cleaning up.
    crash = textwrap.dedent(f"""
        import os, subprocess
        from fstream_bench.wan.path import WanPath, WanConfig
        p = WanPath(WanConfig(rate_bps=1e8, rtt_s=0.01, run_id={run_id!r})).up()
        p.exec("dst", ["iperf3", "-s", "-p", "5999"], stdout=subprocess.DEVNULL,
               stderr=subprocess.DEVNULL, start_new_session=True)
        print(p.delayline_pid, flush=True)
        os.kill(os.getpid(), 9)
    """)
    cp = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True,
                        timeout=60, env=os.environ.copy())
    assert cp.returncode == -signal.SIGKILL, cp.stderr
    delayline = int(cp.stdout.split()[0])
    src, dst = netns.ns_names(run_id)
    inside = netns.ns_pids(dst)
    assert netns.pid_alive(delayline) and src in netns.list_namespaces() and inside

    from fstream_bench.wan.path import find_runs

    # `down --all` would also stop other people's paths on a shared machine, so the test
    # checks what it would find, then removes only its own run.
    foreign, other = f"fswtest{run_id}", netns.ns_names(run_id + "x")[0]
    netns.run(["ip", "netns", "add", foreign])
    netns.run(["ip", "netns", "add", other])
    try:
        found = find_runs()
        assert run_id in found and run_id + "x" in found
        assert not any("fswtest" in r for r in found)
        # Recognised by its names alone, even with the state file lost in the crash.
        (Path(state_dir) / "wan" / f"{run_id}.json").unlink()
        assert cli.main(["down", "--run-id", run_id]) == 0
        assert foreign in netns.list_namespaces() and other in netns.list_namespaces()
    finally:
        netns.run(["ip", "netns", "del", foreign])
        netns.run(["ip", "netns", "del", other])
    _assert_nothing_left(run_id, [delayline, *inside])


@pytest.mark.wan
@pytest.mark.skipif(_REASON is not None, reason=f"WAN testbed: {_REASON}")
def test_cli_up_down_leaves_nothing_behind(state_dir, capsys):
    run_id = _run_id()
    assert cli.main(["up", "--run-id", run_id, "--rate", "100Mbit", "--rtt", "10ms", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["src_ns"] in netns.list_namespaces()
    st = json.loads((Path(state_dir) / "wan" / f"{run_id}.json").read_text())
    pid = st["delayline_pid"]
    assert netns.pid_alive(pid)
    assert cli.main(["up", "--run-id", run_id]) == 1  # already up: refused, not rebuilt
    assert cli.main(["down", "--run-id", run_id]) == 0
    _assert_nothing_left(run_id, [pid])


def _storage_reason() -> str | None:
    if _REASON is not None:
        return _REASON
    from fstream_bench.wan.storage import storage_supported

    return storage_supported()


@pytest.mark.wan
@pytest.mark.skipif(_storage_reason() is not None, reason=f"disk limit: {_storage_reason()}")
def test_destination_disk_write_cap_is_in_force_and_removed(state_dir):
    from fstream_bench.wan.path import WanConfig, WanPath
    from fstream_bench.wan.storage import measure_write_bps

    cap = 80e6 * 8  # 80 MB/s: far below what a RAM-backed loop device does uncapped
    path = WanPath(WanConfig(rate_bps=1e8, rtt_s=0.01, run_id=_run_id(), disk_rate_bps=cap,
                             disk_size_bytes=256 << 20))
    with path:
        info = dict(path.state.storage)
        assert os.path.ismount(path.dst_dir)
        rate = measure_write_bps(path.dst_dir, nbytes=96 << 20)
        assert rate <= 1.05 * cap, f"wrote {rate / 8e6:.0f} MB/s through an 80 MB/s cap"
    assert not os.path.ismount(info["mount"]) and not os.path.exists(info["image"])
    back = netns.run(["losetup", "-nO", "BACK-FILE", info["loop"]], check=False).stdout
    assert info["image"] not in back, "loop device still attached to our image"
    from fstream_bench.wan.storage import BLKIO_WRITE

    assert not any(line.startswith(info["majmin"] + " ")
                   for line in BLKIO_WRITE.read_text().splitlines()), "throttle rule left behind"
