"""Issue 26, "every result records what it measured": ``fstream_bench.core.provenance`` and the benches that use it.

The code hash is stable, blind to docstrings, comments and layout, and changes with the code (a temp
package on sys.path); ``start``/``finish`` fill every field; each bench's module list covers what it
imports; ``fstream bench sim`` and ``fstream bench scheduling`` write provenance and raw rows on a tiny
configuration; the scale report names the watcher it timed; the WAN selfcheck writes its result file.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fstream_bench.core import provenance

REPO = Path(__file__).resolve().parent.parent
FIELDS = {"bench", "command", "commit", "dirty", "modules", "code_hash", "machine", "python", "load_start",
          "started_unix"}


# ---- the code hash --------------------------------------------------------------------------------

@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A package ``provprobe_pkg`` with two modules, importable from a temp dir."""
    root = tmp_path / "site" / "provprobe_pkg"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text('"""The probe package."""\n')
    (root / "rate.py").write_text('"""Rates."""\n\n\ndef rate(x):\n    """Double it."""\n    return 2 * x  # twice\n')
    (root / "other.py").write_text("LIMIT = 5\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    _forget()  # find_spec of a submodule imports the package: each test hashes its own copy
    yield root
    _forget()


def _forget() -> None:
    for name in [n for n in sys.modules if n == "provprobe_pkg" or n.startswith("provprobe_pkg.")]:
        del sys.modules[name]


def test_code_hash_is_stable(pkg):
    h = provenance.code_hash(["provprobe_pkg.rate"])
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", h)
    assert provenance.code_hash(["provprobe_pkg.rate"]) == h
    # the order and repetition of the names do not matter
    assert provenance.code_hash(["provprobe_pkg.rate", "provprobe_pkg.other"]) == \
        provenance.code_hash(["provprobe_pkg.other", "provprobe_pkg.rate", "provprobe_pkg.other"])


def test_code_hash_ignores_docstrings_comments_and_layout(pkg):
    h = provenance.code_hash(["provprobe_pkg.rate"])
    (pkg / "rate.py").write_text('"""Rates, reworded at length."""\n# a comment\n\ndef rate(x):\n'
                                 '    """Twice x, said otherwise."""\n\n    # why: because\n    return 2 * x\n')
    assert provenance.code_hash(["provprobe_pkg.rate"]) == h
    (pkg / "rate.py").write_text("def rate(x):\n    return 2 * x\n")  # no docstrings at all
    assert provenance.code_hash(["provprobe_pkg.rate"]) == h


def test_code_hash_changes_when_the_code_does(pkg):
    h = provenance.code_hash(["provprobe_pkg.rate"])
    (pkg / "rate.py").write_text('"""Rates."""\n\n\ndef rate(x):\n    """Double it."""\n    return 3 * x  # twice\n')
    h3 = provenance.code_hash(["provprobe_pkg.rate"])
    assert h3 != h
    (pkg / "rate.py").write_text('"""Rates."""\n\n\ndef rate(y):\n    """Double it."""\n    return 3 * y\n')
    assert provenance.code_hash(["provprobe_pkg.rate"]) != h3  # a renamed argument is a change too


def test_a_package_stands_for_every_file_under_it(pkg):
    whole = provenance.code_hash(["provprobe_pkg"])
    assert provenance.code_hash(["provprobe_pkg.rate"]) != whole
    (pkg / "other.py").write_text("LIMIT = 6\n")
    changed = provenance.code_hash(["provprobe_pkg"])
    assert changed != whole
    (pkg / "sub").mkdir()
    (pkg / "sub" / "__init__.py").write_text("X = 1\n")
    assert provenance.code_hash(["provprobe_pkg"]) != changed  # a new file under it


def test_a_module_that_is_not_importable_is_an_error(pkg):
    with pytest.raises(LookupError, match="provprobe_missing"):
        provenance.code_hash(["provprobe_missing"])


# ---- start / finish -------------------------------------------------------------------------------

def test_start_and_finish_fill_every_field(pkg):
    prov = provenance.start("probe", ["--label", "two words", "--n", "3"], ["provprobe_pkg.rate", "provprobe_pkg"])
    assert set(prov) == FIELDS | {"record"}  # where this run's processes record what they import (issue 42)
    assert prov["bench"] == "probe"
    assert prov["command"] == "fstream bench probe --label 'two words' --n 3"
    assert prov["commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{40}", prov["commit"])
    assert isinstance(prov["dirty"], bool)
    assert prov["modules"] == ["provprobe_pkg", "provprobe_pkg.rate"]
    assert prov["code_hash"] == provenance.code_hash(["provprobe_pkg", "provprobe_pkg.rate"])
    assert {"nproc", "cpu", "kernel", "date"} <= set(prov["machine"])
    assert prov["python"].count(".") == 2
    assert len(prov["load_start"]) == 3 and all(x >= 0 for x in prov["load_start"])
    same = provenance.finish(prov)
    assert same is prov and set(prov) == FIELDS | {"load_end", "finished_unix", "files"}
    assert prov["code_hash"] == provenance.files_hash(prov["files"])  # what ran, not the declared list
    assert len(prov["load_end"]) == 3 and prov["finished_unix"] >= prov["started_unix"]
    json.dumps(prov)  # goes into a result file as is


# ---- each bench names what it exercised -----------------------------------------------------------

def _imports(module: str) -> set[str]:
    """Every module ``module`` imports (at any depth of its code), by absolute name."""
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text())
    pkg = module if spec.submodule_search_locations else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg
                for _ in range(node.level - 1):
                    up = up.rpartition(".")[0]
                base = f"{up}.{base}" if base else up
            out.add(base)
            for a in node.names:
                try:
                    if importlib.util.find_spec(f"{base}.{a.name}"):
                        out.add(f"{base}.{a.name}")
                except (ImportError, ValueError):
                    pass
    return out


