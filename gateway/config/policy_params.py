"""Each routing policy's parameters (`pools.<model>.routing.params`), and the table from a policy's
YAML name to its parameter class.

Naming: the parameters of policy class `XPolicy` (`gateway.routing.policies`) are `XPolicyConfig`, as
every config class is named `<what it configures>Config`. Validating a policy's parameters builds
this class only (`policy_config`), never a policy: the policies import their class from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from gateway.config import schema
from gateway.config.schema import Section
from gateway.errors import ConfigError, join_key


class CostModelConfig(Section):
    """The prefill cost model's parameters (`gateway.routing.policies.cost`), part of prefix_affinity's."""

    prefill_s_per_token: float = 0.0002  # starting point (5k tokens/s); learned online
    calibrate: Literal["pool", "replica"] = "pool"  # one cost for the pool's (alike) replicas, or each its own
    per_request_tokens: float = 50.0  # TTFT each running request adds, in prefill tokens; learned lower, never higher
    # ...plus this many prefill tokens per token of its prompt: every batched step reads each in-flight
    # request's whole context, so long prompts in flight slow the next first token more
    context_weight: float = 0.05
    burst_weight: float = 1.0  # ...and the same group's own requests there beyond the first, × per_request_tokens
    learn_alpha: float = 0.1  # weight of one observation in the EWMA; 0 disables learning
    min_learn_tokens: int = 64  # until prompt sizes vary enough to fit a line, shorter prefills teach the fixed part

    def check(self) -> None:
        if self.prefill_s_per_token <= 0:
            raise ConfigError("must be > 0", key="prefill_s_per_token")
        if self.per_request_tokens < 0:
            raise ConfigError("must be >= 0", key="per_request_tokens")
        if self.context_weight < 0:
            raise ConfigError("must be >= 0", key="context_weight")
        if self.burst_weight < 0:
            raise ConfigError("must be >= 0", key="burst_weight")
        if not 0 <= self.learn_alpha <= 1:
            raise ConfigError("must be between 0 and 1", key="learn_alpha")


class PolicyConfig(Section):
    """A policy without parameters (round_robin)."""


class SeededPolicyConfig(Section):
    """random, least_loaded and power_of_two: only the seed of their random choices."""

    seed: int | None = None  # fixes the policy's random choices (reproducible tests and simulations)


class ConsistentHashPolicyConfig(Section):
    virtual_nodes: int = 256
    load_epsilon: float = 0.25
    min_bound_requests: int = 4

    def check(self) -> None:
        if self.virtual_nodes < 1:
            raise ConfigError("must be at least 1", key="virtual_nodes")


class SessionAffinityPolicyConfig(Section):
    bonus_requests: float = 4.0  # the home replica may carry this many more requests and still win
    load_epsilon: float = 0.25
    min_bound_requests: int = 4
    seed: int | None = None


class PrefixAffinityPolicyConfig(CostModelConfig):
    preamble_weight: float = 0.0  # how much a warm preamble (tools + system prompt) attracts, 0..1
    load_epsilon: float = 0.25  # no replica above (1 + epsilon) × mean load while another has room
    min_bound_requests: int = 4  # ...unless it holds fewer than this many requests
    tie_s: float = 0.005  # predicted TTFTs this close count as tied
    tie_ratio: float = 0.05  # ...or this fraction of the best
    balance_window_s: float = 60.0  # ties go to the replica sent the fewest requests lately
    shared_preamble_requests: int = 2  # requests within balance_window_s before a preamble is replicated
    preamble_spread: float = 2.0  # holders wanted per replica-share of the traffic a preamble carries
    bound_margin: float = 1.0  # over the bound, stay only if moving costs more than (1 + this) × the wait
    full_cache_fill: float = 0.95  # ...or, once the caches are this full on average (as the index sees them),
    # a request with no home of its own stays unless it would be slower there outright (> 1: never)
    eviction_weight: float = 1.0  # writing a shared preamble into a full cache also costs this × its prefill
    delay_weight: float = 1.0  # a prefill also costs this × the delay it causes the requests queued behind it
    home_credit: float = 1.0  # ...where a preamble's last replica is taken to keep this share of it
    conversation_share: float = 0.5  # above this share of recent requests continuing a conversation,
    # a new one goes to the least full cache among the tied (1 = never)
    return_weight: float = 0.0  # a new conversation's prefill also costs this × the delay it causes the later
    # turns of the conversations between turns where it lands (0 = off: nothing is counted)
    return_window_s: float = 5.0  # ...which are expected back within about this long
    seed: int | None = None

    def check(self) -> None:
        super().check()
        if self.load_epsilon < 0:
            raise ConfigError("must be >= 0", key="load_epsilon")
        if not 0 <= self.preamble_weight <= 1:
            raise ConfigError("must be between 0 and 1", key="preamble_weight")
        if self.balance_window_s <= 0:
            raise ConfigError("must be > 0", key="balance_window_s")
        if self.shared_preamble_requests < 1:
            raise ConfigError("must be at least 1", key="shared_preamble_requests")
        if self.bound_margin < 0:
            raise ConfigError("must be >= 0", key="bound_margin")
        if self.full_cache_fill <= 0:
            raise ConfigError("must be > 0 (above 1: never)", key="full_cache_fill")
        if self.delay_weight < 0:
            raise ConfigError("must be >= 0", key="delay_weight")
        if self.return_weight < 0:
            raise ConfigError("must be >= 0", key="return_weight")
        if self.return_window_s <= 0:
            raise ConfigError("must be > 0", key="return_window_s")
        if not 0 <= self.home_credit <= 1:
            raise ConfigError("must be between 0 and 1", key="home_credit")
        if not 0 <= self.conversation_share <= 1:
            raise ConfigError("must be between 0 and 1", key="conversation_share")
        if self.eviction_weight < 0:
            raise ConfigError("must be >= 0", key="eviction_weight")
        if self.preamble_spread <= 0:
            raise ConfigError("must be > 0", key="preamble_spread")
        if self.tie_s < 0 or self.tie_ratio < 0:
            raise ConfigError("must be >= 0", key="tie_s")


POLICY_CONFIGS: dict[str, type[Section]] = {
    "consistent_hash": ConsistentHashPolicyConfig,
    "least_loaded": SeededPolicyConfig,
    "power_of_two": SeededPolicyConfig,
    "prefix_affinity": PrefixAffinityPolicyConfig,
    "random": SeededPolicyConfig,
    "round_robin": PolicyConfig,
    "session_affinity": SessionAffinityPolicyConfig,
}


# Other routers' names for what a policy here does: refused with the name to write instead, since their
# parameters differ (SGLang's and vLLM's routers).
PEER_NAMES = {
    "cache_aware": "prefix_affinity",
    "prefix_aware": "prefix_affinity",
    "prefix_cache": "prefix_affinity",
    "kv_aware": "prefix_affinity",
    "power_of_two_choices": "power_of_two",
    "least_request": "least_loaded",
    "roundrobin": "round_robin",
}


def policy_config(type_: str, params: Mapping[str, Any] | None, key: str) -> Any:
    """Policy `type_`'s parameters, built and validated; errors name `key.policy` or `key.params...`."""
    cls = POLICY_CONFIGS.get(type_)
    if cls is None:
        known = ", ".join(sorted(POLICY_CONFIGS))
        if type_ in PEER_NAMES:
            hint = f"; {type_!r} is another router's name: write {PEER_NAMES[type_]!r}"
        else:
            hint = schema.near(type_, POLICY_CONFIGS)
        raise ConfigError(f"unknown policy {type_!r}{hint} (known: {known})", key=join_key(key, "policy"))
    return schema.build(cls, params or {}, join_key(key, "params"))


__all__ = [
    "POLICY_CONFIGS",
    "ConsistentHashPolicyConfig",
    "CostModelConfig",
    "PolicyConfig",
    "PrefixAffinityPolicyConfig",
    "SeededPolicyConfig",
    "SessionAffinityPolicyConfig",
    "policy_config",
]
