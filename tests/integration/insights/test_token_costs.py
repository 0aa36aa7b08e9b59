"""Token cost and cache savings over real processes: with known prices, a gateway's /admin/usage and
/metrics equal the arithmetic on the usage its clients received from the replica stub (a repeated long
prompt, so the stub reports cached tokens), per tenant; two gateways sharing a real Redis add up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.edge.auth import hash_key
from tests.integration.gateway_procs import MODEL, Gateway, pool, running, start_gateway, start_stub
from tests.integration.reliability_tools import RedisServer, chat, eventually

pytestmark = pytest.mark.timeout(60)
PRICES = {"input": 2.5, "cached_input": 1.25, "output": 10.0}
ADMIN, ACME, BETA = "sk-admin-costs-0123", "sk-acme-costs-4567", "sk-beta-costs-89ab"
KEYS = [
    {"sha256": hash_key(ADMIN), "tenant": "ops", "admin": True},
    {"sha256": hash_key(ACME), "tenant": "acme"},
    {"sha256": hash_key(BETA), "tenant": "beta"},
]
LONG = "You are a careful assistant. " + " ".join(f"Rule {i}: answer tersely about topic {i}." for i in range(80))


def priced_pool(url: str) -> dict[str, Any]:
    return {**pool(("only", url)), "prices": PRICES}


def ask(gateway: Gateway, key: str, stream: bool, turn: int) -> dict[str, int]:
    """One chat request with the long prompt; the usage the client received."""
    body = chat(
        f"{LONG} Question {turn}?",
        max_tokens=6,
        stream=stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    )
    answer = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=20
    )
    assert answer.status_code == 200, answer.text
    if stream:
        events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")]
        usage = next(e["usage"] for e in events if e.get("usage"))
    else:
        usage = answer.json()["usage"]
    return {
        "prompt": usage["prompt_tokens"],
        "cached": usage["prompt_tokens_details"]["cached_tokens"],
        "completion": usage["completion_tokens"],
    }


def expected(usages: list[dict[str, int]]) -> dict[str, float]:
    """The arithmetic on what the clients saw, per million tokens."""
    prompt, cached, completion = (sum(u[k] for u in usages) for k in ("prompt", "cached", "completion"))
    return {
        "requests": len(usages),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": completion,
        "cost": ((prompt - cached) * PRICES["input"] + cached * PRICES["cached_input"] + completion * PRICES["output"])
        / 1e6,
        "saved_by_cache": cached * (PRICES["input"] - PRICES["cached_input"]) / 1e6,
    }


def usage_of(gateway: Gateway, **query: str) -> dict[str, Any]:
    answer = httpx.get(
        f"{gateway.url}/admin/usage", params=query, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def assert_row(row: dict[str, Any], want: dict[str, float]) -> None:
    for name, value in want.items():
        assert row[name] == pytest.approx(value, rel=1e-9), (name, row, want)


def test_cost_and_savings_equal_the_arithmetic_on_the_reported_usage(tmp_path: Path) -> None:
    with running() as track:
        stub = track(start_stub("only"))
        gateway = track(start_gateway(tmp_path, {MODEL: priced_pool(stub.url)}, auth={"keys": KEYS}))
        acme = [ask(gateway, ACME, stream=turn % 2 == 1, turn=turn) for turn in range(4)]
        beta = [ask(gateway, BETA, stream=False, turn=9)]
        assert sum(u["cached"] for u in acme) > 0, acme  # the long prompt hit the stub's prefix cache
        report = usage_of(gateway)
        assert report["source"] == "local" and report["scope"] == "this gateway" and not report["degraded"]
        rows = {r["tenant"]: r for r in report["usage"]}
        assert set(rows) == {"acme", "beta"} and rows["acme"]["model"] == MODEL
        assert_row(rows["acme"], expected(acme))
        assert_row(rows["beta"], expected(beta))
        assert_row(report["total"], expected(acme + beta))
        assert [r["tenant"] for r in usage_of(gateway, tenant="beta")["usage"]] == ["beta"]
        assert usage_of(gateway, window_s="60")["total"]["requests"] == 5
        want = expected(acme)
        metrics = httpx.get(f"{gateway.url}/metrics", timeout=5).text
        labels = f'model_name="{MODEL}",tenant="acme"'
        assert f'affinity_gateway_tokens_total{{kind="cached",{labels}}} {float(want["cached_tokens"])}' in metrics
        for name, value in (("cost", want["cost"]), ("cache_savings", want["saved_by_cache"])):
            line = next(
                line for line in metrics.splitlines() if line.startswith(f"affinity_gateway_{name}_total{{{labels}}}")
            )
            assert float(line.split()[-1]) == pytest.approx(value, rel=1e-9), line
        user = httpx.get(f"{gateway.url}/admin/usage", headers={"Authorization": f"Bearer {ACME}"}, timeout=5)
        assert user.status_code == 403  # an admin route
        bad = httpx.get(
            f"{gateway.url}/admin/usage",
            params={"window_s": "soon"},
            headers={"Authorization": f"Bearer {ADMIN}"},
            timeout=5,
        )
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "window_s"


@pytest.mark.redis
def test_two_gateways_sharing_redis_add_up(tmp_path: Path, redis_url: str) -> None:
    shared = {"redis": {"url": redis_url, "key_prefix": f"costs-{tmp_path.name[-12:]}:"}, "index": {"store": "redis"}}
    with running() as track:
        stub = track(start_stub("only"))
        gateways = [
            track(start_gateway(tmp_path, {MODEL: priced_pool(stub.url)}, auth={"keys": KEYS}, **shared))
            for _ in range(2)
        ]
        first = [ask(gateways[0], ACME, stream=False, turn=t) for t in range(3)]
        second = [ask(gateways[1], ACME, stream=True, turn=t) for t in range(2)] + [ask(gateways[1], BETA, False, 7)]
        acme = first + second[:2]

        def fleet_has_all() -> bool:
            return usage_of(gateways[0])["total"]["requests"] == 6  # the other's flush comes within a second

        eventually(fleet_has_all, timeout_s=10, interval_s=0.2)
        for gateway in gateways:  # either gateway answers for the fleet
            report = usage_of(gateway)
            assert report["source"] == "redis" and report["scope"] == "all gateways" and not report["degraded"]
            rows = {r["tenant"]: r for r in report["usage"]}
            assert_row(rows["acme"], expected(acme))
            assert_row(rows["beta"], expected(second[2:]))
        assert_row(usage_of(gateways[1], tenant="acme")["total"], expected(acme))


@pytest.mark.redis
def test_with_redis_down_a_gateway_answers_its_own_counts_and_catches_up(tmp_path: Path) -> None:
    """Redis killed: /admin/usage says it answers locally (degraded) and requests still count; Redis back
    on the same port: the deltas kept meanwhile reach it (the fresh Redis holds only those)."""
    redis_server = RedisServer().start()
    with running() as track:
        stub = track(start_stub("only"))
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: priced_pool(stub.url)},
                auth={"keys": KEYS},
                redis={"url": redis_server.url},
                index={"store": "redis"},
            )
        )
        try:
            before = [ask(gateway, ACME, stream=False, turn=t) for t in range(2)]
            assert usage_of(gateway)["source"] == "redis"
            redis_server.kill()
            during = [ask(gateway, ACME, stream=False, turn=t) for t in range(2, 4)]
            report = usage_of(gateway)
            assert report["source"] == "local" and report["degraded"] and report["scope"] == "this gateway"
            assert_row(report["total"], expected(before + during))
            redis_server.start()
            eventually(lambda: usage_of(gateway)["source"] == "redis", timeout_s=10, interval_s=0.2)
            assert_row(usage_of(gateway)["total"], expected(during))  # the restarted Redis lost what it had
        finally:
            redis_server.stop()
