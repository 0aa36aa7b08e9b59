"""Affinity Gateway: a cache-affinity load-balancing gateway for vLLM-compatible replicas."""

__version__ = "0.1.0"
