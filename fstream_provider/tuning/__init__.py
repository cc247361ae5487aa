"""Pure tuning algorithms: heuristic, clustering, online profiling, QoS, HARP, scheduling, simulator (no I/O)."""
