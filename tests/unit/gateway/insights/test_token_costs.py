"""Token cost and cache savings: the arithmetic, the price config and its errors, minute buckets and
the window of /admin/usage, the Prometheus counters, and the fleet's totals in a real Redis."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.config.loader import parse_config
from gateway.config.pools import PoolConfig, PricesConfig, ReplicaConfig
from gateway.errors import BadRequestError, ConfigError
from gateway.insights.shared_usage import SharedUsage
from gateway.insights.token_costs import ANONYMOUS, RETENTION_S, TokenCosts, UsageQuery, _CostCollector
from gateway.request.usage import Usage

pytestmark = pytest.mark.timeout(30)
PRICES = PricesConfig(input=3.0, cached_input=0.3, output=15.0)
POOL = PoolConfig(replicas=(ReplicaConfig(url="http://127.0.0.1:1"),), prices=PRICES)
FREE = PoolConfig(replicas=(ReplicaConfig(url="http://127.0.0.1:1"),))


def usage(prompt: int | None, cached: int | None, completion: int | None) -> Usage:
    return Usage(prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion)


def clock(monkeypatch: pytest.MonkeyPatch, start: float = 1_800_000_000.0) -> list[float]:
    now = [start]
    monkeypatch.setattr("gateway.insights.token_costs.time.time", lambda: now[0])
    return now


def test_cost_and_savings_are_the_price_arithmetic() -> None:
    # 1000 prompt tokens of which 800 cached, 50 completion tokens
    assert PRICES.cost(1000, 800, 50) == pytest.approx((200 * 3.0 + 800 * 0.3 + 50 * 15.0) / 1e6)
    assert PRICES.saved(800) == pytest.approx(800 * (3.0 - 0.3) / 1e6)
    # no cache: the saving is zero and the cost the full prompt price
    assert PRICES.cost(1000, 0, 0) == pytest.approx(3000 / 1e6) and PRICES.saved(0) == 0


def test_prices_load_from_yaml_and_errors_name_the_key() -> None:
    base: dict[str, Any] = {"replicas": [{"url": "http://127.0.0.1:1"}]}
    config = parse_config({"pools": {"m": {**base, "prices": {"input": 3, "cached_input": 0.3, "output": 15}}}})
    assert config.pools["m"].prices == PRICES
    assert parse_config({"pools": {"m": base}}).pools["m"].prices is None
    for prices, key, says in (
        ({"input": -1, "cached_input": 0, "output": 1}, "pools.m.prices.input", ">= 0"),
        ({"input": 1, "cached_input": 2, "output": 1}, "pools.m.prices.cached_input", "must not exceed input"),
        ({"input": 1, "output": 1}, "pools.m.prices.cached_input", "required"),
        ({"input": 1, "cached_input": 0, "output": "x"}, "pools.m.prices.output", "expected a number"),
        ({"input": 1, "cached_input": 0, "output": 1, "currency": "usd"}, "pools.m.prices.currency", "unknown"),
    ):
        with pytest.raises(ConfigError) as info:
            parse_config({"pools": {"m": {**base, "prices": prices}}})
        assert info.value.key == key and says in str(info.value), (prices, str(info.value))


async def test_counts_per_tenant_and_model_with_null_cost_where_unpriced(monkeypatch: pytest.MonkeyPatch) -> None:
    now = clock(monkeypatch)
    costs = TokenCosts()
    costs.record("acme", "m", usage(1000, 800, 50), POOL)
    costs.record("acme", "m", usage(1000, 0, 50), POOL)
    costs.record(None, "free", usage(10, 0, 5), FREE)
    costs.record("acme", "m", Usage(), POOL)  # no usage (an error answer, /tokenize): nothing counted
    report = await costs.report(UsageQuery.parse({}, now[0]))
    assert report["source"] == "local" and not report["degraded"]
    rows = {(r["tenant"], r["model"]): r for r in report["usage"]}
    acme = rows[("acme", "m")]
    assert (acme["requests"], acme["prompt_tokens"], acme["cached_tokens"], acme["completion_tokens"]) == (
        2,
        2000,
        800,
        100,
    )
    assert acme["cost"] == pytest.approx(PRICES.cost(1000, 800, 50) + PRICES.cost(1000, 0, 50))
    assert acme["saved_by_cache"] == pytest.approx(PRICES.saved(800))
    free = rows[(ANONYMOUS, "free")]
    assert free["prompt_tokens"] == 10 and free["cost"] is None and free["saved_by_cache"] is None
    assert report["total"]["requests"] == 3 and report["total"]["cost"] == pytest.approx(acme["cost"])
    only = await costs.report(UsageQuery.parse({"tenant": "acme"}, now[0]))
    assert [r["tenant"] for r in only["usage"]] == ["acme"]


async def test_a_reported_cached_count_above_the_prompt_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    now = clock(monkeypatch)
    costs = TokenCosts()
    costs.record("t", "m", usage(100, 500, 0), POOL)
    row = (await costs.report(UsageQuery.parse({}, now[0])))["usage"][0]
    assert row["cached_tokens"] == 100 and row["cost"] == pytest.approx(100 * 0.3 / 1e6)


async def test_the_window_counts_whole_minutes_and_old_buckets_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    now = clock(monkeypatch, 1_800_000_000.0 - 1_800_000_000.0 % 60)  # the start of a minute
    costs = TokenCosts()
    costs.record("t", "m", usage(100, 0, 0), POOL)
    now[0] += 600
    costs.record("t", "m", usage(10, 0, 0), POOL)

    async def prompt_tokens(query: dict[str, str]) -> int:
        return (await costs.report(UsageQuery.parse(query, now[0])))["total"]["prompt_tokens"]

    assert await prompt_tokens({"window_s": "60"}) == 10
    assert await prompt_tokens({"window_s": "601"}) == 110  # reaches into the first minute
    assert await prompt_tokens({"since": str(now[0] - 300)}) == 10
    assert await prompt_tokens({}) == 110
    now[0] += RETENTION_S - 300
    costs.record("t", "m", usage(1, 0, 0), POOL)  # a new minute drops the buckets older than a day
    assert await prompt_tokens({"since": "0"}) == 11


@pytest.mark.parametrize(
    "query, param",
    [
        ({"window_s": "0"}, "window_s"),
        ({"window_s": "x"}, "window_s"),
        ({"since": "nan"}, "since"),
        ({"since": "1", "window_s": "5"}, "window_s"),
    ],
)
def test_bad_windows_are_400s_naming_the_parameter(query: dict[str, str], param: str) -> None:
    with pytest.raises(BadRequestError) as info:
        UsageQuery.parse(query, 1_800_000_000.0)
    assert info.value.param == param


def test_prometheus_counters_by_tenant_model_and_kind() -> None:
    costs = TokenCosts()
    costs.record("acme", "m", usage(1000, 800, 50), POOL)
    costs.record("acme", "free", usage(10, 0, 5), FREE)
    registry = CollectorRegistry()
    registry.register(_CostCollector(costs))
    text = generate_latest(registry).decode()
    assert 'affinity_gateway_tokens_total{kind="cached",model_name="m",tenant="acme"} 800.0' in text
    assert 'affinity_gateway_tokens_total{kind="completion",model_name="free",tenant="acme"} 5.0' in text
    assert f'affinity_gateway_cost_total{{model_name="m",tenant="acme"}} {PRICES.cost(1000, 800, 50)!r}' in text
    assert f'affinity_gateway_cache_savings_total{{model_name="m",tenant="acme"}} {PRICES.saved(800)!r}' in text
    assert 'affinity_gateway_cost_total{model_name="free"' not in text  # unpriced: no cost series


@pytest.mark.redis
async def test_two_gateways_add_up_in_redis_and_fall_back_to_their_own(redis_url: str) -> None:
    prefix = f"t-{uuid.uuid4().hex[:8]}:"
    gateways = [TokenCosts(SharedUsage(redis_url, prefix, 600)) for _ in range(2)]
    try:
        gateways[0].record("acme", "m", usage(1000, 800, 50), POOL)
        gateways[1].record("acme", "m", usage(1000, 0, 50), POOL)
        gateways[1].record("beta", "m", usage(10, 0, 0), POOL)
        assert await gateways[1].flush()
        report = await gateways[0].report(UsageQuery.parse({}, time.time()))  # flushes its own first
        assert report["source"] == "redis" and report["scope"] == "all gateways"
        rows = {r["tenant"]: r for r in report["usage"]}
        assert rows["acme"]["requests"] == 2 and rows["acme"]["cached_tokens"] == 800
        assert rows["acme"]["cost"] == pytest.approx(PRICES.cost(1000, 800, 50) + PRICES.cost(1000, 0, 50))
        assert rows["acme"]["saved_by_cache"] == pytest.approx(PRICES.saved(800))
        assert report["total"]["requests"] == 3
    finally:
        for gateway in gateways:
            assert gateway.shared is not None
            await gateway.shared.close()
    down = TokenCosts(SharedUsage("redis://127.0.0.1:9/0", prefix, 600))
    down.record("acme", "m", usage(5, 0, 0), POOL)
    report = await down.report(UsageQuery.parse({}, time.time()))
    assert report["source"] == "local" and report["degraded"] and report["total"]["prompt_tokens"] == 5
    assert not await down.flush() and down.shared is not None and down.shared.degraded  # kept for the next try
    await down.shared.close()
