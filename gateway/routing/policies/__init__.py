"""Policy registry: the one table from YAML `type` to class."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.errors import ConfigError
from gateway.routing.policies.base import Policy

REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    REGISTRY[cls.type] = cls
    return cls


def build_policy(type_: str, params: Mapping[str, Any] | None, key: str) -> Policy:
    """Instantiate a policy from config; errors name the key."""
    _load_builtin()
    cls = REGISTRY.get(type_)
    if cls is None:
        raise ConfigError(f"unknown policy {type_!r} (known: {', '.join(sorted(REGISTRY))})", key=f"{key}.policy")
    return cls.from_config(params, f"{key}.params")


def _load_builtin() -> None:
    # Imported here so each policy module can `@register` itself without an import cycle.
    from gateway.routing.policies import (  # noqa: F401
        consistent_hash,
        least_loaded,
        power_of_two,
        prefix_affinity,
        random_choice,
        round_robin,
        session_affinity,
    )


__all__ = ["REGISTRY", "Policy", "build_policy", "register"]
