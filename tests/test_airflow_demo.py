"""``fstream_demo.airflow_demo.run_demo`` (the Airflow part of ``make demo``) tells the whole story end to end."""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fstream-airflow-home-"))
pytest.importorskip("airflow")

from fstream_demo.airflow_demo import run_demo  # noqa: E402


@pytest.mark.slow
def test_run_demo_streams_a_run_and_prints_the_task_log(tmp_path, redis_url):
    lines: list[str] = []
    report = run_demo(workdir=str(tmp_path), files=6, file_size=256 * 1024, every=0.05, idle_exit="2s",
                      redis_url=redis_url, out=lines.append)
    text = "\n".join(lines)
    assert report["files"] == report["verified_files"] == 6 and report["failed_files"] == 0
    assert "byte-identical at the destination: yes" in text
    assert "t=" in text and "(target 800.00 Mbit/s" in text and "| files" in text
    assert report["plot"] and open(report["plot"], "rb").read(4) == b"\x89PNG"
