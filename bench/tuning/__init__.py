"""Tuners on the emulated WAN and in the simulator: the heuristic's breakdown, QoS, HARP, deadlines, pools, path
filling, the oracle."""
