"""The transfer model both sides share, Airflow- and Redis-free: the transfer spec, units (sizes, rates, durations), task-log formatting."""
