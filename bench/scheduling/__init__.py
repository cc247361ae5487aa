"""SEAL/STEAL and the scheduler: trace replay, the WAN burst, a cycle's compute and Redis cost."""