def _closure(module: str) -> set[str]:
    """The fstream_bench modules ``module`` reaches, not through ``provenance`` (which records, not measures)."""
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m not in seen and m != "fstream_bench.core.provenance":
            seen.add(m)
            todo += [i for i in _imports(m) if i.startswith("fstream_bench")]
    return seen


def _covered(name: str, modules) -> bool:
    return any(name == m or name.startswith(m + ".") for m in modules)


def _bench_modules():
    from fstream_bench.airflow import results as airflow_results
    from fstream_bench.datapath import flow as flow_bench, loopback
    from fstream_bench.tuning import pathfill
    from fstream_bench.scale import growth as scale
    from fstream_bench.scheduling import replay as scheduling
    from fstream_bench.tuning import sim as sim_bench, harp as harp_bench, pools_wan, qos as qos_bench
    from fstream_bench.scheduling import wan as sched_wan
    from fstream_bench.soak import bench as soak
    from fstream_bench.tuning import science as tuning_science, wan as tuning_wan
    from fstream_bench.wan import cli as wan_cli

    return [("fstream_bench.scale.growth", scale.MODULES), ("fstream_bench.datapath.loopback", loopback.MODULES),
            ("fstream_bench.tuning.pathfill", pathfill.MODULES), ("fstream_bench.scheduling.replay", scheduling.MODULES),
            ("fstream_bench.airflow.bench", airflow_results.MODULES), ("fstream_bench.datapath.flow", flow_bench.MODULES),
            ("fstream_bench.tuning.sim", sim_bench.MODULES), ("fstream_bench.tuning.science", tuning_science.MODULES),
            ("fstream_bench.wan.cli", wan_cli.SELFCHECK_MODULES), ("fstream_bench.tuning.qos", qos_bench.MODULES),
            ("fstream_bench.tuning.harp", harp_bench.MODULES), ("fstream_bench.tuning.pools_wan", pools_wan.MODULES),
            ("fstream_bench.scheduling.wan", sched_wan.MODULES), ("fstream_bench.soak.bench", soak.MODULES),
            ("fstream_bench.tuning.wan", tuning_wan.MODULES)]


