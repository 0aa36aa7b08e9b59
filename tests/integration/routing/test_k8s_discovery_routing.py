"""Kubernetes discovery end to end: a real gateway app watches `tests.k8s_api`, a stand-in for the API
server (no cluster can run here) serving constructed EndpointSlice events, while small fake replicas
on 127.0.0.2-4 (one port, as pods behind a Service) answer health probes and completions. Pods are
added, readied, unreadied and removed; after each event the pool, /admin/replicas and /metrics follow
within one event's time, with the pod names as replica ids."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.config.loader import parse_config
from gateway.serving.app import ROUTE_TABLE, make_app
from tests.helpers import free_port
from tests.k8s_api import FakeSliceAPI, endpoint_slice

pytestmark = pytest.mark.timeout(60)

ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
EVENT_S = 1.0  # the pool must follow each event before the test makes the next one


@pytest.fixture
async def replicas() -> AsyncIterator[int]:
    """One tiny OpenAI-shaped replica per loopback address, all on the same port; yields the port."""

    async def health(_: web.Request) -> web.Response:
        return web.json_response({})

    async def completion(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "id": "c",
                "object": "text_completion",
                "model": "m",
                "choices": [{"index": 0, "text": request.host, "finish_reason": "stop"}],
            }
        )

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", completion)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    for address in ADDRESSES:
        await web.TCPSite(runner, address, port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


async def until(check: Callable[[], bool], timeout: float = EVENT_S) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "the pool did not follow the event in time"
        await asyncio.sleep(0.01)


async def test_the_pool_follows_pods_added_readied_unreadied_and_removed(replicas: int, tmp_path: Path) -> None:
    port = replicas
    async with FakeSliceAPI() as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        pods: dict[str, tuple[str, bool]] = {"vllm-0": (ADDRESSES[0], True)}

        async def publish() -> None:
            await api.put(endpoint_slice("vllm-abc12", "vllm", dict(pods), port))

        await publish()
        config = parse_config(
            {
                "pools": {
                    "m": {
                        "discovery": {
                            "kubernetes": {
                                "service": "vllm",
                                "port_name": "http",
                                "kubeconfig": str(kubeconfig),
                                "retry_s": 0.05,
                            }
                        },
                        "routing": {"policy": "round_robin"},
                    }
                },
                "health": {"interval_s": 0.1, "timeout_s": 0.5},
                "load": {"enabled": False},
                "logging": {"level": "warning", "requests": False},
            }
        )
        app = make_app(config)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:

            def pool() -> dict[str, bool]:
                return {r.replica_id: r.is_available() for r in app[ROUTE_TABLE].route_for("m").pool}

            async def listed() -> dict[str, dict[str, Any]]:
                answer = await (await client.get("/admin/replicas")).json()
                return {r["id"]: r for r in answer["m"]["replicas"]}

            async def metrics() -> str:
                return await (await client.get("/metrics")).text()

            async def served(n: int) -> set[str]:
                seen = set()
                for i in range(n):
                    answer = await client.post(
                        "/v1/completions", json={"model": "m", "prompt": f"{i}", "max_tokens": 1}
                    )
                    assert answer.status == 200, await answer.text()
                    seen.add(answer.headers["X-Replica-Id"])
                return seen

            index = app[ROUTE_TABLE].route_for("m").router.index
            forgotten: list[str] = []
            forget = index.forget

            async def recorded_forget(replica_id: str) -> None:
                forgotten.append(replica_id)
                await forget(replica_id)

            index.forget = recorded_forget  # type: ignore[method-assign]  # which warm-prefix tables go
            assert pool() == {"vllm-0": True}  # listed before the gateway served
            assert (await client.get("/ready")).status == 200
            assert await served(3) == {"vllm-0"}
            assert (await listed())["vllm-0"]["url"] == f"http://{ADDRESSES[0]}:{port}"

            pods["vllm-1"] = (ADDRESSES[1], False)  # a pod starts: in the pool, not in rotation
            await publish()
            await until(lambda: pool() == {"vllm-0": True, "vllm-1": False})
            assert (await listed())["vllm-1"]["ready"] is False
            assert await served(4) == {"vllm-0"}

            pods["vllm-1"] = (ADDRESSES[1], True)  # ...and passes its readiness probe
            await publish()
            await until(lambda: pool() == {"vllm-0": True, "vllm-1": True})
            assert await served(4) == {"vllm-0", "vllm-1"}
            text = await metrics()
            assert 'replica="vllm-0"' in text and 'replica="vllm-1"' in text

            pods["vllm-0"] = (ADDRESSES[0], False)  # a pod turns unready (terminating, or failing its probe)
            await publish()
            await until(lambda: pool() == {"vllm-0": False, "vllm-1": True})
            assert await served(4) == {"vllm-1"}
            assert forgotten == []  # unready keeps its warm prefixes, for when it is back

            del pods["vllm-0"]  # ...and goes
            await publish()
            await until(lambda: pool() == {"vllm-1": True})
            assert set(await listed()) == {"vllm-1"} and forgotten == ["vllm-0"]  # gone: its table dropped

            await api.put(endpoint_slice("vllm-def34", "vllm", {"vllm-2": (ADDRESSES[2], True)}, port))  # 2nd slice
            await until(lambda: pool() == {"vllm-1": True, "vllm-2": True})
            assert 'replica="vllm-2"' in await metrics()

            await api.delete("vllm-def34")  # a whole slice goes
            await until(lambda: pool() == {"vllm-1": True})
            await api.delete("vllm-abc12")  # scaled to zero: not ready
            await until(lambda: pool() == {})
            assert (await client.get("/ready")).status == 503
