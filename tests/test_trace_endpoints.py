"""Issue 28: the trace replay accepts any trace: endpoint capacities learned from the trace or given in an
``--endpoints`` file, and an endpoint the file does not name refused with a message that names it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fstream_bench.scheduling import replay as scheduling
from fstream_provider.tuning import sched_sim as S
from fstream_provider.tuning import trace as T
from fstream_provider.tuning.sched_model import EndpointCurve

GB, MB = 1_000_000_000, 1_000_000

CUSTOM = """arrival_s,source,destination,size_bytes,class
0.0,alpha,beta,500000000,interactive
2.0,alpha,gamma,2000000000,interactive
"""


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_trace_of_other_hosts_replays_instead_of_failing_with_a_bare_key_error(tmp_path: Path):
    """The regression: every endpoint not one of the paper's six hosts was a ``KeyError: 'alpha'``."""
    trace = T.read_trace(_write(tmp_path / "custom.csv", CUSTOM))
    res = S.replay(trace, S.make_scheduler("basecc1"), external_load=0.0)  # no endpoints given: learned
    assert [t["end"] is not None for t in res.tasks] == [True, True]
    for alg in ("seal", "steal"):  # SEAL's own model learns the same capacities from the trace
        res = S.replay(trace, S.make_scheduler(alg, S.endpoints_for(trace)), external_load=0.0)
        assert res.summary()["unfinished_interactive"] == 0


def _renamed(tasks: list[T.TraceTask], names: dict[str, str]) -> list[T.TraceTask]:
    return [T.TraceTask(t.arrival_s, names[t.source], names[t.destination], t.size, t.klass) for t in tasks]


def test_learned_capacities_replay_a_custom_host_trace_to_the_end_under_every_algorithm():
    """A Table 2-like trace (with STEAL's batch tasks) between hosts the paper never had: every
    interactive transfer finishes under every algorithm, on capacities learned from the trace."""
    paper = T.generate("25%", scale=0.05, seed=4, batch=True)
    hosts = sorted({t.source for t in paper} | {t.destination for t in paper})
    trace = _renamed(paper, {h: f"site-{i}" for i, h in enumerate(hosts)})
    curves = S.endpoints_for(trace)
    assert set(curves) == {f"site-{i}" for i in range(len(hosts))}
    for alg in S.ALGORITHMS:
        res = S.replay(trace, S.make_scheduler(alg, curves), seed=1)
        assert [t["id"] for t in res.tasks if t["class"] == "interactive" and t["end"] is None] == [], alg
        assert res.summary()["avg_slowdown"] >= 1.0
        assert res.batch_spare_fraction is not None and res.batch_spare_fraction > 0  # a source's capacity, learned
    assert S.endpoints_for(paper) == S.paper_endpoints()  # the paper's own hosts keep §6.1's capacities


def test_the_learned_rule_reads_interactive_volume_at_the_papers_busiest_load_with_a_floor():
    trace = [T.TraceTask(0.0, "a", "b", 45 * GB), T.TraceTask(300.0, "a", "c", 45 * GB),
             T.TraceTask(0.0, "a", "c", 500 * GB, "batch"),  # batch: sized to fill what is left, not a rate
             T.TraceTask(10.0, "d", "d", 1 * MB)]  # to itself: counted once; a few bytes: the floor
    caps = {k: c.capacity_bps for k, c in S.learn_endpoints(trace).items()}
    assert caps["a"] == pytest.approx(90 * GB * 8 / (0.6 * 300))  # 4 Gbit/s: 2.4 Gbit/s of demand at 60 % load
    assert caps["b"] == caps["c"] == caps["d"] == S.LEARN_FLOOR_BPS  # 1.2 Gbit/s read as 2 Gbit/s, Darter's
    burst = [T.TraceTask(0.0, "a", "b", 90 * GB)]  # all at once: spread over a minute, not over zero seconds
    assert S.learn_endpoints(burst)["a"].capacity_bps == pytest.approx(90 * GB * 8 / (0.6 * 60))
    # the paper's busiest trace learns back about its source's 9.2 Gbit/s (its destinations: only their share)
    sixty = T.generate("60%", scale=0.2, seed=0)
    src = S.learn_endpoints(_renamed(sixty, {h: h.upper() for h in S.paper_endpoints()}))["STAMPEDE"]
    assert src.capacity_bps == pytest.approx(T.SOURCE_BPS, rel=0.1)