@pytest.mark.parametrize("entry,modules", _bench_modules(), ids=lambda x: x if isinstance(x, str) else "")
def test_each_bench_names_every_module_it_runs(entry, modules):
    """Every fstream_bench module the bench reaches, and every agent or provider module those import
    (the package root aside), is covered by the list its results are hashed over; and the list hashes."""
    assert "fstream_bench.core.provenance" not in modules  # recording a result is not what was measured
    rooms = {"fstream_bench." + r for r in ("core", "datapath", "tuning", "scheduling", "airflow", "ops", "scale", "soak")}
    reached = _closure(entry) - {"fstream_bench", "fstream_bench.core.provenance"} - rooms  # a room's __init__: a docstring
    missing = sorted(m for m in reached if not _covered(m, modules))
    assert not missing, f"{entry}: add to its MODULES: {missing}"
    used = {i for m in reached for i in _imports(m)
            if i.startswith(("transfer_agent.", "fstream_provider."))}
    missing = sorted(m for m in used if not _covered(m, modules))
    assert not missing, f"{entry}: add to its MODULES: {missing}"
    assert provenance.code_hash(list(modules)).startswith("sha256:")


def test_simulator_benches_hash_the_simulator_and_agent_benches_the_agent():
    from fstream_bench.datapath import loopback
    from fstream_bench.scale import growth as scale
    from fstream_bench.scheduling import replay as scheduling
    from fstream_bench.tuning import sim as sim_bench, science as tuning_science

    for mods in (sim_bench.MODULES, scheduling.MODULES, tuning_science.MODULES):
        assert "fstream_provider.tuning" in mods
    for mods in (scale.MODULES, loopback.MODULES):
        assert set(provenance.AGENT) <= set(mods)


# ---- the result files -----------------------------------------------------------------------------

def _bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fstream_bench.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(REPO))


def test_bench_sim_writes_provenance_and_raw_rows(tmp_path):
    out = _bench("sim", "--paths", "10G/40ms", "--workloads", "w4", "--tuners", "static,fstream",
                 "--grid", "8,16;4;0,8", "--qos-workloads", "w4", "--qos-fractions", "0.6", "--qos-pacing", "on",
                 "--results", str(tmp_path))
    assert out.returncode == 0, out.stderr
    (js,) = tmp_path.glob("sim-*.json")
    (md,) = tmp_path.glob("sim-*.md")
    doc = json.loads(js.read_text())
    prov = doc["provenance"]
    assert FIELDS | {"load_end", "finished_unix"} <= set(prov)
    assert prov["bench"] == "sim" and prov["command"].startswith("fstream bench sim --paths 10G/40ms")
    assert prov["modules"] == ["fstream_bench.tuning.sim", "fstream_provider.tuning"]
    assert prov["code_hash"] == provenance.current_hash(prov)  # over the files its process imported
    assert "bench/tuning/sim.py" in prov["files"] and "fstream_provider/tuning/sim.py" in prov["files"]
    by = {r["tuner"]: r for r in doc["throughput"]}
    assert set(by) == {"static", "fstream", "oracle"}
    assert by["oracle"]["of_oracle"] == 1.0
    assert by["oracle"]["gbit_s"] == pytest.approx(by["oracle"]["throughput_bps"] / 1e9)
    assert by["static"]["oracle_settings"] == by["oracle"]["oracle_settings"]
    assert set(by["oracle"]["oracle_settings"]) == {"cc", "p", "pp"} and by["oracle"]["oracle_settings"]["p"] == 4
    assert 0 < by["fstream"]["of_oracle"] <= 1.05
    assert doc["mean_of_oracle"]["10G/40ms"]["fstream"] == by["fstream"]["of_oracle"]
    assert [r["variant"] for r in doc["breakdown"]] == ["static", "dynamic", "+profiling", "+history"]
    (q,) = doc["qos"]
    assert q["target"] == 0.6 and q["pacing"] is True and q["median_err"] is not None
    assert doc["scenarios"][0]["name"] == "10G/40ms" and doc["markdown"] == md.name
    text = md.read_text()
    assert prov["command"] in text and "| w4 |" in text and "### QoS 10G/40ms" in text


def test_bench_sim_refuses_a_bad_grid(tmp_path):
    out = _bench("sim", "--grid", "8,16;4", "--results", str(tmp_path))
    assert out.returncode == 2 and "CC;P;PP" in out.stderr
    assert not list(tmp_path.iterdir())


