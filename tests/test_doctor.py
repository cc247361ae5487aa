"""``fstream doctor`` (issue 30): the advice rules, the receiver's probes, the command over loopback and the WAN."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fstream_provider.tuning.host_advice import (VERDICTS, HostTcp, PathReport, SecretFile, diagnose,
                                                 recommended_buffer)
from transfer_agent.receiving import doctor as rdoctor
from transfer_agent.sending.doctor_probe import steady_rate

MIB = 1 << 20


def _host(buf: int, cc: str = "cubic", mtu: int = 1500) -> HostTcp:
    return HostTcp(rmem_max=buf, wmem_max=buf, tcp_rmem=(4096, 131072, buf), tcp_wmem=(4096, 16384, buf), cc=cc,
                   qdisc="fq", interface_mtu=mtu, route_mtu=mtu)


def _codes(diag) -> dict:
    return {a.code: a for a in diag.advice}


# -- the advice rules (pure) -------------------------------------------------------------------------------------
def test_small_buffers_are_named_as_the_buffer_cap_with_fasterdata_advice():
    m = PathReport(rtt_s=0.040, single_bps=40e6, parallel_bps=190e6, streams=8, sender=_host(64 * MIB),
                   receiver=_host(256 << 10))
    diag = diagnose(m)
    assert diag.verdict == "buffer cap"
    assert diag.window_bytes == 256 << 10 and abs(diag.window_cap_bps - 52.4e6) < 0.1e6
    rmem = _codes(diag)["rmem_cap"]
    assert rmem.severity == "cause" and rmem.side == "receiver"
    assert "net.ipv4.tcp_rmem max on the receiver is 256 KiB" in rmem.text
    assert "at least 2x BDP (e.g. 16 MiB)" in rmem.text
    assert rmem.settings == {"net.core.rmem_max": str(16 * MIB), "net.ipv4.tcp_rmem": f"4096 131072 {16 * MIB}"}
    assert "wmem_cap" not in _codes(diag)  # the sender's 64 MiB is plenty
    assert "streams_help" in _codes(diag)


def test_the_brief_example_reads_as_a_host_tuning_guide():
    m = PathReport(rtt_s=0.040, single_bps=180e6, parallel_bps=1e9, streams=8, sender=_host(64 * MIB),
                   receiver=_host(1 * MIB))
    text = _codes(diagnose(m))["rmem_cap"].text
    assert text.startswith("net.ipv4.tcp_rmem max on the receiver is 1 MiB: one stream can hold at most 1 MiB in "
                           "flight, which at 40 ms RTT caps it near 210 Mbit/s; the path's bandwidth-delay product "
                           "is 4.8 MiB"), text


def test_equal_rates_below_the_buffers_are_the_bottleneck_unless_the_path_delivers_its_bandwidth():
    m = PathReport(rtt_s=0.040, single_bps=480e6, parallel_bps=483e6, streams=8, sender=_host(64 * MIB),
                   receiver=_host(64 * MIB))
    diag = diagnose(m)
    assert diag.verdict == "bottleneck" and _codes(diag)["path_rate"].severity == "cause"
    assert "rmem_cap" not in _codes(diag) and "wmem_cap" not in _codes(diag)
    assert diagnose(PathReport(**{**m.__dict__, "bandwidth_bps": 1e9})).verdict == "bottleneck"
    healthy = diagnose(PathReport(**{**m.__dict__, "bandwidth_bps": 500e6}))
    assert healthy.verdict == "none found" and "500 Mbit/s the path should carry" in healthy.reason


def test_a_disk_slower_than_the_network_is_the_destination_disk():
    m = PathReport(rtt_s=0.020, single_bps=480e6, parallel_bps=483e6, streams=8, sender=_host(64 * MIB),
                   receiver=_host(64 * MIB), disk_bps=100e6)
    diag = diagnose(m)
    assert diag.verdict == "destination disk" and "100 Mbit/s" in diag.reason
    assert _codes(diag)["disk_slow"].side == "receiver"


def test_secret_modes_clock_skew_mtu_and_free_space_are_advised():
    m = PathReport(rtt_s=0.010, single_bps=900e6, parallel_bps=920e6, streams=4, sender=_host(64 * MIB, cc="reno"),
                   receiver=_host(64 * MIB, mtu=1400), clock_skew_s=-3.2, free_bytes=1 << 30, total_bytes=100 << 30,
                   secrets=(SecretFile("/etc/fstream/secret", 0o644), SecretFile("/etc/fstream/tls.key", 0o600,
                                                                                 "TLS key")))
    codes = _codes(diagnose(m))
    perms = codes["secret_perms"]
    assert perms.severity == "error" and "/etc/fstream/secret is mode 0644" in perms.text
    assert "chmod 600 /etc/fstream/secret" in perms.text and "tls.key" not in perms.text
    assert "3.2 s behind ours" in codes["clock_skew"].text
    assert "route's MTU is 1400" in codes["mtu_small"].text
    assert codes["cc_reno"].settings == {"net.ipv4.tcp_congestion_control": "cubic"}
    assert "1 GiB free of 100 GiB" in codes["disk_space"].text
    assert [a.severity for a in diagnose(m).advice] == sorted(
        (a.severity for a in diagnose(m).advice), key=["error", "cause", "warn", "info"].index)


def test_recommended_buffers_are_twice_the_bdp_in_powers_of_two_from_16_mib():
    assert recommended_buffer(1 * MIB) == 16 * MIB
    assert recommended_buffer(20 * MIB) == 64 * MIB
    assert recommended_buffer(10 << 30) == 1 << 30


def test_host_facts_from_the_wire_tolerate_junk():
    h = HostTcp.from_facts({"sysctl": {"net.ipv4.tcp_rmem": "4096 x 1", "net.core.rmem_max": 5,
                                       "net.ipv4.tcp_wmem": "4096 16384 262144"}, "interface_mtu": "1500"})
    assert h.rmem_cap is None and h.rmem_max is None and h.interface_mtu is None and h.wmem_cap == 262144


def test_steady_rate_leaves_slow_start_out_and_adds_streams_on_one_clock():
    # 1 MB in the first 0.5 s, then 10 MB/s for 2 s; a second stream starting 0.1 s later at the same rates
    def series(t0: float) -> list[list[float]]:
        return [[t0, 0], [t0 + 0.5, 1e6]] + [[t0 + 0.5 + k * 0.1, 1e6 + k * 1e6] for k in range(1, 21)]

    one = steady_rate([series(100.0)], rtt_s=0.001)
    assert abs(one["bps"] - 80e6) < 1e3 and one["from_s"] == 0.5
    two = steady_rate([series(100.0), series(100.1)], rtt_s=0.001)
    assert abs(two["bps"] - 156.8e6) < 1e3  # the second stream had moved 0.8 MB by the window's start


# -- the receiver's probes ---------------------------------------------------------------------------------------
@pytest.mark.serial  # the samples must span 0.3 s within 50 ms: a thread starved by a busy core misses that
def test_the_sink_counts_its_seconds_from_the_first_byte_and_waits_for_one_at_most_sink_wait(monkeypatch):
    a, b = socket.socketpair()
    stop = threading.Event()

    def flood() -> None:
        b.settimeout(0.1)
        while not stop.is_set():
            try:
                b.send(bytes(65536))
            except (TimeoutError, OSError):
                continue

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    try:
        t0 = time.monotonic()
        got = rdoctor.sink(a, 0.3, threading.Event())
        took = time.monotonic() - t0
    finally:
        stop.set()
        t.join(5)
        a.close()
        b.close()
    assert got["eof"] is False and got["bytes"] > 0 and got["samples"][-1][1] == got["bytes"]
    assert 0.25 <= got["samples"][-1][0] - got["samples"][0][0] <= 0.35 and took < 1.0, (took, got["samples"][-1])
    monkeypatch.setattr(rdoctor, "SINK_WAIT_S", 0.3)
    a, b = socket.socketpair()
    with a, b:
        t0 = time.monotonic()
        assert rdoctor.sink(a, 5.0, threading.Event()) == {"bytes": 0, "eof": False, "samples": []}
        assert time.monotonic() - t0 < 1.5


def test_one_disk_probe_at_a_time_and_only_under_the_keys_subtree(tmp_path):
    import logging

    from transfer_agent.receiving.keyring import ReceiverKey

    def key(key_id: str, subtree: str = "") -> ReceiverKey:  # each its own key: one disk probe per key per minute
        return ReceiverKey(key_id, b"s" * 16, subtree)

    svc = rdoctor.DoctorService(root=str(tmp_path), stop=threading.Event(), log=logging.getLogger("test"))
    with svc._disk:
        busy = svc._disk_probe({"bytes": MIB, "seconds": 1.0}, key("a"), "test")
    assert "another disk probe is running" in busy["error"]
    done = svc._disk_probe({"bytes": 2 * MIB, "seconds": 5.0}, key("a"), "test")
    assert done["bytes"] == 2 * MIB and done["removed"] and not list(tmp_path.iterdir())
    assert "subtree lab/ does not exist" in svc._disk_probe({"bytes": MIB}, key("b", "lab"), "test")["error"]
    (tmp_path / "lab").mkdir()
    assert svc._disk_probe({"bytes": MIB}, key("c", "lab"), "test")["where"] == "lab/"
    with pytest.raises(Exception, match="bytes must be a number"):
        svc._disk_probe({"bytes": 1 << 40}, key("d"), "test")


def test_a_doctor_connection_is_served_after_authentication_and_ends_when_the_receiver_stops(tmp_path, secret):
    from agentkit import start_receiver
    from transfer_agent.sending.doctor_probe import PathProbe
    from transfer_agent.wire.auth import load_secret
    from transfer_agent.wire.protocol import Frame

    rcv = start_receiver(tmp_path / "dst", secret)
    try:
        hs = PathProbe("127.0.0.1", rcv.port, load_secret(secret), None)._connect("control")
        sock = hs.link.sock
        hs.link.send(Frame.PING, {"n": 1})
        ftype, _fid, body = hs.link.recv()
        assert ftype == Frame.PONG and body["n"] == 1 and abs(body["clock"] - time.time()) < 5
        sock.settimeout(10)
        t0 = time.monotonic()
        rcv.stop()
        assert sock.recv(1) == b""  # closed by the receiver, not left to its 60 s idle limit
        assert time.monotonic() - t0 < 3
        sock.close()
    finally:
        rcv.stop()


# -- the command over loopback -----------------------------------------------------------------------------------
def _doctor(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "FSTREAM_STATE_DIR": str(tmp_path / "state")}  # no default secret to fall back on
    return subprocess.run([sys.executable, "-m", "transfer_agent.cli", "doctor", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


QUICK = ("--seconds", "0.3", "--streams", "2", "--disk-bytes", "4MiB")


def test_doctor_over_loopback_reports_facts_rates_disk_and_a_verdict(tmp_path, rx, secret):
    from inotify_simple import INotify, flags

    ino = INotify()
    ino.add_watch(rx.root, flags.CREATE | flags.DELETE)
    try:
        cp = _doctor(tmp_path, "--to", f"fstream://127.0.0.1:{rx.port}/x", "--secret-file", str(secret), "--json",
                     *QUICK)
        events = [(e.name, e.mask) for e in ino.read(timeout=1000)]
    finally:
        ino.close()
    assert cp.returncode in (0, 1), cp.stderr
    doc = json.loads(cp.stdout)
    with open("/proc/sys/net/ipv4/tcp_rmem") as f:
        assert doc["receiver"]["sysctl"]["net.ipv4.tcp_rmem"] == " ".join(f.read().split())
    assert doc["receiver"]["interface"] == "lo" and doc["receiver"]["interface_mtu"] > 0
    assert doc["receiver"]["root"]["free_bytes"] > 0 and doc["sender"]["route_mtu"] > 0
    assert doc["rtt"]["median_s"] > 0 and len(doc["rtt"]["samples_s"]) == 7
    assert abs(doc["clock"]["skew_s"]) < 0.1  # one host, one clock
    assert doc["rate"]["single"]["bps"] > 0 and doc["rate"]["parallel"]["bps"] > 0
    assert doc["rate"]["parallel"]["streams"] == 2
    # the disk probe wrote its temp file under the root and removed it
    name = doc["disk"]["file"]
    assert doc["disk"]["bytes"] == 4 * MIB and doc["disk"]["removed"] is True
    assert (name, flags.CREATE) in events and (name, flags.DELETE) in events, events
    assert not [p for p in Path(rx.root).iterdir()]
    assert doc["secrets"] == [{"path": str(secret), "what": "secret file", "mode": "0600", "ok": True}]
    assert doc["verdict"] in VERDICTS and doc["reason"]
    assert all({"code", "severity", "side", "text", "settings"} <= set(a) for a in doc["advice"])
    assert cp.returncode == (0 if doc["verdict"] == "none found" else 1) == doc["exit"]
    assert rx.stats["sessions"] == 0  # probes open no session


def test_the_text_report_ends_with_the_verdict(tmp_path, rx, secret):
    cp = _doctor(tmp_path, "--to", f"fstream://127.0.0.1:{rx.port}/", "--secret-file", str(secret), "--no-disk",
                 *QUICK[:4])
    assert cp.returncode in (0, 1), cp.stderr
    lines = cp.stdout.splitlines()
    assert lines[0] == f"fstream doctor: fstream://127.0.0.1:{rx.port}"
    assert any(line.split()[:1] == ["RTT"] for line in lines) and "ADVICE" in cp.stdout
    assert lines[-1].startswith("VERDICT: ")


@pytest.mark.parametrize("native_off", ["receiver", "this host"])
def test_doctor_reports_whether_each_end_hashes_natively(tmp_path, secret, native_off):
    """Issue 39: a real ``fstream receive`` and ``fstream doctor``, one of them with ``FSTREAM_NATIVE=0``: the
    report says which end reads each received file back, and why."""
    import importlib.util

    built = importlib.util.find_spec("transfer_agent.storage._blake3tree") is not None
    base = {k: v for k, v in os.environ.items() if k != "FSTREAM_NATIVE"}
    off = {"FSTREAM_NATIVE": "0"}
    rx_env = {**base, **(off if native_off == "receiver" else {}), "FSTREAM_STATE_DIR": str(tmp_path / "rstate")}
    proc = subprocess.Popen([sys.executable, "-m", "transfer_agent.cli", "receive", "--listen", "127.0.0.1:0",
                             "--root", str(tmp_path / "dst"), "--secret-file", str(secret)],
                            env=rx_env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(proc.stdout.readline().rsplit(":", 1)[1])  # "listening on 127.0.0.1:PORT"
        env = {**base, **(off if native_off == "this host" else {}), "FSTREAM_STATE_DIR": str(tmp_path / "state")}
        args = [sys.executable, "-m", "transfer_agent.cli", "doctor", "--to", f"fstream://127.0.0.1:{port}",
                "--secret-file", str(secret), "--no-disk", *QUICK[:4]]
        js = subprocess.run([*args, "--json"], capture_output=True, text=True, timeout=60, env=env)
        text = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(20)
    assert js.returncode in (0, 1) and text.returncode in (0, 1), js.stderr + text.stderr
    doc = json.loads(js.stdout)
    ends = {"receiver": doc["receiver"]["native_hashing"], "this host": doc["native_hashing"]}
    assert ends[native_off] == {"in_use": False, "why_not": "FSTREAM_NATIVE=0", "read_back_per_file": True}
    other = ends["this host" if native_off == "receiver" else "receiver"]
    assert other["in_use"] is built and other["read_back_per_file"] is not built
    lines = [line.strip() for line in text.stdout.splitlines()]
    at = next(i for i, line in enumerate(lines) if line.startswith("native hashing"))
    said = [lines[at].removeprefix("native hashing").strip(), lines[at + 1]]  # the receiver's row, then ours
    assert [s.split(":")[0] for s in said] == ["receiver", "this host"], text.stdout
    assert f"{native_off}: not in use (FSTREAM_NATIVE=0): one read-back per received file" in said, text.stdout


@pytest.mark.skipif(subprocess.run(["which", "openssl"], capture_output=True).returncode != 0,
                    reason="openssl CLI not installed (needed to make test certificates)")
def test_doctor_over_mutual_tls_probes_and_warns_of_a_readable_tls_key(tmp_path):
    from test_receiver_refusals import _make_certs
    from transfer_agent.receiving.receiver import Receiver
    from transfer_agent.wire.auth import TLSConfig

    c = _make_certs(tmp_path)
    os.chmod(c["client.key"], 0o640)
    rcv = Receiver(listen=("127.0.0.1", 0), root=str(tmp_path / "dst"),
                   tls=TLSConfig(c["server.pem"], c["server.key"], c["ca.pem"])).start()
    try:
        cp = _doctor(tmp_path, "--to", f"fstream://127.0.0.1:{rcv.port}/", "--tls-cert", c["client.pem"],
                     "--tls-key", c["client.key"], "--tls-ca", c["ca.pem"], "--json", *QUICK)
    finally:
        rcv.stop()
    assert cp.returncode in (0, 1), cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["rate"]["single"]["bps"] > 0 and doc["rate"]["parallel"]["bps"] > 0 and doc["disk"]["bytes"] > 0
    perms = next(a for a in doc["advice"] if a["code"] == "secret_perms")
    assert perms["severity"] == "warn" and f"TLS key {c['client.key']} is mode 0640" in perms["text"]


def test_a_secret_file_others_may_read_is_named_and_not_used(tmp_path, rx, secret):
    secret.chmod(0o644)
    cp = _doctor(tmp_path, "--to", f"fstream://127.0.0.1:{rx.port}/", "--secret-file", str(secret), "--json")
    assert cp.returncode == 2
    assert f"fstream doctor: error: secret file {secret} is mode 0644" in cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["secrets"][0]["mode"] == "0644" and doc["secrets"][0]["ok"] is False
    assert [a["code"] for a in doc["advice"]] == ["secret_perms"] and "rtt" not in doc


def test_a_wrong_secret_gets_nothing_from_the_receiver(tmp_path, rx):
    from agentkit import write_secret

    wrong = write_secret(tmp_path / "wrong")
    cp = _doctor(tmp_path, "--to", f"fstream://127.0.0.1:{rx.port}/", "--secret-file", str(wrong), "--json")
    assert cp.returncode == 2 and cp.stdout == ""
    assert "fstream doctor: error:" in cp.stderr and "authentication failed" in cp.stderr


def test_an_unreachable_receiver_exits_75_quickly(tmp_path, secret):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    t0 = time.monotonic()
    cp = _doctor(tmp_path, "--to", f"fstream://127.0.0.1:{port}/", "--secret-file", str(secret), "--json")
    assert cp.returncode == 75, cp.stderr
    assert time.monotonic() - t0 < 10
    assert "unreachable" in cp.stderr and json.loads(cp.stdout)["reachable"] is False


@pytest.mark.parametrize("args, says", [
    (("--streams", "0"), "--streams 0: 1 to 32 streams"),
    (("--seconds", "20s"), "--seconds 20: a rate probe lasts 0.2 to 10 s"),
    (("--disk-bytes", "1GiB"), "--disk-bytes"),
])
def test_bad_options_exit_2_naming_the_option(tmp_path, secret, args, says):
    cp = _doctor(tmp_path, "--to", "fstream://127.0.0.1:9/", "--secret-file", str(secret), *args)
    assert cp.returncode == 2 and says in cp.stderr, cp.stderr


def test_a_bad_url_exits_2(tmp_path, secret):
    cp = _doctor(tmp_path, "--to", "http://127.0.0.1:9/", "--secret-file", str(secret))
    assert cp.returncode == 2 and "scheme must be fstream://" in cp.stderr


# -- the emulated WAN --------------------------------------------------------------------------------------------
@pytest.mark.wan
@pytest.mark.serial  # one emulated WAN at a time (namespaces, TUN delay line)
def test_doctor_names_a_small_buffer_as_the_buffer_cap_on_the_wan(tmp_path, monkeypatch):
    import wankit

    wankit.require_wan("WAN testbed")
    from fstream_bench.peers.base import Sites
    from fstream_bench.peers.fstream import FStreamReceiver, fstream_argv
    from fstream_bench.wan import netns
    from fstream_bench.wan.path import WanConfig, WanPath

    monkeypatch.setenv("FSTREAM_STATE_DIR", str(tmp_path / "state"))
    path = WanPath(WanConfig.from_text(rate="200Mbit", rtt="40ms", buffer="256KiB",
                                       run_id="td" + secrets.token_hex(3)))
    try:
        path.up()
        sites = Sites(src_host=path.src_ip, dst_host=path.dst_ip, name="wan",
                      src_prefix=tuple(netns.ns_exec_argv(path.src_ns, [])),
                      dst_prefix=tuple(netns.ns_exec_argv(path.dst_ns, [])))
        with FStreamReceiver(sites=sites, workdir=tmp_path / "rx", root=tmp_path / "dst") as rx:
            cp = subprocess.run(sites.argv("src", [*fstream_argv(), "doctor", "--to", rx.url(""), "--secret-file",
                                                   str(rx.secret), "--json", "--seconds", "2", "--no-disk"]),
                                capture_output=True, text=True, timeout=120)
    finally:
        path.down()
    assert path.src_ns not in netns.list_namespaces()
    assert cp.returncode == 1, cp.stderr
    doc = json.loads(cp.stdout)
    assert abs(doc["rtt"]["median_s"] - 0.040) < 0.005
    assert doc["receiver"]["sysctl"]["net.ipv4.tcp_rmem"].split()[-1] == str(256 << 10)
    assert doc["verdict"] == "buffer cap", (doc["reason"], doc["rate"])
    single, parallel = doc["rate"]["single"]["bps"], doc["rate"]["parallel"]["bps"]
    assert single <= 1.25 * doc["window_cap_bps"] and parallel >= 1.4 * single
    rmem = next(a for a in doc["advice"] if a["code"] == "rmem_cap")
    assert rmem["severity"] == "cause" and "net.ipv4.tcp_rmem" in rmem["text"] and "net.core.rmem_max" in rmem["text"]
    assert int(rmem["settings"]["net.core.rmem_max"]) >= 2 * doc["bdp_bytes"]


# -- review fixes (issue 30): bounds on what an authenticated key can make the receiver do ---------------------
def _keyed_receiver(tmp_path: Path, body: str, **kw):
    """A receiver with a keyring file (``body``; secret files ``keys/<id>`` made for keys a and q)."""
    from agentkit import write_secret
    from transfer_agent.receiving.keyring import load_keyring
    from transfer_agent.receiving.receiver import Receiver

    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("a", "q"):
        write_secret(keys / name)
    (keys / "ring.toml").write_text(body)
    (tmp_path / "dst").mkdir(exist_ok=True)
    return Receiver(listen=("127.0.0.1", 0), root=str(tmp_path / "dst"), keyring=load_keyring(keys / "ring.toml"),
                    **kw).start(), keys


def _control(port: int, secret_file: Path, key_id: str | None = None):
    from transfer_agent.sending.doctor_probe import PathProbe
    from transfer_agent.wire.auth import load_secret

    return PathProbe("127.0.0.1", port, load_secret(secret_file), None, key_id=key_id)._connect("control")


def _ask(hs, ftype, body: dict) -> dict:
    from transfer_agent.sending.doctor_probe import PathProbe

    hs.link.send(ftype, body)
    return PathProbe._expect(hs.link, ftype)


def test_one_disk_probe_per_key_a_minute_and_no_more_than_its_quota_left(tmp_path):
    from transfer_agent.wire.protocol import Frame

    rx, keys = _keyed_receiver(tmp_path, '[keys.a]\nsecret_file = "a"\n'
                                         '[keys.q]\nsecret_file = "q"\nsubtree = "q"\nquota = "3MiB"\n')
    try:
        (tmp_path / "dst" / "q").mkdir()
        (tmp_path / "dst" / "q" / "held.dat").write_bytes(bytes(MIB))  # q holds 1 MiB of its 3 MiB
        hs = _control(rx.port, keys / "a", "a")
        try:
            first = _ask(hs, Frame.DISK, {"bytes": 2 * MIB, "seconds": 5.0})
            assert first["bytes"] == 2 * MIB and first["removed"]
            t0 = time.monotonic()
            again = _ask(hs, Frame.DISK, {"bytes": 2 * MIB, "seconds": 5.0})
            assert "bytes" not in again
            assert again["error"].startswith("disk probe refused: key 'a' ran one 0 s ago and may run one per 60 s: "
                                             "try again in 60 s"), again
            assert 59 <= again["retry_after_s"] <= 60
        finally:
            hs.link.sock.close()
        hs = _control(rx.port, keys / "a", "a")  # a new connection does not reset it
        try:
            later = _ask(hs, Frame.DISK, {"bytes": 2 * MIB, "seconds": 5.0})
            assert later["error"].startswith("disk probe refused: key 'a'")
            assert later["retry_after_s"] <= 60 - (time.monotonic() - t0) + 0.2
        finally:
            hs.link.sock.close()
        hs = _control(rx.port, keys / "q", "q")  # another key has its own minute; its quota caps the probe
        try:
            capped = _ask(hs, Frame.DISK, {"bytes": 8 * MIB, "seconds": 5.0})
            assert capped["bytes"] == 2 * MIB and capped["where"] == "q/", capped
        finally:
            hs.link.sock.close()
    finally:
        rx.stop()
    assert sorted(p.name for p in (tmp_path / "dst").rglob("*")) == ["held.dat", "q"]


def test_a_doctor_connection_ends_at_its_lifetime_whatever_it_sends(tmp_path, secret, monkeypatch):
    from agentkit import start_receiver
    from transfer_agent.errors import FStreamError
    from transfer_agent.wire.protocol import Frame

    monkeypatch.setattr(rdoctor, "MAX_LIFETIME_S", 1.0)
    monkeypatch.setattr(rdoctor, "LIFETIME_GRACE_S", 0.5)
    rcv = start_receiver(tmp_path / "dst", secret)
    try:
        hs = _control(rcv.port, secret)
        t0 = time.monotonic()
        pongs, ended = 0, None
        try:
            while time.monotonic() - t0 < 10 and ended is None:  # PINGs every 0.1 s: never idle
                try:
                    hs.link.send(Frame.PING, {"n": pongs})
                    ftype, _fid, body = hs.link.recv()
                except FStreamError as exc:
                    ended = str(exc)
                    break
                if ftype == Frame.ERROR:
                    ended = body["message"]
                else:
                    assert ftype == Frame.PONG
                    pongs += 1
                    time.sleep(0.1)  # the pace of the PINGs
            took = time.monotonic() - t0
            assert ended == "doctor connection closed: open for 1 s, the limit of one; connect again", ended
            assert 0.9 <= took < 3 and pongs >= 5
            hs.link.sock.settimeout(5)
            assert hs.link.sock.recv(1) == b""  # and closed
        finally:
            hs.link.sock.close()
        # a peer that starts a request and never finishes it is cut too (a socket shutdown backs the limit up)
        hs = _control(rcv.port, secret)
        try:
            t0 = time.monotonic()
            hs.link.sock.sendall(b"FS")  # two bytes of a frame header, then nothing
            hs.link.sock.settimeout(10)
            assert hs.link.sock.recv(65536) == b""
            assert time.monotonic() - t0 < 3
        finally:
            hs.link.sock.close()
    finally:
        rcv.stop()


def test_stale_doctor_temp_files_are_removed_as_the_receiver_starts(tmp_path, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="fstream.receiver")
    dst = tmp_path / "dst"
    old = time.time() - 2 * 3600
    files = {"root": dst / ".fstream-doctor-0a1b.tmp", "sub": dst / "q" / ".fstream-doctor-2c3d.tmp",
             "fresh": dst / ".fstream-doctor-4e5f.tmp", "deep": dst / "q" / "deeper" / ".fstream-doctor-6a7b.tmp",
             "other": dst / "q" / "data.tmp"}
    for name, path in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
        if name != "fresh":
            os.utime(path, (old, old))
    rx, _keys = _keyed_receiver(tmp_path, '[keys.a]\nsecret_file = "a"\n[keys.q]\nsecret_file = "q"\nsubtree = "q"\n')
    try:
        assert rx.swept.wait(10)
    finally:
        rx.stop()
    assert {n for n, p in files.items() if p.exists()} == {"fresh", "deep", "other"}  # no walk below the subtrees
    said = [r.getMessage() for r in caplog.records if "stale doctor temp file" in r.getMessage()]
    assert sorted(said) == ["removed the stale doctor temp file .fstream-doctor-0a1b.tmp (older than 3600 s)",
                            "removed the stale doctor temp file q/.fstream-doctor-2c3d.tmp (older than 3600 s)"]


def test_doctor_probes_a_receiver_that_requires_encryption(tmp_path, secret):
    from agentkit import start_receiver

    rcv = start_receiver(tmp_path / "dst", secret, require_encryption=True)
    try:
        cp = _doctor(tmp_path, "--to", f"fstream://127.0.0.1:{rcv.port}/", "--secret-file", str(secret), "--json",
                     *QUICK)
    finally:
        rcv.stop()
    assert cp.returncode in (0, 1), cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["rtt"]["median_s"] > 0 and doc["receiver"]["root"]["free_bytes"] > 0
    assert doc["rate"]["single"]["bps"] > 0 and doc["rate"]["parallel"]["bps"] > 0 and doc["disk"]["bytes"] == 4 * MIB
