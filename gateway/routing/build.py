"""Building one pool's Router from its config: policy, warm-prefix index, prompt keys and exact tables.

Kept next to `gateway.routing.router` so the route table (`gateway.routing.route_table`) only decides *whether* a pool
needs a new router (a reload keeps one whose routing section and store are unchanged), not how
one is put together. Building may raise ConfigError, before anything running is touched.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.config.loader import Config
from gateway.config.pools import PoolConfig
from gateway.index import build_index
from gateway.index.exact import ExactTables
from gateway.observability.routing_metrics import RoutingMetrics
from gateway.prompt import prefix_keys as prefix
from gateway.prompt.prompt_keys import PromptKeys
from gateway.prompt.replica_tokenizer import ReplicaTokenizer
from gateway.prompt.tokenizers import build_prompt_tokenizer
from gateway.routing.policies.registry import build_policy
from gateway.routing.router import Router


def build_router(
    model: str, pool: PoolConfig, config: Config, metrics: RoutingMetrics, urls: Callable[[], list[str]]
) -> Router:
    """A new router for `model`'s pool. `urls`: the pool's replicas taking traffic now, for a
    `tokenizer: replica` pool (the replicas' own /tokenize)."""
    key = f"pools.{model}.routing"
    policy = build_policy(pool.routing.policy, pool.routing.params, key)
    params = pool.routing.prefix
    store = config.index_store(model)
    index = build_index(store)
    keys = exact = None
    if params.tokenizer is not None:
        tokenizer = (
            ReplicaTokenizer(model, urls)
            if params.tokenizer == "replica"
            else build_prompt_tokenizer(params.tokenizer, key=f"{key}.prefix.tokenizer")
        )
        keys = PromptKeys(tokenizer, budget_s=params.tokenize_budget_ms / 1000)
        if pool.has_kv_events:
            shared = store.url is not None  # other gateways read what the events say
            exact = ExactTables(
                prefix.model_seed(model), params.block, params.speculative_ttl_s, share=index.record if shared else None
            )
    return Router(policy, params, index, metrics, pool=model, keys=keys, exact=exact)
