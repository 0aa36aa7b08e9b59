"""The app in-process (aiohttp TestClient) against scriptable fake replicas: routes, errors, relay."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.config.loader import parse_config
from gateway.edge.auth import hash_key
from gateway.serving.app import ROUTE_TABLE, make_app
from tests.upstream import FakeReplica, serve_fakes, until

MODEL = "m1"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}

Client = TestClient[web.Request, web.Application]
Gateway = Callable[..., Awaitable[tuple[Client, list[FakeReplica]]]]


def gateway_config(urls: list[str], policy: str = "round_robin", **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "pools": {
            MODEL: {
                "replicas": [{"url": u, "name": f"r{i}"} for i, u in enumerate(urls)],
                "routing": {"policy": policy},
            }
        },
        "health": {"interval_s": 0.05, "timeout_s": 0.5, "unhealthy_after": 1},
        "load": {"interval_s": 0.05},
        "logging": {"requests": True},
    }
    for key, value in overrides.items():
        data[key] = value
    return data


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    servers: list[TestServer] = []
    clients: list[Client] = []

    async def start(*fakes: FakeReplica, **overrides: Any) -> tuple[Client, list[FakeReplica]]:
        data = gateway_config(await serve_fakes(fakes, servers), **overrides)
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(data))
        client = TestClient(TestServer(make_app(parse_config(data), path)))
        await client.start_server()
        clients.append(client)
        return client, list(fakes)

    yield start
    for client in clients:
        await client.close()
    for server in servers:
        await server.close()


async def test_chat_is_forwarded_byte_for_byte(gateway: Gateway) -> None:
    client, (fake,) = await gateway(FakeReplica("r0"))
    raw = b'{"model":"m1",  "messages":[{"role":"user","content":"hi"}], "extra": 1}'
    resp = await client.post(
        "/v1/chat/completions",
        data=raw,
        headers={
            "Content-Type": "application/json",
            "X-Request-Id": "abc",
            "Connection": "keep-alive, X-Drop",
            "X-Drop": "1",
        },
    )
    assert resp.status == 200
    assert (await resp.json())["choices"][0]["message"]["content"] == "hello from r0"
    assert resp.headers["X-Request-Id"] == "abc" and resp.headers["X-Custom"] == "kept"
    assert resp.headers["X-Replica-Id"] == "r0" and resp.headers["X-Affinity-Reason"] == "round_robin"
    assert fake.seen[0].body == raw
    assert fake.seen[0].headers["X-Request-Id"] == "abc"
    assert "X-Drop" not in fake.seen[0].headers


async def test_stream_is_relayed_with_usage_read(gateway: Gateway) -> None:
    client, _ = await gateway(FakeReplica("r0", chunks=4))
    resp = await client.post(
        "/v1/chat/completions", json={**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    )
    text = await resp.text()
    assert resp.headers["Content-Type"] == "text/event-stream"
    assert text.count("data: ") == 6 and text.endswith("data: [DONE]\n\n")
    unasked = await (await client.post("/v1/chat/completions", json={**CHAT, "stream": True})).text()
    assert unasked.count("data: ") == 5 and '"choices":[]' not in unasked  # the usage event it did not ask for
    replica = client.app[ROUTE_TABLE].routes[MODEL].pool.get("r0")
    assert replica is not None and replica.in_flight == 0


async def test_models_health_ready_admin_metrics(gateway: Gateway) -> None:
    client, _ = await gateway(FakeReplica("r0"), FakeReplica("r1"))
    assert (await (await client.get("/v1/models")).json())["data"][0]["id"] == MODEL
    assert (await client.get("/health")).status == 200
    assert (await client.get("/ready")).status == 200
    await client.post("/v1/chat/completions", json=CHAT)
    admin = await (await client.get("/admin/replicas")).json()
    assert [r["id"] for r in admin[MODEL]["replicas"]] == ["r0", "r1"]
    assert admin[MODEL]["policy"] == "round_robin"
    metrics = await (await client.get("/metrics")).text()
    assert 'affinity_gateway_requests_total{model_name="m1",replica="r0",status="200"} 1.0' in metrics
    decisions = 'affinity_gateway_route_decisions_total{model_name="m1",policy="round_robin",reason="round_robin"}'
    assert f"{decisions} 1.0" in metrics
    assert "affinity_gateway_replica_in_flight" in metrics and "affinity_gateway_ttft_seconds_bucket" in metrics


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"messages": []}', 400, "model"),
        (b'{"model": 7}', 400, "model"),
        (b'{"model": "m1", "stream": "yes"}', 400, "stream"),
        (b'{"model": "nope"}', 404, "model"),
        (b'{"model": "m1", "pad": "' + b"x" * 2000 + b'"}', 413, None),
    ],
    ids=["malformed", "not-object", "no-model", "model-not-str", "stream-not-bool", "unknown-model", "too-large"],
)
async def test_client_errors_have_openai_shape(gateway: Gateway, body: bytes, status: int, param: str | None) -> None:
    client, _ = await gateway(FakeReplica("r0"), limits={"max_body_bytes": 1000})
    resp = await client.post("/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == status
    error = (await resp.json())["error"]
    assert error["code"] == status and error["param"] == param and error["message"] and error["type"]
    assert resp.headers["X-Request-Id"]


async def test_unknown_route_is_openai_404(gateway: Gateway) -> None:
    client, _ = await gateway(FakeReplica("r0"))
    resp = await client.get("/v1/nothing")
    assert resp.status == 404 and (await resp.json())["error"]["type"] == "NotFoundError"


async def test_no_healthy_replica_panics_to_every_one_and_none_ready_is_503(gateway: Gateway) -> None:
    client, _ = await gateway(FakeReplica("r0", healthy=False))
    pool = client.app[ROUTE_TABLE].routes[MODEL].pool
    await until(lambda: pool.num_available() == 0)
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status == 200 and pool.panic, "every replica ejected: the pool routes to all of them"
    assert (await client.get("/ready")).status == 503
    for replica in pool:
        replica.ready = False  # Kubernetes says unready: not offered even in panic
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status == 503 and resp.headers["Retry-After"] == "1"


async def test_5xx_is_retried_on_another_replica(gateway: Gateway) -> None:
    client, fakes = await gateway(FakeReplica("r0", status=500), FakeReplica("r1"))
    statuses = [(await client.post("/v1/chat/completions", json=CHAT)).status for _ in range(4)]
    assert statuses == [200] * 4
    assert len(fakes[0].seen) == 2 and len(fakes[1].seen) == 4


async def test_5xx_without_other_replica_is_passed_through(gateway: Gateway) -> None:
    client, _ = await gateway(FakeReplica("r0", status=500))
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status == 500 and (await resp.json())["error"]["message"] == "boom"


async def test_connection_refused_is_502(gateway: Gateway) -> None:
    client, _ = await gateway(FakeReplica("r0"), health={"interval_s": 60})
    replica = client.app[ROUTE_TABLE].routes[MODEL].pool.get("r0")
    assert replica is not None
    await until(lambda: replica.probe_passes > 0)
    replica.url = "http://127.0.0.1:9"  # discard port: nothing listens
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status == 502 and (await resp.json())["error"]["type"] == "BadGatewayError"


async def test_slow_replica_is_504(gateway: Gateway) -> None:
    client, _ = await gateway(FakeReplica("r0", stall_s=2), timeouts={"first_byte_s": 0.2})
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status == 504 and (await resp.json())["error"]["code"] == 504


@pytest.mark.parametrize(("partial", "status"), [("stall", 504), ("close", 502)])
async def test_body_broken_after_headers(gateway: Gateway, partial: str, status: int) -> None:
    client, _ = await gateway(FakeReplica("r0", partial=partial), timeouts={"idle_s": 0.2})
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status == status and (await resp.json())["error"]["code"] == status


async def test_reload_swaps_policy_and_bad_file_keeps_config(gateway: Gateway, tmp_path: Path) -> None:
    client, _ = await gateway(FakeReplica("r0"), FakeReplica("r1"))
    state = client.app[ROUTE_TABLE]
    path = Path(state.config_path or "")
    data = yaml.safe_load(path.read_text())
    data["pools"][MODEL]["routing"] = {"policy": "least_loaded"}
    path.write_text(yaml.safe_dump(data))
    resp = await client.post("/admin/reload")
    assert resp.status == 200 and state.routes[MODEL].routing.policy == "least_loaded"
    data["pools"][MODEL]["routing"] = {"policy": "least_loaded", "params": {"sed": 1}}
    path.write_text(yaml.safe_dump(data))
    resp = await client.post("/admin/reload")
    error = (await resp.json())["error"]
    assert resp.status == 400 and error["param"] == f"pools.{MODEL}.routing.params.sed"
    assert str(path) in error["message"]
    assert state.routes[MODEL].routing.policy == "least_loaded"


async def test_unexpected_exception_is_500_json(gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    client, _ = await gateway(FakeReplica("r0"))

    async def broken(*args: Any) -> Any:
        raise ZeroDivisionError

    monkeypatch.setattr(client.app[ROUTE_TABLE].routes[MODEL].router, "decide", broken)
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status == 500 and orjson.loads(await resp.read())["error"]["type"] == "InternalServerError"


async def test_retries_never_repeat_a_replica(gateway: Gateway) -> None:
    client, fakes = await gateway(*(FakeReplica(f"r{i}", status=503) for i in range(3)), limits={"max_retries": 5})
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status == 503, "the last replica's own answer passes through"
    assert [len(f.seen) for f in fakes] == [1, 1, 0], "a second 5xx makes it a poison request: no third try"


@pytest.mark.parametrize("policy", ["prefix_affinity", "consistent_hash"])
async def test_deep_json_is_a_400_not_a_500(gateway: Gateway, policy: str) -> None:
    """orjson reads 1024 levels but writes 254: the prefix rendering must not turn that into a 500."""
    client, _ = await gateway(FakeReplica("r0"), policy=policy)
    deep = b"[" * 300 + b'"x"' + b"]" * 300
    body = orjson.dumps({**CHAT, "messages": [{"role": "user", "content": "DEEP"}]})
    body = body.replace(b'"DEEP"', b'[{"type":"text","text":"a"},' + deep + b"]")
    resp = await client.post("/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == 400 and (await resp.json())["error"]["code"] == 400
    again = await client.post("/v1/chat/completions", json=CHAT)
    assert again.status == 200, "the pool is usable after the 400"


async def test_no_retry_once_bytes_went_out(gateway: Gateway) -> None:
    client, fakes = await gateway(FakeReplica("r0", chunks=5, die_after=2), FakeReplica("r1"))
    resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    text = await resp.text()
    assert resp.status == 200 and text.count("tok") == 2
    assert text.endswith('"code":502}}\n\ndata: [DONE]\n\n') and not fakes[1].seen


async def test_api_key_gives_the_tenant_and_is_not_forwarded(gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    client, (fake,) = await gateway(FakeReplica("r0"), auth={"keys": [{"sha256": hash_key("sk-1"), "tenant": "acme"}]})
    router = client.app[ROUTE_TABLE].routes[MODEL].router
    tenants: list[str | None] = []
    decide = router.decide

    async def spy(view: Any, candidates: Any) -> Any:
        tenants.append(view.tenant)
        return await decide(view, candidates)

    monkeypatch.setattr(router, "decide", spy)
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 401
    resp = await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer sk-1"})
    assert resp.status == 200 and tenants == ["acme"]
    assert "Authorization" not in fake.seen[0].headers
    metrics = await (await client.get("/metrics")).text()
    assert 'affinity_gateway_tenant_requests_total{status="200",tenant="acme"} 1.0' in metrics
    assert 'affinity_gateway_tenant_tokens_total{kind="completion",tenant="acme"} 3.0' in metrics


async def test_5xx_from_the_only_replica_serving_an_adapter_is_passed_through() -> None:
    """r1 could take a retry of the base model, never of r0's adapter: r0's 500 is the client's answer."""
    servers = [TestServer(FakeReplica("r0", status=500).app), TestServer(FakeReplica("r1").app)]
    for server in servers:
        await server.start_server()
    data = gateway_config([str(s.make_url("")).rstrip("/") for s in servers])
    data["pools"][MODEL]["replicas"][0]["adapters"] = ["sql"]
    client = TestClient(TestServer(make_app(parse_config(data))))
    await client.start_server()
    try:
        resp = await client.post("/v1/chat/completions", json={**CHAT, "model": "sql"})
        assert resp.status == 500 and (await resp.json())["error"]["message"] == "boom"
    finally:
        await client.close()
        for server in servers:
            await server.close()
