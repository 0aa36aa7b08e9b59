"""The attempt loop: a retried 5xx goes to another replica, is taken back from the router and charged to
its breaker once the request ends; a second 5xx makes the request poison and charges no breaker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gateway.config.loader import parse_config
from gateway.replicas import ReplicaPool
from gateway.routing.router import Router
from gateway.serving.app import make_app
from gateway.serving.app_keys import STATE
from gateway.view import RequestView
from tests.upstream import FakeReplica

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def gateway(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, ReplicaPool, list[FakeReplica]]]:
    fakes = [FakeReplica(f"r{n}", status=status) for n, status in enumerate(request.param)]
    upstreams = [TestServer(fake.app) for fake in fakes]
    for upstream in upstreams:
        await upstream.start_server()
    replicas = [{"url": str(u.make_url("")).rstrip("/"), "name": f.replica_id} for f, u in zip(fakes, upstreams)]
    app = make_app(parse_config({"pools": {"m1": {"replicas": replicas, "routing": {"policy": "round_robin"}}}}))
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/"), app[STATE].routes["m1"].pool, fakes
    finally:
        await server.close()
        for upstream in upstreams:
            await upstream.close()


@pytest.mark.parametrize("gateway", [(500, 200)], indirect=True)
async def test_a_retried_5xx_is_taken_back_from_the_router_and_charged_once_the_request_succeeds(
        gateway: tuple[str, ReplicaPool, list[FakeReplica]], monkeypatch: pytest.MonkeyPatch) -> None:
    url, pool, fakes = gateway
    failed: list[str] = []
    taken_back = Router.failed

    def recording(self: Router, view: RequestView, replica_id: str) -> None:
        failed.append(replica_id)
        taken_back(self, view, replica_id)

    monkeypatch.setattr(Router, "failed", recording)
    async with aiohttp.ClientSession() as session:
        for _ in range(2):  # round robin: one of the two starts on r0
            async with session.post(url + "/v1/chat/completions", json=CHAT) as resp:
                assert resp.status == 200
    assert failed == ["r0"] and len(fakes[0].seen) == 1 and len(fakes[1].seen) == 2
    assert pool.get("r0").last_error == "replica r0 answered 500"  # type: ignore[union-attr]
    assert pool.get("r1").last_error == ""  # type: ignore[union-attr]


@pytest.mark.parametrize("gateway", [(500, 500)], indirect=True)
async def test_a_second_5xx_answers_the_client_and_charges_no_breaker(
        gateway: tuple[str, ReplicaPool, list[FakeReplica]]) -> None:
    url, pool, fakes = gateway
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 500
    assert [len(fake.seen) for fake in fakes] == [1, 1]
    assert [replica.last_error for replica in pool] == ["", ""]
