"""``TransferResult.to_dict`` (the ``--json`` output and a job's result): every field, as plain copies."""

from __future__ import annotations

import dataclasses
import json

from transfer_agent.sending.result import TransferResult


def _result() -> TransferResult:
    r = TransferResult(job_id="j", ok=True, files=3, error=None)
    for i in range(3):
        r.add_landed({"path": f"d/f{i}", "source": f"/src/f{i}", "size": i, "status": "committed", "blake3": "ab"})
    r.tuning.append({"t": 0.0, "reason": "fixed", "layouts": {"all": {"cc": 4, "p": 1, "pp": 16, "rate_bps": None}}})
    r.intervals.append({"t": 1.0, "clusters": {"all": {"cc": 4}}, "span": (0.0, 1.0)})
    r.failures.append({"path": "/src/x", "reason": "gone", "retryable": True})
    return r


def test_to_dict_holds_what_asdict_held_and_serialises():
    r = _result()
    out = r.to_dict()
    assert out == dataclasses.asdict(r)
    assert list(out) == [f.name for f in dataclasses.fields(TransferResult)]
    assert out["intervals"][0]["span"] == (0.0, 1.0)  # a tuple stays a tuple, as asdict kept it
    assert json.loads(json.dumps(out))["landed"][2]["size"] == 2


def test_to_dict_is_a_copy_the_caller_may_change():
    """The daemon signs and stores the dict while the result object lives on: changing one must not change the
    other, down to the nested layouts."""
    r = _result()
    out = r.to_dict()
    out["landed"][0]["status"] = "tampered"
    out["tuning"][0]["layouts"]["all"]["cc"] = 99
    out["landed"].append({"path": "extra"})
    assert r.landed[0]["status"] == "committed" and r.tuning[0]["layouts"]["all"]["cc"] == 4 and len(r.landed) == 3
    r.landed[1]["size"] = 7
    assert out["landed"][1]["size"] == 1
