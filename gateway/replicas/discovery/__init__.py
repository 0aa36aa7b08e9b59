"""Where a pool's replicas come from besides the config: DNS names and Kubernetes EndpointSlices.

Imports config and support only; the route table applies what it finds.
"""
