"""block_tokens learned from the replicas when unset (cache_config_info, BlockStored events); a
configured value that differs from a replica's is logged once and exported as a gauge."""

from __future__ import annotations

import pytest
import structlog
from prometheus_client import CollectorRegistry

from gateway.config.pools import PrefixConfig
from gateway.index.exact import ExactTables
from gateway.observability.routing_metrics import RoutingMetrics
from gateway.prompt import prefix_keys as prefix
from gateway.routing.policies.registry import build_policy
from gateway.routing.router import Router

pytestmark = pytest.mark.timeout(30)
MODEL = "m"


def router(block_tokens: int | None) -> tuple[Router, ExactTables, CollectorRegistry]:
    registry = CollectorRegistry()
    params = PrefixConfig(block_tokens=block_tokens)
    exact = ExactTables(prefix.model_seed(MODEL), params.block)
    built = Router(
        build_policy("prefix_affinity", {}, "p"), params, metrics=RoutingMetrics(registry), pool=MODEL, exact=exact
    )
    return built, exact, registry


def test_unset_block_tokens_is_learned_from_the_first_event() -> None:
    built, exact, _ = router(None)
    assert built.prefix_params.block == 16  # vLLM's default until a replica says otherwise
    exact.stored("a", [1], None, list(range(128)), 128)
    assert built.prefix_params.block == 128 and exact.block_tokens == 128
    assert exact.size("a") == 1


def test_unset_block_tokens_is_learned_from_cache_config_info() -> None:
    built, exact, _ = router(None)
    built.calibration.block_size_seen("a", 128, "cache_config_info")
    assert built.prefix_params.block == 128 and exact.block_tokens == 128


def test_a_configured_block_size_that_differs_is_logged_once_and_exported() -> None:
    built, exact, registry = router(16)
    with structlog.testing.capture_logs() as logs:
        exact.stored("a", [1], None, list(range(128)), 128)
        exact.stored("a", [2], 1, list(range(128, 256)), 128)
        built.calibration.block_size_seen("a", 128, "cache_config_info")
    assert [e["event"] for e in logs].count("block_tokens_mismatch") == 1
    mismatch = "affinity_gateway_block_tokens_mismatch"
    assert registry.get_sample_value(mismatch, {"model_name": MODEL, "replica": "a"}) == 128
    assert built.prefix_params.block == 16  # the configured value stands
    built.calibration.block_size_seen("b", 16, "cache_config_info")
    assert registry.get_sample_value(mismatch, {"model_name": MODEL, "replica": "b"}) == 0
