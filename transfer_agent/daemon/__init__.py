"""The long-running agent: consumes jobs from the Redis bus, runs them, heartbeats, retries, acks."""
