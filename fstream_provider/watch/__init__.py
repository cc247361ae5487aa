"""The one file watcher, Airflow-free: finds new files (local or SFTP), decides when they are stable, remembers what was seen."""
