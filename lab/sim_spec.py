"""What a simulation runs (`lab.simulate`): the simulated cluster's spec, the policy it builds on the
simulation's clock, and the in-memory index's coroutines run to completion without an event loop."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.config.policy_params import policy_config
from gateway.config.pools import PrefixConfig
from gateway.routing.policies import Policy
from gateway.routing.policies.cost import CostModel
from gateway.routing.policies.registry import build_policy
from lab.oracle import OraclePolicy
from replica_stub.config import StubConfig


@dataclass(frozen=True)
class SimSpec:
    """The simulated cluster. `stub` holds the replicas' settings (KV blocks, batch limits, timing,
    speedup) with the replica stub's defaults; `scrape_interval_s` is the gateway's `load.interval_s`."""

    replicas: int = 4
    policy: str = "round_robin"
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    model: str = "stub-model"
    stub: StubConfig = field(default_factory=lambda: StubConfig().resolved())
    prefix: PrefixConfig = field(default_factory=PrefixConfig)
    scrape_interval_s: float = 0.25
    concurrency: int = 0  # > 0: closed loop, this many sessions at a time (start times ignored)
    itl_every: int = 8  # keep every n-th inter-token gap (memory: 100k requests × 256 tokens)
    seed: int = 0
    kv_events: bool = False  # route from the replicas' KV events (token keys) instead of history


def build_policy_for(spec: SimSpec, clock: Callable[[], float]) -> Policy:
    if spec.policy == OraclePolicy.type:  # the lab's yardstick: the simulation binds it to the true state
        return OraclePolicy()
    params = dict(spec.policy_params)
    config = policy_config(spec.policy, params, "simulate")
    if "seed" in type(config).model_fields and "seed" not in params:
        params["seed"] = spec.seed  # reproducible runs
    policy = build_policy(spec.policy, params, "simulate")
    # The prefix policy's prefill queue drains in (virtual) time: give it the simulation's clock.
    cost = getattr(policy, "cost", None)
    if isinstance(cost, CostModel):
        cost.clock = clock
    return policy


def run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never really waits (the in-memory index) to completion, synchronously."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("the simulation needs an index that never waits (index.store: memory)")
