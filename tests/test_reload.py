"""SIGHUP reloads the configuration (issue 30): a real `fstream receive` / `fstream agent` started from a config file
re-reads it, changes limits, the metrics listener and the log level in place, names what needs a restart, refuses
a bad file keeping what runs, and a transfer running across the reload lands without a session failure."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import unitkit
from agentkit import make_files, trees_identical, wait_until, write_secret

from fstream_provider.model.spec import TransferSpec
from transfer_agent.sending.sender import Transfer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """A real `fstream` daemon with its stderr read line by line in a thread (``lines``)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "transfer_agent.cli", *argv], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.out: list[str] = []
        for stream, sink in ((self.proc.stderr, self.lines), (self.proc.stdout, self.out)):
            threading.Thread(target=lambda s=stream, k=sink: [k.append(x) for x in s], daemon=True).start()

    def said(self, text: str) -> str | None:
        return next((x for x in list(self.lines) if text in x), None)

    def close(self) -> None:
        unitkit.interrupt(self.proc)


def _env(tmp_path: Path, config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSTREAM_")}
    return {**env, "FSTREAM_STATE_DIR": str(tmp_path / "state"), "FSTREAM_CONFIG": str(config)}


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):  # nothing listening (yet)
        return 0


def _refused(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5)
    except (ConnectionRefusedError, urllib.error.URLError) as exc:
        return isinstance(exc, ConnectionRefusedError) or isinstance(getattr(exc, "reason", None),
                                                                      ConnectionRefusedError)
    return False


def _receive_config(path: Path, port: int, root: Path, secret: Path, metrics: int, **extra: Any) -> None:
    lines = [f'listen = "127.0.0.1:{port}"', f'root = "{root}"', f'secret-file = "{secret}"']
    lines += [f"{k} = {v!r}".replace("'", '"') if not isinstance(v, bool) else f"{k} = {str(v).lower()}"
              for k, v in extra.items()]
    path.write_text("[receive]\n" + "\n".join(lines) + f'\n[metrics]\nlisten = "127.0.0.1:{metrics}"\n')


def test_sighup_changes_the_receiver_in_place_and_a_running_transfer_lands(tmp_path):
    secret = write_secret(tmp_path / "secret")
    cfg = tmp_path / "fstream.toml"
    port, m1, m2 = _free_port(), _free_port(), _free_port()
    _receive_config(cfg, port, tmp_path / "dst", secret, m1)
    rcv = Daemon(["receive"], _env(tmp_path, cfg))
    try:
        wait_until(lambda: any("listening on" in x for x in rcv.out), 30, "the receiver listening")
        wait_until(lambda: _get(f"http://127.0.0.1:{m1}/healthz") == 200, 10, "metrics on the first address")
        src = make_files(tmp_path / "src", {f"f{i:02d}.bin": 1 << 20 for i in range(24)}, seed=8)
        spec = TransferSpec.from_options([str(src)], f"fstream://127.0.0.1:{port}/out", secret_file=str(secret),
                                         tuner="fstream", target_throughput="40Mbps", cc=1, p=1)
        events: list[tuple[str, dict]] = []
        out: dict[str, Any] = {}
        sender = threading.Thread(target=lambda: out.setdefault(
            "r", Transfer(spec, on_event=lambda k, d: events.append((k, d))).run()))
        sender.start()
        wait_until(lambda: any(k == "file" for k, _ in events), 30, "a file landed before the reload")
        # a stricter receiver, the metrics elsewhere, more logging, and a new listen address (restart only)
        _receive_config(cfg, _free_port(), tmp_path / "dst", secret, m2, require_encryption=True, log_level="info")
        assert not [x for x in rcv.lines if " INFO " in x]  # warnings only, so far
        rcv.proc.send_signal(signal.SIGHUP)
        line = wait_until(lambda: rcv.said("configuration reloaded"), 20, "the reload logged")
        assert "require_encryption: False -> True" in line and "metrics_listen" in line
        assert "needs a restart: listen" in line
        wait_until(lambda: _get(f"http://127.0.0.1:{m2}/healthz") == 200, 10, "metrics on the new address")
        assert _refused(f"http://127.0.0.1:{m1}/metrics")
        plain = make_files(tmp_path / "plain", {"x.bin": 1000}, seed=9)
        late = Transfer(TransferSpec.from_options([str(plain)], f"fstream://127.0.0.1:{port}/late",
                                                  secret_file=str(secret), tuner="fixed"),
                        max_session_retries=0).run()
        assert not late.ok and "encrypt" in (late.error or "")  # the new limit holds for new sessions
        assert "log_level: None -> 'info'" in line
        wait_until(lambda: [x for x in rcv.lines if " INFO " in x], 10, "an INFO line, logged since the reload")
        sender.join(60)
        result = out["r"]
        assert result.ok and result.verified_files == 24, result.error
        assert not [d for k, d in events if k == "log" and "session failed" in str(d.get("message"))]
        assert trees_identical(src, tmp_path / "dst" / "out")
    finally:
        rcv.close()