EPS_JSON = '{"alpha": 10e9, "beta": {"capacity": 10000000000, "unit": 5e8, "overload": 0.2}, "gamma": 2.5e9}'
EPS_TOML = 'alpha = 10e9\ngamma = 2_500_000_000\n\n[beta]\ncapacity = 10_000_000_000\nunit = 5e8\noverload = 0.2\n'


@pytest.mark.parametrize("name,text", [("eps.json", EPS_JSON), ("eps.toml", EPS_TOML), ("eps.conf", EPS_TOML)])
def test_an_endpoints_file_in_json_or_toml_gives_each_endpoints_curve(tmp_path: Path, name: str, text: str):
    curves = scheduling.load_endpoints(_write(tmp_path / name, text))
    assert curves["alpha"] == EndpointCurve(10e9, 1e9, 0.1)  # unit and overload: the model's defaults
    assert curves["beta"] == EndpointCurve(10e9, 500e6, 0.2)
    assert curves["gamma"].capacity_bps == 2.5e9


def test_the_endpoints_file_drives_the_replay(tmp_path: Path, capsys):
    trace_path = _write(tmp_path / "custom.csv", CUSTOM)
    turnaround = {}
    for cap in ("10e9", "1e9"):
        eps = _write(tmp_path / f"eps-{cap}.json", f'{{"alpha": {cap}, "beta": {cap}, "gamma": {cap}}}')
        assert scheduling.main(["--trace", str(trace_path), "--endpoints", str(eps), "--json",
                                "--algorithms", "basecc4,seal", "--results", str(tmp_path / cap)]) == 0
        out, err = capsys.readouterr()
        rows = [json.loads(line) for line in out.splitlines()]
        assert [r["unfinished_interactive"] for r in rows] == [0, 0] and "learned" not in err
        turnaround[cap] = rows[0]["avg_turnaround"]
        (result,) = (tmp_path / cap).glob("scheduling-*.json")
        assert json.loads(result.read_text())["config"]["endpoints"] == {
            "file": str(eps), "capacity_bps": {h: float(cap) for h in ("alpha", "beta", "gamma")}}
    assert turnaround["1e9"] > 3 * turnaround["10e9"]
    assert scheduling.main(["--trace", str(trace_path), "--json", "--algorithms", "seal"]) == 0
    assert "learned from the trace (no --endpoints file): alpha 2 Gbit/s, beta 2 Gbit/s" in capsys.readouterr().err


