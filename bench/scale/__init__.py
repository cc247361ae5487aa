"""Scale: growing and million-file streams, the facility's 10,000 jobs, retention, the history cache."""
