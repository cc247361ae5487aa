"""The harness every benchmark shares: provenance, result files, summaries, the goals table and its readers, CPU
meters, workloads, A/B; and ``RESULTS_DIR``, where every benchmark writes its results unless told otherwise."""

from pathlib import Path

#: ``bench/results``: the one default results directory (where results go is not what a benchmark measures)
RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
