"""Snakemake runs example_snakemake/Snakefile for real: fstream ships a tree, the catalog rule reads its manifest."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash
from agentkit import make_files, trees_identical

ROOT = Path(__file__).resolve().parents[1]
SNAKEFILE = "example_snakemake/Snakefile"  # relative to ROOT, as the README runs it
# `make test` installs Snakemake into a venv of its own (its dependencies may clash with Airflow's)
SNAKEMAKE = Path(os.environ.get("FSTREAM_SNAKEMAKE", ROOT / ".venv-snakemake" / "bin" / "snakemake"))
DEST = "runs/run42"
SIZES = {
    "run.json": 300,
    "frames/f000.raw": 700_000,
    "frames/f001.raw": 1_300_000,
    "frames/dark/d000.raw": 65_536,
    "empty.flag": 0,
}

pytestmark = pytest.mark.skipif(
    not SNAKEMAKE.exists(),
    reason=f"{SNAKEMAKE} is missing: `make test` installs Snakemake into .venv-snakemake "
           "(or run `make .venv-snakemake/.installed-stamp`)",
)


def run_snakemake(tmp_path: Path, *args: str, **config: object) -> subprocess.CompletedProcess[str]:
    """``snakemake -s example_snakemake/Snakefile --cores 2 [args] --config ...``, outputs under ``tmp_path/work``."""
    env = dict(os.environ)
    # the Snakefile's shell commands call `fstream`: this interpreter's venv provides it
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["FSTREAM_STATE_DIR"] = str(tmp_path / "state")
    cmd = [str(SNAKEMAKE), "-s", SNAKEFILE, "--cores", "2", "--directory", str(tmp_path / "work"),
           *args, "--config", *(f"{k}={v}" for k, v in config.items())]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_snakemake_ships_a_tree_and_catalogs_the_manifest(tmp_path: Path, rx, secret: Path) -> None:
    src = make_files(tmp_path / "instrument", SIZES)
    to = f"fstream://127.0.0.1:{rx.port}/{DEST}"

    r = run_snakemake(tmp_path, src=src, to=to, secret_file=secret)

    assert r.returncode == 0, r.stderr[-4000:]
    assert trees_identical(src, tmp_path / "dst" / DEST), "the receiver's tree differs from the source"

    out = tmp_path / "work" / "results"
    records = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines() if line.strip()]
    by_path = {rec["path"]: rec for rec in records}
    assert len(records) == len(by_path), f"a file is listed twice: {sorted(rec['path'] for rec in records)}"
    assert sorted(by_path) == sorted(f"{DEST}/{rel}" for rel in SIZES)
    for rel, size in SIZES.items():
        rec, data = by_path[f"{DEST}/{rel}"], (src / rel).read_bytes()
        assert rec["status"] == "committed", rec
        assert rec["size"] == size == len(data), rec
        assert (rec["algo"], rec["checksum"]) == ("xxh3_128", xxhash.xxh3_128_hexdigest(data)), rec
        assert rec["source"] == str(src / rel), rec
        assert rec["url"] == f"fstream://127.0.0.1:{rx.port}/{DEST}/{rel}", rec

    summary = json.loads((out / "summary.json").read_text())
    assert (summary["files"], summary["failed_files"]) == (len(SIZES), 0), summary

    rows = [line.split("\t") for line in (out / "catalog.tsv").read_text().splitlines()]
    assert rows[0] == ["path", "size", "algo", "checksum"]
    assert rows[1:] == [[p, str(by_path[p]["size"]), "xxh3_128", by_path[p]["checksum"]] for p in sorted(by_path)]
    assert (out / "logs" / "ship.attempts").read_text().splitlines() == ["attempt 1: fstream exit 0"]

    # a forced rerun finds every file on the receiver: each is listed again, skipped, and the catalog is the same
    again = run_snakemake(tmp_path, "--forceall", src=src, to=to, secret_file=secret)
    assert again.returncode == 0, again.stderr[-4000:]
    rerun = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines() if line.strip()]
    assert sorted((r["path"], r["status"]) for r in rerun) == [(p, "skipped") for p in sorted(by_path)]
    assert [line.split("\t") for line in (out / "catalog.tsv").read_text().splitlines()] == rows


def test_unreachable_receiver_is_retried_on_75_and_leaves_no_catalog(tmp_path: Path, secret: Path) -> None:
    src = make_files(tmp_path / "instrument", {"a.raw": 1000})

    # fstream reconnects for about 17 s before it gives up with 75: one Snakemake retry keeps this test short
    r = run_snakemake(tmp_path, src=src, to=f"fstream://127.0.0.1:{closed_port()}/{DEST}", secret_file=secret,
                      retries=1)

    assert r.returncode != 0
    out = tmp_path / "work" / "results"
    assert (out / "logs" / "ship.attempts").read_text().splitlines() == [
        "attempt 1: fstream exit 75", "attempt 2: fstream exit 75"]
    log = (out / "logs" / "ship.log").read_text()
    assert "Connection refused" in log and "fstream exit 75" in log, log
    assert "returned non-zero exit status 75" in r.stderr, r.stderr[-4000:]
    assert not (out / "catalog.tsv").exists()
    assert not (out / "manifest.jsonl").exists()  # Snakemake removes a failed job's outputs


def test_a_non_retryable_exit_is_not_sent_again(tmp_path: Path) -> None:
    src = make_files(tmp_path / "instrument", {"a.raw": 1000})

    r = run_snakemake(tmp_path, src=src, to=f"fstream://127.0.0.1:{closed_port()}/{DEST}",
                      secret_file=tmp_path / "no-such-secret", retries=2)

    assert r.returncode != 0
    out = tmp_path / "work" / "results"
    # exit 2 (configuration): Snakemake's two retries stop at the gate instead of running fstream again
    assert (out / "logs" / "ship.attempts").read_text().splitlines() == ["attempt 1: fstream exit 2"]
    log = (out / "logs" / "ship.log").read_text()
    assert "attempt 3: not sent again, fstream's last exit (2) is not retryable" in log, log
    assert not (out / "catalog.tsv").exists()


@pytest.mark.parametrize("status, says", [(None, "empty, no file landed"), ("failed", "1 file(s) not landed")])
def test_catalog_rule_refuses_an_empty_manifest_or_a_file_not_landed(tmp_path: Path, status: str | None,
                                                                      says: str) -> None:
    # fstream exits 0 only when every file landed, so a stub stands in to get past `ship` with such a manifest
    record = json.dumps({"path": f"{DEST}/a.raw", "size": 1000, "algo": "xxh3_128", "checksum": "00",
                         "status": status})
    stub = tmp_path / "fake-fstream"
    stub.write_text("#!/bin/bash\nwhile [ $# -gt 0 ]; do [ \"$1\" = --manifest ] && m=$2; shift; done\n"
                    + (f"echo '{record}' > \"$m\"\n" if status else ': > "$m"\n') + "echo '{\"files\": 1}'\n")
    stub.chmod(0o755)
    src = make_files(tmp_path / "instrument", {"a.raw": 1000})

    r = run_snakemake(tmp_path, src=src, to=f"fstream://127.0.0.1:1/{DEST}", fstream=stub)

    assert r.returncode != 0
    out = tmp_path / "work" / "results"
    assert says in (out / "logs" / "catalog.log").read_text() and says in r.stderr, r.stderr[-4000:]
    assert not (out / "catalog.tsv").exists()
