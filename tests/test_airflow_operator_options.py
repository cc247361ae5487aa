"""FStreamTransferOperator refuses bad tuner options when the DAG is parsed (or, if templated, before submitting)."""

from __future__ import annotations

import os
import tempfile
import textwrap

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
pytest.importorskip("airflow")

from airflow.sdk.exceptions import AirflowException  # noqa: E402

from fstream_provider.operators.transfer import FStreamTransferOperator  # noqa: E402
from fstream_provider.tuning.registry import make_tuner  # noqa: E402
from fstream_provider.tuning.base import ClusterStats, FileInfo, Observation, PathInfo  # noqa: E402

DEST = "fstream://127.0.0.1:1/x"
ACCEPTED = "expected one of fixed, static, dynamic, fstream, globus, adaptivecc, harp"


def op(**kw):
    return FStreamTransferOperator(task_id="t", sources=["/data/a"], destination=DEST, fstream_conn_id="nowhere", **kw)


@pytest.mark.parametrize("kw, says", [
    ({"tuner": "harpoon"}, f"t: invalid transfer options: unknown tuner 'harpoon': {ACCEPTED}"),
    ({"tuner": "harp", "cc": 4}, "tuner 'harp' takes no cc/p/pp (got cc=4)"),
    ({"tuner_options": {"tcp_buffer": "1KiB"}}, "tuner_options: tcp_buffer '1KiB': expected a size between 4KiB and 1GiB"),
    ({"tuner": "static", "cc": 4}, "tuner 'static' takes no cc/p/pp (got cc=4)"),
    ({"tuner": "dynamic", "target_throughput": "800Mbps"}, "tuner 'dynamic' cannot hold a target throughput"),
    ({"tuner_options": {"block_size": "4 bananas"}}, "tuner_options: block_size '4 bananas': expected a size"),
    ({"tuner_options": {"blocksize": "4MiB"}}, "unknown key(s) blocksize (accepted: profile_interval"),
    ({"tuner_options": {"cc": 4}}, "tuner_options: cc has its own parameter; pass cc= instead"),
    ({"tuner": "fixed", "tuner_options": {"profile_interval": "5s"}}, "tuner 'fixed' takes no profile_interval"),
    ({"tuner": "globus", "tuner_options": {"profile_interval": "5s"}}, "tuner 'globus' takes no profile_interval"),
])
def test_bad_options_fail_at_construction_naming_what_is_wrong(kw, says):
    with pytest.raises(ValueError) as e:
        op(**kw)
    assert says in str(e.value)


def test_priority_class_reaches_the_spec_and_a_wrong_one_fails_at_parse():
    assert op(priority_class="batch").build_spec().priority_class == "batch"
    assert op().build_spec().priority_class == "interactive"
    with pytest.raises(ValueError, match="priority_class 'low': must be one of interactive, batch"):
        op(priority_class="low")
    with pytest.raises(ValueError, match="tuner_options: priority_class has its own parameter"):
        op(tuner_options={"priority_class": "batch"})
    assert "priority_class" in FStreamTransferOperator.template_fields


def test_a_deadline_is_absolute_or_counts_from_the_runs_start_and_a_bad_one_fails_at_parse():
    import datetime as dt
    from types import SimpleNamespace

    start = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.timezone.utc)
    ctx = {"dag_run": SimpleNamespace(start_date=start), "ti": SimpleNamespace(dag_id="d", run_id="r", task_id="t")}
    assert op(deadline="2h").build_spec(ctx).deadline == start.timestamp() + 7200
    assert op(deadline=dt.timedelta(minutes=30)).build_spec(ctx).deadline == start.timestamp() + 1800
    assert op(deadline="2026-11-26T18:00").build_spec(ctx).deadline == 1795716000.0
    spec = op(deadline=1795716000, on_deadline_risk="fail").build_spec(ctx)
    assert (spec.deadline, spec.on_deadline_risk) == (1795716000.0, "fail")
    assert op().build_spec(ctx).deadline is None
    with pytest.raises(ValueError, match="deadline 'by lunch': expected a datetime"):
        op(deadline="by lunch")
    with pytest.raises(ValueError, match="on_deadline_risk 'panic': must be one of warn, fail"):
        op(deadline="2h", on_deadline_risk="panic")
    with pytest.raises(ValueError, match="deadline: tuner 'static' cannot hold a target"):
        op(tuner="static", deadline="2h")
    o = op(deadline="{{ params.deadline }}")  # templated: checked once rendered
    o.deadline = "soonish"
    with pytest.raises(AirflowException, match="t: invalid transfer options: deadline 'soonish'"):
        o.build_spec(ctx)
    assert {"deadline", "on_deadline_risk"} <= set(FStreamTransferOperator.template_fields)


def test_tuner_options_reach_the_spec_and_a_start_reaches_the_tuner():
    spec = op(tuner="fstream", cc=6, p=2, pp=3,
              tuner_options={"block_size": "4MiB", "profile_interval": "5s"}).build_spec()
    assert (spec.block_size, spec.profile_interval_s) == (4 * 2**20, 5.0)
    path = PathInfo(1e9, 0.04, tcp_buffer=2**20)
    t = make_tuner(spec.tuner, path=path, cc=spec.cc, p=spec.p, pp=spec.pp)
    files = [FileInfo(f"{i}.h5", 150_000_000, "h5") for i in range(20)]
    t.update(Observation(0.0, 0.0, 0, 0.0, files, {"large": ClusterStats(0, 0.0, 0, 20, 20 * 150_000_000)}))
    assert [(l.cc, l.p, l.pp) for l in t.suggest().layouts] == [(6, 2, 3)]


def test_a_templated_tuner_is_checked_at_execute_before_submitting():
    o = op(tuner="{{ params.tuner }}", cc=4)  # unknown until rendered: accepted at parse
    o.tuner = "globus"  # what rendering produced
    with pytest.raises(AirflowException, match="t: invalid transfer options: .*tuner 'globus' takes no cc/p/pp"):
        o.build_spec()  # execute() builds the spec before it submits anything


def test_a_dag_with_an_unknown_tuner_is_an_import_error(tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    (tmp_path / "harp_dag.py").write_text(textwrap.dedent(f'''
        from datetime import datetime
        from airflow.sdk import DAG
        from fstream_provider.operators.transfer import FStreamTransferOperator

        with DAG(dag_id="uses_harp", schedule=None, start_date=datetime(2026, 1, 1)):
            FStreamTransferOperator(task_id="t", sources=["/a"], destination="{DEST}", tuner="harpoon")
    '''))
    bag = DagBag(dag_folder=str(tmp_path))
    (err,) = bag.import_errors.values()
    assert f"unknown tuner 'harpoon': {ACCEPTED}" in err and "uses_harp" not in bag.dags
