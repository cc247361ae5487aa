"""Demos that need both the agent and Airflow: a package above both, so neither imports the other."""
