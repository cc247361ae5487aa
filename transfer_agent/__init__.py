"""FStream transfer agent: protocol, sender, receiver, job worker and CLI (never imports Airflow)."""
