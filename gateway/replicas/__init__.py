"""Replicas: state and health of one replica, the pool per model, probes and load scrapes."""

from gateway.replicas.health import Monitor
from gateway.replicas.pool import ReplicaPool
from gateway.replicas.replica import Replica, ReplicaLoad

__all__ = ["Monitor", "Replica", "ReplicaLoad", "ReplicaPool"]
