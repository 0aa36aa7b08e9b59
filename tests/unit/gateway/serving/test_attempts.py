"""The attempt loop: a retried 5xx goes to another replica, is taken back from the router and charged to
its breaker once the request ends; a second 5xx makes the request poison and charges no breaker; a
decision is committed only once its slot is held."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gateway.config.loader import parse_config
from gateway.replicas import ReplicaPool
from gateway.request.decision import Decision
from gateway.routing.router import Router
from gateway.serving.app import make_app
from gateway.serving.app_keys import ROUTE_TABLE
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
        yield str(server.make_url("")).rstrip("/"), app[ROUTE_TABLE].routes["m1"].pool, fakes
    finally:
        await server.close()
        for upstream in upstreams:
            await upstream.close()


@pytest.mark.parametrize("gateway", [(500, 200)], indirect=True)
async def test_a_retried_5xx_is_taken_back_from_the_router_and_charged_once_the_request_succeeds(
    gateway: tuple[str, ReplicaPool, list[FakeReplica]], monkeypatch: pytest.MonkeyPatch
) -> None:
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
    gateway: tuple[str, ReplicaPool, list[FakeReplica]],
) -> None:
    url, pool, fakes = gateway
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 500
    assert [len(fake.seen) for fake in fakes] == [1, 1]
    assert [replica.last_error for replica in pool] == ["", ""]


async def test_a_client_that_leaves_during_routing_leaves_no_warm_prefix_and_nothing_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client leaves as the router decides and the cancel is swallowed (asyncio.wait_for drops one on
    Python 3.11: bpo-42130), so the request only notices once the decision is made. The decision was never
    committed: no replica holds a warm-prefix record of the prompt, nothing is in flight, no replica saw it."""
    fake = FakeReplica("r0")
    upstream = TestServer(fake.app)
    await upstream.start_server()
    app = make_app(
        parse_config(
            {
                "pools": {
                    "m1": {
                        "replicas": [{"url": str(upstream.make_url("")).rstrip("/"), "name": "r0"}],
                        "routing": {"policy": "prefix_affinity"},
                    }
                }
            }
        )
    )
    server = TestServer(app)
    await server.start_server()
    decide, seen = Router.decide, []

    async def decide_as_the_client_leaves(self: Router, view: RequestView, candidates: Any) -> Decision:
        decision = await decide(self, view, candidates)
        seen.append(view)
        asyncio.current_task().cancel()  # type: ignore[union-attr]  # lands with no await left to raise it
        return decision

    monkeypatch.setattr(Router, "decide", decide_as_the_client_leaves)
    try:
        async with aiohttp.ClientSession() as session:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.post(
                    server.make_url("/v1/chat/completions"),
                    json={**CHAT, "messages": [{"role": "user", "content": "hello " * 300}]},
                ):
                    pass
        route = app[ROUTE_TABLE].routes["m1"]
        (view,) = seen
        assert view.block_hashes and (await route.router.index.match(view.block_hashes, ["r0"]))["r0"] == 0
        assert route.router.in_flight.match(view.block_hashes, "r0") == 0
        assert route.pool.get("r0").in_flight == 0  # type: ignore[union-attr]
        assert not route.router._predicted and fake.seen == []
    finally:
        await server.close()
        await upstream.close()


async def _answer_over(replica_urls: list[str]) -> tuple[int, bytes, ReplicaPool]:
    replicas = [{"url": url, "name": f"r{n}"} for n, url in enumerate(replica_urls)]
    app = make_app(
        parse_config(
            {
                "pools": {"m1": {"replicas": replicas, "routing": {"policy": "round_robin"}}},
                "health": {"interval_s": 60.0},
            }
        )
    )
    server = TestServer(app)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(server.make_url("/v1/chat/completions"), json=CHAT) as resp:
                return resp.status, await resp.read(), app[ROUTE_TABLE].routes["m1"].pool
    finally:
        await server.close()


async def _serving(*fakes: FakeReplica) -> tuple[list[TestServer], list[str]]:
    servers = [TestServer(fake.app) for fake in fakes]
    for server in servers:
        await server.start_server()
    return servers, [str(s.make_url("")).rstrip("/") for s in servers]


@pytest.mark.timeout(10)
async def test_a_reset_and_a_5xx_on_two_replicas_make_the_request_poison_in_either_order() -> None:
    reset, failing = FakeReplica("r0", poison="hi"), FakeReplica("r1", status=500)
    servers, urls = await _serving(reset, failing)
    try:
        status, body, pool = await _answer_over(urls)
    finally:
        for server in servers:
            await server.close()
    assert len(reset.seen) == 1 and len(failing.seen) == 1
    assert status == 500 or (status == 502 and b"failed on two replicas" in body), (status, body)
    assert [replica.last_error for replica in pool] == ["", ""], "no breaker charged"


@pytest.mark.timeout(10)
async def test_a_refused_connect_is_the_replicas_fault_not_evidence_against_the_input() -> None:
    reset = FakeReplica("r1", poison="hi")
    servers, urls = await _serving(reset)
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        status, body, pool = await _answer_over([dead, *urls])
    finally:
        for server in servers:
            await server.close()
    assert status == 502 and b"two replicas" not in body, body
    assert all(replica.last_error for replica in pool), "both charged: no poison without two input-made failures"