def test_bench_scheduling_writes_every_trace_and_task(tmp_path):
    out = _bench("scheduling", "--traces", "25%", "--scale", "0.05", "--algorithms", "basecc1,seal",
                 "--results", str(tmp_path))
    assert out.returncode == 0, out.stderr
    (js,) = tmp_path.glob("scheduling-*.json")
    assert len(list(tmp_path.glob("scheduling-*.md"))) == 1
    doc = json.loads(js.read_text())
    assert doc["provenance"]["command"] == "fstream bench scheduling --traces 25% --scale 0.05 " \
                                          f"--algorithms basecc1,seal --results {tmp_path}"
    assert doc["provenance"]["modules"] == ["fstream_bench.scheduling.replay", "fstream_provider.tuning"]
    trace = doc["traces"]["25%"]
    n = trace["tasks_in_trace"]
    assert n == len(trace["tasks"]["rows"]) > 0 and trace["tasks"]["columns"][:2] == ["class", "category"]
    assert [r["algorithm"] for r in trace["results"]] == ["basecc1", "seal"]
    for r in trace["results"]:
        cols = r["tasks"]["columns"]
        assert len(r["tasks"]["rows"]) == n
        slow = [row[cols.index("slowdown")] for row, t in zip(r["tasks"]["rows"], trace["tasks"]["rows"])
                if t[0] == "interactive" and row[cols.index("end")] is not None]
        assert max(slow) == pytest.approx(r["worst_slowdown"], rel=1e-5)  # the summary is read from the rows
        assert sum(slow) / len(slow) == pytest.approx(r["avg_slowdown"], rel=1e-4)


def test_scale_times_the_watcher_send_watch_uses_and_reports_the_senders_scans():
    from fstream_bench.scale import growth as scale
    from transfer_agent.sending import sender

    assert scale.watcher_class() is sender.SourceWatcher
    assert scale.watcher_name() == "fstream_provider.watch.source_watcher.SourceWatcher"
    cp = {"files": 10, "landed": 10, "elapsed_s": 1.0, "sender_rss": 2**20, "receiver_rss": 2**20,
          "sender_peak_rss": 2**20, "receiver_peak_rss": 2**20, "scan_new_poll_s": 0.01, "scan_new_inotify_s": 0.01,
          "scan_idle_poll_s": 0.001, "scan_idle_inotify_s": 0.001, "new_per_scan": 10,
          "fresh_watcher_full_scan": {"first_scan_s": 0.02}}
    doc = {"machine": {"nproc": 2, "cpu": "x", "kernel": "k", "date": "d"}, "size": 65536, "batch": 10,
           "interval": "1s", "watcher": scale.watcher_name(), "checkpoints": [dict(cp)],
           "sender_scans": [{"t": 1.0, "scan_seconds": 0.004, "scan_listed": 3, "files_done": 4},
                            {"t": 2.0, "scan_seconds": 0.002, "scan_listed": 0, "files_done": 10},
                            {"t": 3.0, "scan_seconds": 0.009, "scan_listed": 0, "files_done": 11}]}
    doc["checkpoints"][0]["sender_scans"] = scale._scan_summary(
        [s["scan_seconds"] for s in doc["sender_scans"] if 0 < s["files_done"] <= 10])
    md = scale.markdown(doc, "fstream bench scale --files 10")
    assert "`fstream_provider.watch.source_watcher.SourceWatcher`" in md and "`fstream send --watch`" in md
    assert "| 3.0 / 4.0 (2) |" in md  # median / max of the sender's own scans up to that checkpoint (ms)


def test_wan_selfcheck_result_file_carries_the_samples_and_provenance(tmp_path):
    from fstream_bench.wan import cli as wan_cli

    prov = provenance.start("wan", ["selfcheck", "--results"], wan_cli.SELFCHECK_MODULES)
    res = {"ok": False, "failures": ["RTT off"], "rtt_ms": 41.0, "rtt_echo_samples_ms": [40.9, 41.0, 41.2],
           "parallel_intervals_bps": [9.5e8, 9.6e8]}
    path = wan_cli._write_selfcheck(tmp_path, res, prov, built=True)
    assert re.fullmatch(r"selfcheck-\d{8}-\d{6}\.json", path.name)
    doc = json.loads(path.read_text())
    assert doc["provenance"]["command"] == "fstream bench wan selfcheck --results"
    assert "load_end" in doc["provenance"] and doc["ok"] is False and doc["result"] == res
    parsed = wan_cli._parser().parse_args(["selfcheck", "--results"])
    assert parsed.results == str(wan_cli.RESULTS_DIR) and wan_cli.RESULTS_DIR == REPO / "bench" / "results"
    assert wan_cli._parser().parse_args(["selfcheck"]).results is None
