"""One model's route: its replica pool, its router and the routing section they were built from. The
route table (`gateway.routing.route_table`) holds one per pool; the request path, the adapters and the
admin routes read them."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.pools import RoutingConfig
from gateway.replicas import ReplicaPool
from gateway.routing.router import Router


@dataclass(slots=True)
class ModelRoute:
    """Everything needed to route one model's requests."""

    model: str
    pool: ReplicaPool
    router: Router
    routing: RoutingConfig


__all__ = ["ModelRoute"]
