"""Proxy lifecycles: client disconnect before the first byte and mid-stream; in-flight counts exact."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from gateway.config.loader import parse_config
from gateway.replicas import Replica
from gateway.request.decision import Decision
from gateway.routing.router import Router
from gateway.serving.app import ROUTE_TABLE, make_app
from tests.upstream import FakeReplica, until

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


async def _serve(fake: FakeReplica) -> AsyncIterator[tuple[str, Replica]]:
    upstream = TestServer(fake.app, handler_cancellation=True)
    await upstream.start_server()
    config = parse_config(
        {"pools": {"m1": {"replicas": [{"url": str(upstream.make_url("")).rstrip("/"), "name": "r0"}]}}}
    )
    app = make_app(config)
    gateway = TestServer(app, handler_cancellation=True)
    await gateway.start_server()
    replica = app[ROUTE_TABLE].routes["m1"].pool.get("r0")
    assert replica is not None
    try:
        yield str(gateway.make_url("")).rstrip("/"), replica
    finally:
        await gateway.close()
        await upstream.close()


@pytest.fixture
def fake() -> FakeReplica:
    return FakeReplica("r0")


@pytest.fixture
async def served(fake: FakeReplica) -> AsyncIterator[tuple[str, Replica]]:
    async for item in _serve(fake):
        yield item


async def test_disconnect_while_waiting_for_first_byte_cancels_upstream(
    fake: FakeReplica, served: tuple[str, Replica]
) -> None:
    fake.stall_s = 30
    url, replica = served
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(session.post(url + "/v1/chat/completions", json=CHAT))
        await until(lambda: fake.active == 1 and replica.in_flight == 1)
        task.cancel()
        await until(lambda: fake.cancelled == 1 and replica.in_flight == 0)


async def test_disconnect_mid_stream_cancels_upstream(fake: FakeReplica, served: tuple[str, Replica]) -> None:
    fake.hold, fake.chunks = threading.Event(), 5
    url, replica = served
    async with aiohttp.ClientSession() as session:
        resp = await session.post(url + "/v1/chat/completions", json={**CHAT, "stream": True})
        first = await resp.content.readuntil(b"\n\n")
        assert first.startswith(b"data: ")
        assert replica.in_flight == 1
        resp.close()
    await until(lambda: fake.cancelled == 1 and replica.in_flight == 0)
    fake.hold.set()


@pytest.mark.parametrize("chunk_pad", [2000, 65536], ids=["small-chunks", "chunks-over-high-water"])
async def test_client_that_stops_reading_is_dropped_and_upstream_closed(chunk_pad: int) -> None:
    fake = FakeReplica("r0", chunks=20_000, chunk_pad=chunk_pad)
    upstream = TestServer(fake.app, handler_cancellation=True)
    await upstream.start_server()
    config = parse_config(
        {
            "pools": {"m1": {"replicas": [{"url": str(upstream.make_url("")).rstrip("/"), "name": "r0"}]}},
            "limits": {"client_write_timeout_s": 0.3},
        }
    )
    app = make_app(config)
    gateway = TestServer(app, handler_cancellation=True)
    await gateway.start_server()
    replica = app[ROUTE_TABLE].routes["m1"].pool.get("r0")
    assert replica is not None
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window fills fast
    try:
        sock.connect(("127.0.0.1", gateway.port))
        body = orjson.dumps({**CHAT, "stream": True})
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        await until(lambda: fake.active == 1)
        await until(lambda: fake.active == 0 and replica.in_flight == 0, timeout_s=10)  # never read a byte
    finally:
        sock.close()
        await gateway.close()
        await upstream.close()


async def test_a_client_gone_while_a_library_dropped_its_cancel_is_not_forwarded(
    fake: FakeReplica, served: tuple[str, Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py's socket writes run in Python 3.11's wait_for, which can drop the cancel of a client
    that disconnected as a lookup completed (bpo-42130): routing then returns as if nothing happened.
    The request must still stop before any replica sees it."""
    url, replica = served
    decide, entered = Router.decide, asyncio.Event()

    async def decide_dropping_a_cancel(self: Router, *args: Any) -> Decision:
        entered.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)
        return await decide(self, *args)

    monkeypatch.setattr(Router, "decide", decide_dropping_a_cancel)
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(session.post(url + "/v1/chat/completions", json=CHAT))
        await entered.wait()
        task.cancel()
        await asyncio.sleep(0.2)
    assert fake.seen == [] and replica.in_flight == 0