def test_a_trace_endpoint_the_file_does_not_name_is_refused_naming_it_the_line_the_transfer_and_the_file(
        tmp_path: Path, capsys):
    trace_path = _write(tmp_path / "custom.csv", CUSTOM)
    eps = _write(tmp_path / "eps.toml", 'alpha = 10e9\nbeta = 4e9\n')
    want = (f"trace {trace_path} line 3 (transfer t1: alpha -> gamma, 2000000000 bytes at 2 s): endpoint 'gamma' "
            f"is not in endpoints file {eps}, which names alpha, beta; add it there with its capacity")
    trace, curves = T.read_trace(trace_path), scheduling.load_endpoints(eps)
    with pytest.raises(ValueError) as err:
        S.endpoints_for(trace, curves, origin=f"endpoints file {eps}", trace_name=f"trace {trace_path}")
    assert str(err.value) == want
    assert scheduling.main(["--trace", str(trace_path), "--endpoints", str(eps)]) == 2
    assert capsys.readouterr().err == f"fstream bench scheduling: {want}\n"
    # replay itself refuses too, never with a KeyError, and so does a scheduler built on other curves
    with pytest.raises(ValueError, match=r"^trace line 3 \(transfer t1: .*endpoint 'gamma' is not in the endpoints"):
        S.replay(trace, S.make_scheduler("basecc1"), endpoints=curves)
    with pytest.raises(ValueError, match=r"line 2 \(transfer t0: .*endpoint 'alpha' is not in the scheduler's model"):
        S.replay(trace, S.make_scheduler("seal"))  # SEAL on the paper's six hosts
    # the generated traces name the paper's hosts: a file without them is refused before any replay
    assert scheduling.main(["--traces", "25%", "--scale", "0.05", "--endpoints", str(eps),
                            "--results", str(tmp_path / "r")]) == 2
    assert "generated trace 25% (transfer t0: stampede -> " in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("name,text,reason", [
    ("e.json", '{"alpha": 10e9,}', r"not valid JSON \(.*line 1 column 16"),
    ("e.toml", 'alpha = 10e9 Gbit\n', r"not valid TOML \("),
    ("e.txt", "alpha: 10e9\n", r"not valid JSON \(.*\); not valid TOML \("),
    ("e.json", '["alpha", 10e9]', r"expected a mapping of endpoint name to capacity, got list"),
    ("e.json", "{}", r"names no endpoint"),
    ("e.json", '{"alpha": {"capcity": 10e9}}', r"endpoint 'alpha': unknown key\(s\) 'capcity' \(expected capacity, unit, overload\)"),
    ("e.toml", '[alpha]\nunit = 1e9\n', r"endpoint 'alpha': no capacity"),
    ("e.json", '{"alpha": "10Gbit"}', r"endpoint 'alpha': capacity: expected bits/s as a number \(e.g. 10e9 for 10 Gbit/s\), got '10Gbit'"),
    ("e.json", '{"alpha": 10e9, "beta": 0}', r"endpoint 'beta': capacity must be > 0, got 0"),
    ("e.json", '{"alpha": -5}', r"endpoint 'alpha': capacity must be > 0, got -5"),
    ("e.json", '{"alpha": true}', r"endpoint 'alpha': capacity: expected bits/s as a number .*got True"),
    ("e.json", '{"alpha": [1, 2]}', r"endpoint 'alpha': capacity: expected bits/s as a number .*got \[1, 2\]"),
    ("e.json", '{"alpha": {"capacity": 1e9, "unit": 0}}', r"endpoint 'alpha': unit must be > 0"),
    ("e.json", '{"alpha": {"capacity": 1e9, "overload": "lots"}}', r"endpoint 'alpha': overload: expected a number, got 'lots'"),
    ("e.json", '{"alpha": {"capacity": 1e9, "overload": -1}}', r"endpoint 'alpha': overload must be >= 0"),
    ("e.json", '{"alpha": Infinity}', r"endpoint 'alpha': capacity must be > 0, got inf"),
])
def test_a_malformed_endpoints_file_is_refused_naming_the_file_the_endpoint_and_the_reason(
        tmp_path: Path, capsys, name: str, text: str, reason: str):
    path = _write(tmp_path / name, text)
    with pytest.raises(ValueError, match=rf"^endpoints file {re.escape(str(path))}: {reason}"):
        scheduling.load_endpoints(path)
    trace_path = _write(tmp_path / "custom.csv", CUSTOM)
    assert scheduling.main(["--trace", str(trace_path), "--endpoints", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fstream bench scheduling: endpoints file {path}: ") and "Traceback" not in err


def test_an_unreadable_endpoints_file_and_endpoints_with_generate_are_refused(tmp_path: Path, capsys):
    missing = tmp_path / "none.json"
    with pytest.raises(ValueError, match=rf"^endpoints file {re.escape(str(missing))}: cannot read it"):
        scheduling.load_endpoints(missing)
    with pytest.raises(SystemExit) as exc:
        scheduling.main(["--generate", "25%", "--out", str(tmp_path / "t.csv"), "--endpoints", str(missing)])
    assert exc.value.code == 2 and "--endpoints applies to replays" in capsys.readouterr().err
