"""Destination storage: part files and their ranges sidecars, byte ranges, checksums, path validation, durable group commit."""
