"""Replicas: state and health of one replica, the pool per model, probes and load scrapes, the key a
replica wants (`backend_auth`), with `discovery/`. Imports config, request and support only."""

from gateway.replicas.health import Monitor
from gateway.replicas.pool import ReplicaPool
from gateway.replicas.replica import Replica, ReplicaLoad

__all__ = ["Monitor", "Replica", "ReplicaLoad", "ReplicaPool"]
