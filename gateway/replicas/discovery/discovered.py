"""What either discovery hands its pool: replica configs for the addresses found (`discovered_replica`),
applied by the route table through an `Apply` callback. Shared by DNS (`dns`) and Kubernetes
(`kubernetes`) discovery, so neither imports the other but to start it."""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable

from gateway.config.kubernetes import Role
from gateway.config.pools import DiscoveryConfig, KVEventsConfig, ReplicaConfig

Apply = Callable[[str, list[ReplicaConfig], frozenset[str]], Awaitable[None]]
"""(model, the pool's discovered replicas, the ids among them that must take no traffic yet)."""


def discovered_replica(
    spec: DiscoveryConfig, address: str, port: int, name: str = "", adapters: tuple[str, ...] = (), role: Role = "both"
) -> ReplicaConfig:
    """The replica at `address:port`, with its KV-event feed when the pool's replicas publish one."""
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    events = None
    if spec.kv_events_port is not None:
        replay = f"tcp://{host}:{spec.kv_events_replay_port}" if spec.kv_events_replay_port else None
        events = KVEventsConfig(endpoint=f"tcp://{host}:{spec.kv_events_port}", replay_endpoint=replay)
    return ReplicaConfig(
        url=f"{spec.scheme}://{host}:{port}",
        name=name,
        weight=spec.weight,
        kv_events=events,
        adapters=adapters,
        role=role,
    )


__all__ = ["Apply", "discovered_replica"]
