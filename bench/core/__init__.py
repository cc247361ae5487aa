"""The harness every benchmark shares: provenance, result files, summaries, the goals table and its readers, CPU meters, workloads, A/B."""
