"""Airflow under measurement: trigger latency, operator overhead, the triggerer at scale, the live view, the soak."""
