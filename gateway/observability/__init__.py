"""Metrics (Prometheus), tracing (OpenTelemetry), request timing and the decision log.

Imports config and the top-level modules only.
"""
