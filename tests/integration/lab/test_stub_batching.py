"""`replica-stub --batching`: head-of-line blocking seen by clients of a real stub process.

A long streamed request starts; once its first token is back, a short one is sent. Under static
batching the short request's first token comes after the long request's last one; under
continuous batching the short request is done while the long one still streams. Only the order
of events is asserted. A slow prefill step (`--prefill-base-ms`) puts a wide gap between the two
events compared, so a client that reads late does not swap them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from replica_stub.scheduler import Batching
from tests.helpers import Proc, free_port, python_module, wait_http

MODEL = "stub-model"
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def stubs() -> Iterator[list[Proc]]:
    procs: list[Proc] = []
    yield procs
    for proc in procs:
        proc.stop()


def start_stub(procs: list[Proc], batching: Batching) -> str:
    port = free_port()
    proc = Proc(
        python_module(
            "replica_stub",
            "--port",
            str(port),
            "--model",
            MODEL,
            "--engine",
            "sim",
            "--speedup",
            "10",
            "--prefill-base-ms",
            "500",
            "--batching",
            batching,
            "--log-level",
            "warning",
        )
    )
    procs.append(proc)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", proc)
    return url


async def stream_token_times(
    client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int, first: asyncio.Event | None = None
) -> list[float]:
    """When each token chunk of a streamed completion arrived; sets `first` at the first one."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    times = []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"text":""' not in line.replace(" ", ""):
                times.append(time.monotonic())
                if first is not None:
                    first.set()
    assert len(times) == max_tokens
    return times


async def long_then_short(url: str) -> tuple[list[float], list[float]]:
    """Token arrival times of a 200-token request and of a 2-token one sent after its first token."""
    async with httpx.AsyncClient(timeout=30) as client:
        started = asyncio.Event()
        long = asyncio.create_task(stream_token_times(client, url, "a long story please", 200, started))
        await asyncio.wait_for(started.wait(), 20)
        short = await stream_token_times(client, url, "one word", 2)
        return await long, short


async def test_static_batching_holds_a_short_request_behind_a_long_one(stubs: list[Proc]) -> None:
    long, short = await long_then_short(start_stub(stubs, "static"))
    assert short[0] > long[-1]


async def test_continuous_batching_lets_a_short_request_finish_while_a_long_one_streams(stubs: list[Proc]) -> None:
    long, short = await long_then_short(start_stub(stubs, "continuous"))
    assert short[-1] < long[-1]
