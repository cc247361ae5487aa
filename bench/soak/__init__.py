"""Issue 8's soak: a streamed workload under random faults, ended by the invariant check."""
