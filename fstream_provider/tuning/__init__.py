"""Pure tuning algorithms: the tuner registry, heuristic, clustering, online profiling, QoS, simulator (no I/O)."""
