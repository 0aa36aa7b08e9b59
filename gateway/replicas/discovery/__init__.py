"""Where a pool's replicas come from besides the config: DNS names and Kubernetes EndpointSlices.

Imports replicas and config; never routing or serving.
"""
