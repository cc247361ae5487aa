"""The Redis bus, Airflow-free: client factory, key schema, job model and store, embedded redis-server, profiling history store, reconcile."""
