"""The one table from a policy's YAML `type` to its class, and `build_policy`.

Each policy's parameters are its config class (`gateway.config.policy_params`), validated with the
config; `build_policy` builds the parameters, then the policy. Kept out of the package's `__init__`,
so importing the policy interface (`base`) never loads every policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.config.policy_params import policy_config
from gateway.routing.policies.base import Policy
from gateway.routing.policies.consistent_hash import ConsistentHashPolicy
from gateway.routing.policies.least_loaded import LeastLoadedPolicy
from gateway.routing.policies.power_of_two import PowerOfTwoPolicy
from gateway.routing.policies.prefix_affinity import PrefixAffinityPolicy
from gateway.routing.policies.random_choice import RandomPolicy
from gateway.routing.policies.round_robin import RoundRobinPolicy
from gateway.routing.policies.session_affinity import SessionAffinityPolicy

REGISTRY: dict[str, type[Policy]] = {
    cls.type: cls
    for cls in (
        ConsistentHashPolicy,
        LeastLoadedPolicy,
        PowerOfTwoPolicy,
        PrefixAffinityPolicy,
        RandomPolicy,
        RoundRobinPolicy,
        SessionAffinityPolicy,
    )
}


def build_policy(type_: str, params: Mapping[str, Any] | None, key: str) -> Policy:
    """Instantiate a policy from config; errors name the key (`key.policy`, `key.params...`)."""
    config = policy_config(type_, params, key)  # first: an unknown name is a ConfigError naming the key
    return REGISTRY[type_](config)


__all__ = ["REGISTRY", "build_policy"]
