"""The loopback benchmark's accounting (issue 13): CPU of real child processes, per-GB and per-file
figures, the per-run cost subtracted, and the goal lines — on a synthetic run document."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fstream_bench.datapath import loopback
from fstream_bench.core.cpu_meter import ServerCpu, wait_with_usage

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\nprint('done')"


def test_client_cpu_from_wait4_counts_the_childs_work():
    proc = subprocess.Popen([sys.executable, "-c", BURN.format(s=0.3)], stdout=subprocess.PIPE)
    out, cpu = wait_with_usage(proc, 30)
    assert out.strip() == "done" and proc.returncode == 0
    assert 0.25 <= cpu < 2.0


def test_server_cpu_is_the_difference_while_it_works():
    code = "import sys, time\nsys.stdin.readline()\n" + BURN.format(s=0.3) + "\nsys.stdout.flush()\nsys.stdin.readline()"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        meter = ServerCpu(proc.pid).start()  # start-up before this point is not counted
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "done"
        cpu = meter.stop()
        assert 0.25 <= cpu < 1.0
    finally:
        proc.kill()
        proc.wait()


def _row(case, tool, bps, src, dst, nbytes, files, rep=0):
    return {"case": case, "tool": tool, "repeat": rep, "ok": True, "throughput_bps": bps, "cpu_src_s": src,
            "cpu_dst_s": dst, "bytes": nbytes, "files": files, "error": ""}


def test_per_gb_per_file_net_and_goal_lines():
    gib = 2**30
    results = [
        _row("a: 1 GiB, p=4", "fstream", 8e9, 0.9, 0.9, gib, 1),
        _row("a: 1 GiB, p=4", "fstream", 9e9, 1.1, 0.9, gib, 1, rep=1),
        _row("a: 1 GiB, p=4", "gridftp", 16e9, 0.5, 0.5, gib, 1),
        _row("b: 2000 files, cc=4, pp", "fstream", 4e9, 0.9, 0.7, 2000 * 262144, 2000),
        _row("b: 2000 files, cc=4, pp", "gridftp", 6e9, 0.4, 0.6, 2000 * 262144, 2000),
        _row("z: 1 file of 1 byte", "fstream", 0, 0.2, 0.0, 1, 1),
        _row("z: 1 file of 1 byte", "gridftp", 0, 0.01, 0.0, 1, 1),
    ]
    doc = {"machine": {"nproc": 2, "cpu": "x", "kernel": "k", "mem_gib": 1, "date": "d", "loadavg": "0"},
           "pinned": True, "memory": "m", "checksum_cpu_s_per_gib": {"blake3-keyed": 0.3},
           "cases": ["a: 1 GiB, p=4", "b: 2000 files, cc=4, pp", "z: 1 file of 1 byte"], "results": results,
           "disk_ceiling_Bps": []}
    doc["medians"] = loopback.medians(results)
    cell = doc["medians"]["a: 1 GiB, p=4"]["fstream"]
    assert cell["cpu_s"] == pytest.approx(1.9) and cell["bps_min"] == 8e9 and cell["bps_max"] == 9e9
    assert loopback.cpu_per_unit(doc, "a: 1 GiB, p=4", "fstream") == pytest.approx(1.9 / (gib / 1e9))
    assert loopback.cpu_per_unit(doc, "a: 1 GiB, p=4", "fstream", net=True) == pytest.approx(1.7 / (gib / 1e9))
    assert loopback.cpu_per_unit(doc, "b: 2000 files, cc=4, pp", "gridftp") == pytest.approx(0.5)  # per 1,000
    assert loopback.cpu_per_unit(doc, "z: 1 file of 1 byte", "fstream") is None
    md = loopback.markdown(doc, "fstream bench loopback")
    assert "| a: 1 GiB, p=4: CPU both sides, fstream (checksum, fsync) / gridftp -fast <= 1 | 1.90;" in md
    assert "| a: 1 GiB, p=4: throughput fstream / gridftp >= 1.5 (p=4 and the small set) | 0.53;" in md


def test_disk_ratios_are_paired_with_their_own_repeats_dd_and_name_the_filesystem():
    """Since the disk cases' dd runs once per repeat just before them, each run is divided by its own repeat's dd
    (the disk swings 3.5-9.4 Gbit/s here); an older document is divided by the median of its ceilings."""
    from fstream_bench.datapath.readers import disk_files

    big, small = "d: 1 GiB, p=4, disk", "d: 2000 files, cc=4, pp, disk"
    results = [_row(big, "fstream", 4e9, 1, 1, 2**30, 1, rep=0), _row(big, "fstream", 8e9, 1, 1, 2**30, 1, rep=1),
               _row(small, "fstream", 2e9, 1, 1, 2000 * 262144, 2000, rep=0),
               _row(small, "fstream", 2e9, 1, 1, 2000 * 262144, 2000, rep=1)]
    doc = {"cases": [big, small], "results": results, "disk_ceiling_Bps": [0.5e9, 1e9],  # 4 and 8 Gbit/s
           "disk_ceiling_paired": True, "disk": {"type": "ext4", "journal": False}}
    xs, ceiling = loopback.disk_ratios(doc, big)
    assert xs == [1.0, 1.0] and ceiling == 6e9
    assert loopback.disk_ratios(doc, small)[0] == [0.5, 0.25]
    measured, met = disk_files(doc, None)
    assert met == "no" and "2000 files, cc=4, pp: 0.38" in measured and "ext4 without a journal" in measured
    old = {**doc, "disk_ceiling_paired": False}
    assert loopback.disk_ratios(old, big)[0] == [4e9 / 6e9, 8e9 / 6e9]
    doc["results"] = [r if r["case"] == big else {**r, "throughput_bps": 5e9} for r in results]
    assert disk_files(doc, None)[1] == "yes"  # both cases 0.94 (0.625-1.25) of their own dd


def test_disk_info_names_the_mount_the_directory_is_on(tmp_path):
    info = loopback.disk_info(tmp_path)
    mounts = [line.split() for line in open("/proc/mounts")]
    assert info["mount"] in {m[1] for m in mounts}
    assert info["type"] == next(m[2] for m in mounts if m[1] == info["mount"])
    assert str(tmp_path).startswith(info["mount"])


def test_per_file_against_the_client_is_paired_per_repeat():
    """Issue 43's bar (≤ 1.1× globus-url-copy's CPU per file): each repeat's per-file CPU, net of its own 1-byte
    run, over the client's in the same repeat."""
    from fstream_bench.datapath.readers import FILES_C, TINY, per_file_vs_client

    def run(case, tool, rep, cpu):
        return {"case": case, "tool": tool, "repeat": rep, "ok": True, "cpu_src_s": cpu}

    results = []
    for rep, (ours, theirs) in enumerate([(0.35, 0.30), (0.40, 0.30), (0.30, 0.30)]):
        results += [run(FILES_C, "fstream", rep, 0.10 + ours), run(TINY, "fstream", rep, 0.10),
                    run(FILES_C, "gridftp", rep, 0.02 + theirs), run(TINY, "gridftp", rep, 0.02)]
    text, met = per_file_vs_client({"results": results}, None)
    assert text.startswith("1.17 (1.00–1.33, 3 runs)×") and met == "no", text
    results[0]["cpu_src_s"] = 0.10 + 0.31  # the median repeat now 1.03×
    text, met = per_file_vs_client({"results": results}, None)
    assert text.startswith("1.03 (1.00–1.33, 3 runs)×") and met == "yes", text
