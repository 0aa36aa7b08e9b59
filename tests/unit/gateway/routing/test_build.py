"""Building a pool's router from its config: the prompt keys and exact tables only where the pool asks."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from gateway.config.loader import parse_config
from gateway.observability.routing_metrics import RoutingMetrics
from gateway.prompt.replica_tokenizer import ReplicaTokenizer
from gateway.routing.build import build_router
from gateway.routing.router import Router


async def built(prefix_section: dict[str, Any], kv_events: bool = False) -> Router:
    """The router built for pool `m` (closed: only its parts are looked at); its replicas' URLs: `a`'s."""
    replica: dict[str, Any] = {"url": "http://a:1", "name": "a"}
    if kv_events:
        replica["kv_events"] = {"endpoint": "tcp://127.0.0.1:5557"}
    config = parse_config(
        {"pools": {"m": {"replicas": [replica], "routing": {"policy": "prefix_affinity", "prefix": prefix_section}}}}
    )
    router = build_router("m", config.pools["m"], config, RoutingMetrics(CollectorRegistry()), lambda: ["http://a:1"])
    await router.close()
    return router


async def test_without_a_tokenizer_the_router_keys_by_characters_and_has_no_exact_tables() -> None:
    router = await built({})
    assert router.keys is None and router.exact is None and router.pool == "m"
    assert router.policy.type == "prefix_affinity"


async def test_a_named_tokenizer_gives_prompt_keys_and_kv_events_give_exact_tables() -> None:
    router = await built({"tokenizer": "sim"})
    assert router.keys is not None and router.exact is None
    router = await built({"tokenizer": "sim"}, kv_events=True)
    assert router.keys is not None and router.exact is not None


async def test_the_replica_tokenizer_asks_the_pool_for_its_urls() -> None:
    router = await built({"tokenizer": "replica"})
    assert router.keys is not None and isinstance(router.keys.tokenizer, ReplicaTokenizer)
    assert router.keys.tokenizer.urls() == ["http://a:1"]
