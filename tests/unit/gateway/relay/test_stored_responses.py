"""ResponseHomes: a follow-up is held to its response's home; the table is bounded. Usage reads
a Responses answer's id, whole and streamed, from the events it parses for usage anyway."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

from gateway.relay.shared_homes import SharedHomes
from gateway.relay.sse_usage import SSEUsageScanner
from gateway.relay.stored_responses import ResponseHomes
from gateway.replicas import Replica, ReplicaPool
from gateway.request.usage import Usage
from gateway.view import RequestView
from tests.helpers import free_port

pytestmark = pytest.mark.timeout(10)


def view(previous: str | None, endpoint: str = "responses") -> RequestView:
    body = {"model": "m", "input": "x", **({"previous_response_id": previous} if previous else {})}
    return RequestView("r", endpoint, "m", False, body, b"{}")


@dataclass
class Route:  # what ResponseHomes reads of a ModelRoute
    model: str
    pool: ReplicaPool


def test_usage_reads_the_response_id_whole_and_streamed() -> None:
    whole = Usage()
    whole.read_body(b'{"id":"resp_1","object":"response","usage":{"input_tokens":3,"output_tokens":2}}')
    assert whole.response_id == "resp_1" and whole.prompt_tokens == 3
    streamed = Usage()
    scanner = SSEUsageScanner(streamed)
    scanner.feed(
        b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_2",'
        b'"object":"response","usage":null}}\n\n'
    )
    scanner.flush()
    assert streamed.response_id is None  # not parsed: no usage in it
    scanner.feed(
        b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"resp_2",'
        b'"object":"response","usage":{"input_tokens":5,"output_tokens":1}}}\n\n'
    )
    scanner.flush()
    assert streamed.response_id == "resp_2" and streamed.completion_tokens == 1
    chat = Usage()
    chat.read_body(b'{"id":"chatcmpl-1","object":"chat.completion","usage":{"prompt_tokens":1}}')
    assert chat.response_id is None


def test_the_homes_table_keeps_the_newest() -> None:
    homes = ResponseHomes(limit=2)
    for i in range(3):
        homes.remember(f"resp_{i}", "m", f"r{i}")
    assert homes.home("resp_0") is None and homes.home("resp_2") == ("m", "r2")
    homes.remember("resp_1", "m", "r1")  # seen again: newest
    homes.remember("resp_3", "m", "r0")
    assert homes.home("resp_1") == ("m", "r1") and homes.home("resp_2") is None


def test_only_a_follow_up_of_a_known_response_is_held_to_its_home() -> None:
    homes = ResponseHomes()
    homes.remember("resp_a", "m", "r1")
    route = Route("m", ReplicaPool("m", [Replica(f"r{i}", f"http://h{i}") for i in range(3)]))
    assert homes.excluded(view("resp_a"), route, set()) == {"r0", "r2"}
    assert homes.excluded(view("resp_a"), route, {"r1"}) == {"r1"}  # its home failed: routed as usual
    assert homes.excluded(view("resp_other"), route, set()) == set()
    assert homes.excluded(view(None), route, set()) == set()
    assert homes.excluded(view("resp_a", "chat"), route, set()) == set()


async def test_shared_homes_are_written_in_the_background_and_read_by_another_gateway(redis_url: str) -> None:
    prefix = f"homes-{uuid.uuid4().hex}:"
    one, other = SharedHomes(redis_url, prefix, 30.0), SharedHomes(redis_url, prefix, 30.0)
    writer = asyncio.get_running_loop().create_task(one.run())
    try:
        one.put("resp_x", ("m", "r2"))
        for _ in range(100):
            if (found := await other.get("resp_x")) is not None:
                break
            await asyncio.sleep(0.01)
        assert found == ("m", "r2") and await other.get("resp_none") is None
        client = aioredis.from_url(redis_url)
        assert 0 < await client.ttl(f"{prefix}response:resp_x") <= 30
        await client.aclose()
    finally:
        writer.cancel()
        await one.close()
        await other.close()


async def test_an_unreachable_redis_is_degraded_and_keeps_the_writes() -> None:
    homes = SharedHomes(f"redis://127.0.0.1:{free_port()}/0", "x:", 30.0)
    homes.put("resp_x", ("m", "r0"))
    assert not await homes.flush() and homes.degraded
    assert await homes.get("resp_x") is None  # within RETRY_S: no wait at all
    assert homes._pending == {"resp_x": ("m", "r0")}
    await homes.close()


async def test_locate_counts_a_known_home_and_asks_nothing_for_other_requests() -> None:
    found: list[str] = []
    homes = ResponseHomes(counted=found.append)
    homes.remember("resp_a", "m", "r1")
    route = Route("m", ReplicaPool("m", [Replica("r1", "http://h1")]))
    await homes.locate(view("resp_a"), route, None, None, {})  # type: ignore[arg-type]  # never reached: known
    await homes.locate(view(None), route, None, None, {})  # type: ignore[arg-type]
    await homes.locate(view("resp_a", "chat"), route, None, None, {})  # type: ignore[arg-type]
    assert found == ["local"]


async def test_a_value_not_written_by_a_gateway_reads_as_absent(redis_url: str) -> None:
    prefix = f"homes-{uuid.uuid4().hex}:"
    client = aioredis.from_url(redis_url)
    await client.set(f"{prefix}response:resp_odd", b"not json")
    await client.aclose()
    homes = SharedHomes(redis_url, prefix, 30.0)
    assert await homes.get("resp_odd") is None and not homes.degraded
    await homes.close()
