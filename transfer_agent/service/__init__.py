"""Running FStream as a facility service (issue 30): metrics, health, systemd readiness."""
