"""Observability: Prometheus metrics and the HTTP probes (/metrics, /healthz, /readyz, /status)."""
