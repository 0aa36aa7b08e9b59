"""The hop's fake replica: four events in one write for a short stream, and one write per token, apart in time,
for a longer one (the `tokens` mode), so a router relays what an engine would send it."""

from __future__ import annotations

import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bench.hop.fake_replica import SSE_CHUNKS, build_app

pytestmark = pytest.mark.timeout(20)


async def reads(tokens: int) -> tuple[list[bytes], float]:
    """The stream's pieces as the client read them, and how long the stream took."""
    app: web.Application = build_app("bench-model", token_gap_s=0.01)
    async with TestClient(TestServer(app)) as client:
        started = time.perf_counter()
        response = await client.post("/v1/completions", json={"model": "m", "stream": True, "max_tokens": tokens})
        pieces = [piece async for piece in response.content.iter_any()]
        return pieces, time.perf_counter() - started


async def test_a_short_stream_comes_in_one_write_and_a_long_one_token_by_token() -> None:
    short, _ = await reads(SSE_CHUNKS)
    assert len(short) == 1 and short[0].count(b"data: ") == SSE_CHUNKS + 1  # the events and [DONE]
    long, took = await reads(12)
    data = b"".join(long)
    assert data.count(b"data: {") == 12 and data.endswith(b"data: [DONE]\n\n")
    assert len(long) >= 12 and took >= 11 * 0.01  # one read per event: each came 10 ms after the one before
