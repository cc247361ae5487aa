"""Benchmarks and the emulated WAN testbed (imported as ``fstream_bench``; files live in ``bench/``)."""
