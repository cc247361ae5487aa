"""bench/core's shared pieces (issue 42's mends): stopping a child, reaping its CPU, writing a result with its
markdown, and the scheduling-cycle bench writing its result through ``run_saved``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fstream_bench.core import provenance
from fstream_bench.core.children import end
from fstream_bench.core.cpu_meter import reap
from fstream_bench.core.saved import save_with_markdown

STUBBORN = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            "time.sleep(60)")


def _started(code: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"  # the handler is in place before we signal it
    return p


def test_end_terminates_a_child_and_kills_one_that_ignores_sigterm():
    polite = _started("import time; print('ready', flush=True); time.sleep(60)")
    end(polite, grace=10)
    assert polite.returncode == -15  # SIGTERM was enough
    stubborn = _started(STUBBORN)
    end(stubborn, grace=0.5)
    assert stubborn.returncode == -9  # ignored SIGTERM for the grace, then SIGKILL
    end(stubborn)  # already gone: nothing to do
    end(None)


def test_reap_returns_the_childs_cpu_seconds_and_sets_its_exit_code():
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                             "while time.process_time() - t < 0.3: pass"])
    cpu = reap(busy)
    assert busy.returncode == 0 and 0.3 <= cpu < 30
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    reap(failed)
    assert failed.returncode == 3


def test_save_with_markdown_writes_both_files_with_provenance_and_never_clobbers(tmp_path, capsys):
    paths = []
    for k in range(2):  # two results in the same second get two names
        prov = provenance.start("probe", ["--k", str(k)], ["fstream_bench.core.runstats"])
        doc = {"machine": {"nproc": 1}, "value": k}
        paths.append(save_with_markdown("probe", doc, prov, tmp_path,
                                        lambda d, command: f"# probe {d['value']}\n\n`{command}`\n"))
    (j0, m0), (j1, m1) = paths
    assert len({j0, j1, m0, m1}) == 4 and j0.name.startswith("probe-") and m1.suffix == ".md"
    doc = json.loads(j1.read_text())
    assert doc["value"] == 1 and doc["command"] == "fstream bench probe --k 1" and "load_end" in doc["provenance"]
    assert m1.read_text().startswith("# probe 1\n") and "fstream bench probe --k 1" in m1.read_text()
    assert f"results: {j1}, {m1}" in capsys.readouterr().out


@pytest.mark.slow  # ~7 s: a redis-server, then one idle agent per scheduler mode (2 s warm-up each)
def test_sched_cycle_writes_its_result_with_provenance_through_run_saved(tmp_path):
    """One tiny size (4 live jobs, one idle agent for 0.2 s per mode): the file lands in ``--results`` with
    its provenance, machine and command, and ``--json`` gets a copy."""
    from fstream_bench.scheduling import cycle

    copy = tmp_path / "copy.json"
    rc = cycle.main(["--live", "4", "--finished", "0", "--agents", "1", "--seconds", "0.2", "--cycles", "1",
                     "--results", str(tmp_path / "out"), "--json", str(copy)])
    assert rc == 0
    (path,) = (tmp_path / "out").glob("sched-cycle-*.json")
    doc = json.loads(path.read_text())
    assert [(r["live"], r["finished"]) for r in doc["rows"]] == [(4, 0)]
    assert doc["command"].startswith("fstream bench sched-cycle --live 4") and doc["machine"]["nproc"] >= 1
    assert "load_end" in doc["provenance"] and json.loads(copy.read_text())["rows"] == doc["rows"]


def test_unix_redis_serves_on_its_socket_until_it_exits(tmp_path):
    """The one throw-away unix-socket Redis of the WAN benches (breakdown, HARP; pools_wan's, drain's and
    sched-wan's through ``pools_wan._redis`` with the embedded server's binary)."""
    import redis

    from fstream_bench.core.unix_redis import UnixRedis
    from fstream_bench.tuning import pools_wan

    with UnixRedis(tmp_path / "r") as srv:
        client = redis.Redis(unix_socket_path=str(srv.sock))
        client.set("k", "v")
        assert client.get("k") == b"v" and srv.keys() == 1 and srv.url == f"unix://{tmp_path}/r/redis.sock"
        srv.flush()
        assert srv.keys() == 0
        client.close()
    assert srv.proc.returncode is not None  # stopped on exit
    proc, url = pools_wan._redis(tmp_path / "p")
    try:
        assert redis.Redis.from_url(url).ping() is True
    finally:
        end(proc, 10)
    assert proc.returncode is not None


def test_wan_bench_result_dirs_share_one_stamp_and_the_summary_is_rewritten(tmp_path):
    """breakdown, HARP and QoS: ``<results>/<name>-<UTC stamp>/`` made, the run's files under ``--workdir`` or a
    /dev/shm directory with the same stamp; summary.json after every run, report.md at the end."""
    import argparse
    import re

    from fstream_bench.wan.rig import result_dirs, write_summary

    out, work = result_dirs(argparse.Namespace(results=str(tmp_path), workdir=None), "qos")
    stamp = re.fullmatch(r"qos-(\d{8}-\d{6})", out.name).group(1)
    assert out.is_dir() and work == Path(f"/dev/shm/fstream-qos-{stamp}") and not work.exists()
    given = argparse.Namespace(results=str(tmp_path), workdir=str(tmp_path / "w"))
    assert result_dirs(given, "qos")[1] == tmp_path / "w"
    write_summary(out, {"runs": [1], "path": tmp_path})
    assert json.loads((out / "summary.json").read_text()) == {"runs": [1], "path": str(tmp_path)}
    assert not (out / "report.md").exists()
    write_summary(out, {"runs": [1, 2]}, "# report\n")
    assert json.loads((out / "summary.json").read_text())["runs"] == [1, 2]
    assert (out / "report.md").read_text() == "# report\n"
