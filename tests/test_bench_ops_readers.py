"""The goals table's readers of issue 30's results (``bench/ops/readers.py``): each says what was measured
and is met or not from the result alone (synthetic results, one field changed at a time)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from fstream_bench.ops.readers import doctor_goal, metrics_overhead, rotation_goal

METRICS = {"cpu_s_per_gb": {"off": {"values": [1.00, 1.02, 0.98]}, "on": {"values": [1.01, 1.02, 1.00]}},
           "pair_ratios": [1.01, 1.0, 1.02], "ratio": 1.01, "goal_ratio_max": 1.02,
           "setup": {"total": 2**30, "scrape_interval": 1.0, "pinned": True}}
ROTATION = {"rotation": {"exit_code": 0, "seconds": 3.2}, "files_failed": 0, "files_sent": 1200, "jobs": 60,
            "jobs_failed": 0, "params": {"seconds": 60},
            "sessions_per_generation": {"0": 30, "g1": 31},
            "sessions_of_jobs_submitted_after_the_rotation": {"g1": 25}}
DOCTOR = {"summary": {"named": 3, "broken_paths": 3, "met": True, "baseline": "none found"},
          "cases": [{"case": "baseline", "expected": "none found", "verdict": "none found", "named": True},
                    {"case": "buffer", "expected": "buffer cap", "verdict": "buffer cap", "named": True},
                    {"case": "bottleneck", "expected": "bottleneck", "verdict": "bottleneck", "named": True},
                    {"case": "disk", "expected": "destination disk", "verdict": "destination disk", "named": True}]}


def test_metrics_overhead_is_met_at_or_below_two_percent_and_not_above():
    text, met = metrics_overhead(METRICS, Path("x"))
    assert met == "yes" and "1.010×" in text and "3 ABBA pairs" in text
    worse = copy.deepcopy(METRICS)
    worse["ratio"] = 1.05
    assert metrics_overhead(worse, Path("x"))[1] == "no"
    empty = copy.deepcopy(METRICS)
    empty["cpu_s_per_gb"]["on"]["values"] = []
    with pytest.raises(ValueError):
        metrics_overhead(empty, Path("x"))


def test_rotation_needs_zero_failed_files_and_only_the_new_generation_after_it():
    text, met = rotation_goal(ROTATION, Path("x"))
    assert met == "yes" and text.startswith("0 failed of 1,200 files") and "used g1" in text
    failed = copy.deepcopy(ROTATION)
    failed["files_failed"] = 1
    assert rotation_goal(failed, Path("x"))[1] == "no"
    mixed = copy.deepcopy(ROTATION)
    mixed["sessions_of_jobs_submitted_after_the_rotation"] = {"0": 1, "g1": 24}
    assert rotation_goal(mixed, Path("x"))[1] == "no"


def test_doctor_needs_all_three_causes_named():
    text, met = doctor_goal(DOCTOR, Path("x"))
    assert met == "yes" and text.startswith("named 3 of 3") and "baseline: 'none found'" in text
    missed = copy.deepcopy(DOCTOR)
    missed["summary"].update(named=2, met=False)
    missed["cases"][3].update(verdict="none found", named=False)
    text, met = doctor_goal(missed, Path("x"))
    assert met == "no" and "expected 'destination disk'" in text
