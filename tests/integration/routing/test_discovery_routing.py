"""DNS discovery end to end: real replica stubs on 127.0.0.2-4 (one port, as pods behind a headless
Service), a gateway whose resolver the test controls; replicas appear and disappear and routing follows."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.config.loader import parse_config
from gateway.replicas.discovery.dns import NameNotFound
from gateway.serving.app import ROUTE_TABLE, make_app
from tests.helpers import Proc, free_port, python_module, wait_http

NAME = "replica.affinity.svc.cluster.local"
ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


EVENTS_PORT, REPLAY_PORT = free_port(), free_port()  # every stub publishes KV events on these, at its address


@pytest.fixture(scope="module")
def stubs() -> Iterator[int]:
    """One replica stub per loopback address, all on the same port; yields the port."""
    port = free_port()
    procs = [
        Proc(
            python_module(
                "replica_stub",
                "--host",
                address,
                "--port",
                str(port),
                "--engine",
                "sim",
                "--speedup",
                "50",
                "--replica-id",
                f"{address}:{port}",
                "--log-level",
                "warning",
                "--kv-events-endpoint",
                f"tcp://{address}:{EVENTS_PORT}",
                "--kv-events-replay-endpoint",
                f"tcp://{address}:{REPLAY_PORT}",
            )
        )
        for address in ADDRESSES
    ]
    try:
        for address, proc in zip(ADDRESSES, procs):
            wait_http(f"http://{address}:{port}/health", proc)
        yield port
    finally:
        for proc in procs:
            proc.stop()


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_routing_follows_the_records(stubs: int) -> None:
    port = stubs
    records: dict[str, list[str]] = {NAME: list(ADDRESSES[:2])}

    async def resolve(name: str, _port: int) -> list[str]:
        if name not in records:
            raise NameNotFound(name)
        return records[name]

    config = parse_config(
        {
            "pools": {
                "stub-model": {
                    "discovery": {"dns": NAME, "port": port, "interval_s": 0.05},
                    "routing": {"policy": "round_robin"},
                }
            },
            "health": {"interval_s": 0.1, "timeout_s": 0.5},
            "load": {"interval_s": 0.1},
            "logging": {"level": "warning", "requests": False},
        }
    )
    app = make_app(config)
    app[ROUTE_TABLE].resolver = resolve
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:

        async def served(n: int) -> Counter[str]:
            seen: Counter[str] = Counter()
            for i in range(n):
                answer = await client.post(
                    "/v1/completions", json={"model": "stub-model", "prompt": f"request {i}", "max_tokens": 2}
                )
                assert answer.status == 200, await answer.text()
                seen[answer.headers["X-Replica-Id"].split(":")[0]] += 1
            return seen

        def pool() -> set[str]:
            return {r.url for r in app[ROUTE_TABLE].route_for("stub-model").pool}

        assert (await client.get("/ready")).status == 200  # resolved before the gateway served
        assert set(await served(6)) == {"127.0.0.2", "127.0.0.3"}

        records[NAME].append("127.0.0.4")  # scale up
        await until(lambda: len(pool()) == 3)
        assert set(await served(9)) == set(ADDRESSES)

        records[NAME].remove("127.0.0.2")  # a pod goes away
        await until(lambda: len(pool()) == 2)
        assert set(await served(8)) == {"127.0.0.3", "127.0.0.4"}
        listed = (await (await client.get("/admin/replicas")).json())["stub-model"]["replicas"]
        assert sorted(r["id"] for r in listed) == [f"127.0.0.3:{port}", f"127.0.0.4:{port}"]

        del records[NAME]  # scaled to zero: not ready, requests get 503
        await until(lambda: not pool())
        assert (await client.get("/ready")).status == 503
        answer = await client.post("/v1/completions", json={"model": "stub-model", "prompt": "x", "max_tokens": 2})
        assert answer.status == 503

        records[NAME] = ["127.0.0.2"]  # and back
        await until(lambda: len(pool()) == 1)
        assert (await client.get("/ready")).status == 200
        assert set(await served(3)) == {"127.0.0.2"}


async def test_discovered_replicas_get_their_kv_event_feeds(stubs: int) -> None:
    port = stubs
    records: dict[str, list[str]] = {NAME: list(ADDRESSES[:2])}

    async def resolve(name: str, _port: int) -> list[str]:
        return records[name]

    config = parse_config(
        {
            "pools": {
                "stub-model": {
                    "discovery": {
                        "dns": NAME,
                        "port": port,
                        "interval_s": 0.05,
                        "kv_events_port": EVENTS_PORT,
                        "kv_events_replay_port": REPLAY_PORT,
                    },
                    "routing": {"policy": "prefix_affinity", "prefix": {"tokenizer": "sim"}},
                }
            },
            "health": {"interval_s": 0.1, "timeout_s": 0.5},
            "logging": {"level": "warning", "requests": False},
        }
    )
    app = make_app(config)
    app[ROUTE_TABLE].resolver = resolve
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:

        async def feeds() -> dict[str, bool]:
            listed = (await (await client.get("/admin/replicas")).json())["stub-model"]["replicas"]
            return {r["id"].split(":")[0]: r["kv_events"]["certain"] for r in listed if "kv_events" in r}

        deadline = asyncio.get_running_loop().time() + 5
        while await feeds() != {"127.0.0.2": True, "127.0.0.3": True}:
            assert asyncio.get_running_loop().time() < deadline, await feeds()
            await asyncio.sleep(0.05)
        records[NAME] = ["127.0.0.3"]  # a pod goes away: so does its feed
        await until(lambda: [model for model, *_ in app[ROUTE_TABLE].kv_feeds.all()] == ["stub-model"])
        assert await feeds() == {"127.0.0.3": True}
