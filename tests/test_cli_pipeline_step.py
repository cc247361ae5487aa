"""``fstream send`` as a pipeline step: ``--manifest``, the documented exit codes, ``--watch --until``.

Real CLI processes against a real loopback receiver; the manifest's checksums are recomputed
from the source bytes, so a wrong or missing digest fails the test.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xxhash

from agentkit import make_files, trees_identical, wait_until
from transfer_agent.cli.exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_RETRY, EXIT_USAGE
from transfer_agent.receiving.receiver import Receiver
from transfer_agent.storage.checksum import hash_fd, hash_fd_also

FSTREAM = [sys.executable, "-m", "transfer_agent.cli"]


def _send(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([*FSTREAM, "send", *args], capture_output=True, text=True, timeout=timeout)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _xxh(path: Path) -> str:
    return xxhash.xxh3_128(path.read_bytes()).hexdigest()


def test_manifest_lists_each_landed_file_with_a_checkable_checksum(tmp_path: Path, secret: Path,
                                                                   rx: Receiver) -> None:
    src = make_files(tmp_path / "run7", {"a.h5": 1 << 20, "sub/b.h5": 3 << 20, "sub/c.txt": 10, "empty": 0})
    manifest = tmp_path / "landed.jsonl"
    url = f"fstream://127.0.0.1:{rx.port}/runs/run7"
    r = _send(str(src), "--to", url, "--secret-file", str(secret), "--json", "--manifest", str(manifest))
    assert r.returncode == EXIT_OK, r.stderr
    assert json.loads(r.stdout)["verified_files"] == 4
    assert trees_identical(src, Path(rx.root) / "runs" / "run7")
    rows = {row["path"]: row for row in _rows(manifest)}
    assert sorted(rows) == ["runs/run7/a.h5", "runs/run7/empty", "runs/run7/sub/b.h5", "runs/run7/sub/c.txt"]
    for rel, row in rows.items():
        landed = Path(rx.root) / rel
        assert row["status"] == "committed"
        assert row["size"] == landed.stat().st_size
        assert row["algo"] == "xxh3_128" and row["checksum"] == _xxh(landed), rel  # keyed transfer, public digest
        assert row["url"] == f"fstream://127.0.0.1:{rx.port}/{rel}"
        assert Path(row["source"]) == src / Path(rel).relative_to("runs/run7")

    # a rerun lands nothing new: every file is listed as skipped, with the same digest
    again = tmp_path / "again.jsonl"
    r = _send(str(src), "--to", url, "--secret-file", str(secret), "--manifest", str(again))
    assert r.returncode == EXIT_OK, r.stderr
    second = {row["path"]: row for row in _rows(again)}
    assert {row["status"] for row in second.values()} == {"skipped"}
    assert {p: row["checksum"] for p, row in second.items()} == {p: row["checksum"] for p, row in rows.items()}


def test_without_manifest_no_public_digest_is_computed(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    """The extra digest costs CPU: only a manifest (or a flow) asks for it."""
    src = make_files(tmp_path / "s", {"a": 1000})
    from agentkit import send

    events: list[dict] = []
    res = send(src, rx.port, secret, on_event=lambda kind, data: events.append(data) if kind == "file" else None)
    assert res.ok and res.checksum == "blake3-keyed"
    assert [e.get("checksum") for e in events] == [None]
    res = send(src, rx.port, secret, dest="o2", public_checksum=True,
               on_event=lambda kind, data: events.append(data) if kind == "file" else None)
    assert res.ok and events[-1]["checksum"] == _xxh(src / "a") and events[-1]["algo"] == "xxh3_128"


def test_hash_fd_also_digests_the_same_bytes_in_one_pass(tmp_path: Path) -> None:
    p = make_files(tmp_path, {"f": (8 << 20) + 123}) / "f"
    import os

    fd = os.open(p, os.O_RDONLY)
    try:
        key = b"k" * 32
        keyed, public = hash_fd_also(fd, p.stat().st_size, "blake3-keyed", key, "xxh3_128")
        assert keyed == hash_fd(fd, p.stat().st_size, "blake3-keyed", key)
        assert public == _xxh(p)
        assert hash_fd_also(fd, p.stat().st_size, "xxh3_128")[1] is None
    finally:
        os.close(fd)


@pytest.mark.slow
def test_unreachable_receiver_exits_retryable(tmp_path: Path, secret: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = make_files(tmp_path / "s", {"a": 100})
    manifest = tmp_path / "m.jsonl"
    r = _send(str(src), "--to", f"fstream://127.0.0.1:{port}/o", "--secret-file", str(secret), "--json",
              "--manifest", str(manifest), timeout=120)
    assert r.returncode == EXIT_RETRY, r.stderr
    out = json.loads(r.stdout)
    assert out["retryable"] is True and out["cancelled"] is False and out["ok"] is False
    assert "retryable" in r.stderr and manifest.read_text() == ""


def test_terminal_refusal_exits_failed(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    """A directory stands where the file must land: retrying cannot help, exit 1."""
    src = make_files(tmp_path / "s", {"a": 100})
    (Path(rx.root) / "o" / "a").mkdir(parents=True)
    r = _send(str(src), "--to", f"fstream://127.0.0.1:{rx.port}/o", "--secret-file", str(secret), "--json")
    assert r.returncode == EXIT_FAILED, (r.returncode, r.stderr)
    out = json.loads(r.stdout)
    assert out["failed_files"] == 1 and out["retryable"] is False


def test_usage_errors_exit_2_and_name_the_option(tmp_path: Path, secret: Path) -> None:
    src = make_files(tmp_path / "s", {"a": 1})
    base = [str(src), "--to", "fstream://127.0.0.1:9/o", "--secret-file", str(secret)]
    r = _send(*base, "--until", "5m")
    assert r.returncode == EXIT_USAGE and "--until" in r.stderr and "--watch" in r.stderr
    r = _send(*base, "--watch", "--until", "next tuesday")
    assert r.returncode == EXIT_USAGE and "--until" in r.stderr and "ISO-8601" in r.stderr
    r = _send(*base, "--manifest", str(tmp_path / "no" / "such" / "dir" / "m.jsonl"))
    assert r.returncode == EXIT_USAGE and "--manifest" in r.stderr


def test_watch_until_stops_and_lists_what_landed(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    src = make_files(tmp_path / "s", {"a": 1000})
    manifest = tmp_path / "m.jsonl"
    t0 = time.monotonic()
    proc = subprocess.Popen([*FSTREAM, "send", str(src), "--to", f"fstream://127.0.0.1:{rx.port}/o",
                             "--secret-file", str(secret), "--watch", "--interval", "0.2s", "--until", "4s",
                             "--manifest", str(manifest), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_until(lambda: (Path(rx.root) / "o" / "a").exists(), 20, "first file landed")
        (src / "b").write_bytes(b"late" * 100)  # arrives while the step runs
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_OK, err
    assert time.monotonic() - t0 >= 3.5  # it ran until --until, not until the first idle moment
    assert sorted(row["path"] for row in _rows(manifest)) == ["o/a", "o/b"]
    assert json.loads(out)["verified_files"] == 2


def test_interrupted_watch_exits_130(tmp_path: Path, secret: Path, rx: Receiver) -> None:
    src = make_files(tmp_path / "s", {"a": 1000})
    proc = subprocess.Popen([*FSTREAM, "send", str(src), "--to", f"fstream://127.0.0.1:{rx.port}/o",
                             "--secret-file", str(secret), "--watch", "--interval", "0.2s", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (Path(rx.root) / "o" / "a").exists(), 20, "first file landed")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert json.loads(out)["cancelled"] is True
