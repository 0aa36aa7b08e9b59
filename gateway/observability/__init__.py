"""Metrics (Prometheus), tracing (OpenTelemetry), request timing and the decision log.

Imports config, request, and what its gauges watch (replicas, index, index.kv_events); never routing,
relay or serving.
"""