def test_a_bad_file_is_refused_on_sighup_and_the_running_configuration_stays(tmp_path):
    secret = write_secret(tmp_path / "secret")
    cfg = tmp_path / "fstream.toml"
    port, m1 = _free_port(), _free_port()
    _receive_config(cfg, port, tmp_path / "dst", secret, m1)
    rcv = Daemon(["receive"], _env(tmp_path, cfg))
    try:
        wait_until(lambda: any("listening on" in x for x in rcv.out), 30, "the receiver listening")
        cfg.write_text(cfg.read_text().replace("[receive]\n", "[receive]\nmax-unauth = \"lots\"\n"))
        rcv.proc.send_signal(signal.SIGHUP)
        line = wait_until(lambda: rcv.said("reload refused"), 20, "the refusal")
        assert "max-unauth" in line and "lots" in line
        assert _get(f"http://127.0.0.1:{m1}/healthz") == 200  # still serving as before
        with socket.socket() as busy:  # a new metrics address that is taken: refused, the old one keeps serving
            busy.bind(("127.0.0.1", 0))
            busy.listen(1)
            _receive_config(cfg, port, tmp_path / "dst", secret, busy.getsockname()[1])
            rcv.proc.send_signal(signal.SIGHUP)
            line = wait_until(lambda: [x for x in rcv.lines if "reload refused" in x and "cannot listen" in x], 20,
                              "the busy address refused")[0]
            assert "stays on its old address" in line
            assert _get(f"http://127.0.0.1:{m1}/healthz") == 200
        src = make_files(tmp_path / "src", {"a.bin": 5000}, seed=10)
        r = Transfer(TransferSpec.from_options([str(src)], f"fstream://127.0.0.1:{port}/out",
                                               secret_file=str(secret), tuner="fixed")).run()
        assert r.ok and rcv.proc.poll() is None
    finally:
        rcv.close()


def test_sighup_changes_the_agents_limits_and_metrics_address(tmp_path, redis_url):
    import authkit

    secret = write_secret(tmp_path / "secret")
    policy = authkit.policy_file(tmp_path, secret)
    cfg = tmp_path / "fstream.toml"
    m1, m2 = _free_port(), _free_port()
    body = (f'[agent]\npolicy = "{policy}"\nmax-retries = 3\nname = "reloading"\n[redis]\nurl = "{redis_url}"\n'
            f'namespace = "reload"\n')
    cfg.write_text(body + f'[metrics]\nlisten = "127.0.0.1:{m1}"\n')
    agent = Daemon(["agent"], _env(tmp_path, cfg))
    try:
        wait_until(lambda: _get(f"http://127.0.0.1:{m1}/readyz") == 200, 30, "the agent ready")
        cfg.write_text(body.replace("max-retries = 3", "max-retries = 7") + f'[metrics]\nlisten = "127.0.0.1:{m2}"\n')
        agent.proc.send_signal(signal.SIGHUP)
        line = wait_until(lambda: agent.said("configuration reloaded"), 20, "the reload logged")
        assert "max_retries: 3 -> 7" in line and "restart" not in line
        wait_until(lambda: _get(f"http://127.0.0.1:{m2}/readyz") == 200, 10, "metrics on the new address")
        assert _refused(f"http://127.0.0.1:{m1}/metrics")
        assert agent.proc.poll() is None
    finally:
        agent.close()


def test_each_live_option_reaches_its_attribute_converted():
    """The setter tables (issue 42): every plain live option lands on its attribute, converted from its text."""
    from types import SimpleNamespace

    from transfer_agent.cli.reload import agent_apply, receiver_apply

    agent = SimpleNamespace()
    done = agent_apply(agent, None, "", None)(
        {"max_retries": "7", "max_deliveries": "9", "claim_idle": "2m", "drain_grace": "30s"})
    assert done == ["max_retries", "max_deliveries", "claim_idle", "drain_grace"]
    assert (agent.max_retries, agent.max_deliveries, agent.claim_idle_ms, agent.drain_grace) == (7, 9, 120_000, 30.0)
    rcv = SimpleNamespace()
    done = receiver_apply(rcv, None, SimpleNamespace())(
        {"handshake_timeout": "1500ms", "require_encryption": 1, "max_part_age": "2h", "drain_grace": "5s"})
    assert done == ["handshake_timeout", "require_encryption", "max_part_age", "drain_grace"]
    assert (rcv.handshake_timeout, rcv.require_encryption, rcv.part_max_age) == (1.5, True, 7200.0)
    assert not hasattr(rcv, "drain_grace")  # checked only: the receiver reads args.drain_grace when it drains
