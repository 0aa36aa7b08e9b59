"""The gateway over real processes, as clients see it: OpenAI SDK, model list, spreading, errors."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.integration.gateway_procs import MODEL, Gateway, pool, running, start_gateway, start_stub

OTHER = "other-model"
MESSAGES = [{"role": "user", "content": "Say hello"}]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running() as track:
        stubs = [track(start_stub(f"replica-{i}")) for i in range(3)] + [track(start_stub("other-0", OTHER))]
        pools = {MODEL: pool(*((s.replica_id, s.url) for s in stubs[:3])), OTHER: pool(("other-0", stubs[3].url))}
        yield track(start_gateway(tmp_path_factory.mktemp("api"), pools))


@pytest.fixture
def client(cluster: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0)


def test_openai_sync_chat_and_completion(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5)  # type: ignore[arg-type]
    assert chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens == 5
    completion = client.completions.create(model=OTHER, prompt="Once upon a time", max_tokens=4)
    assert completion.choices[0].text and completion.model == OTHER


def test_openai_sync_stream(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(  # type: ignore[call-overload]
        model=MODEL, messages=MESSAGES, max_tokens=6, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


async def test_openai_async_stream_and_not(cluster: Gateway) -> None:
    client = openai.AsyncOpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0)
    plain, stream = await asyncio.gather(
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3),  # type: ignore[arg-type]
        client.completions.create(model=MODEL, prompt="abc", max_tokens=5, stream=True),
    )
    assert plain.choices[0].message.content
    texts = [chunk.choices[0].text async for chunk in stream if chunk.choices]
    assert len("".join(texts)) > 0
    await client.close()


def test_models_lists_the_union_of_pools(client: openai.OpenAI) -> None:
    assert sorted(m.id for m in client.models.list()) == sorted([MODEL, OTHER])


def test_round_robin_spreads_evenly(cluster: Gateway) -> None:
    with httpx.Client(base_url=cluster.url, timeout=10) as http:
        seen = Counter(
            http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1}).headers["X-Replica-Id"]
            for _ in range(30)
        )
    assert seen == {"replica-0": 10, "replica-1": 10, "replica-2": 10}


def test_error_statuses_and_shapes(cluster: Gateway, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="missing", messages=MESSAGES)  # type: ignore[arg-type]
    assert info.value.status_code == 404
    with httpx.Client(base_url=cluster.url, timeout=10) as http:
        bad = http.post("/v1/chat/completions", content=b"{oops", headers={"Content-Type": "application/json"})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "BadRequestError"
        ready = http.get("/ready").json()
        assert ready["ready"] and ready["available_replicas"] == {MODEL: 3, OTHER: 1} and ready["degraded"] == {}
        metrics = http.get("/metrics").text
    assert 'affinity_gateway_replica_healthy{model_name="stub-model",replica="replica-0"} 1.0' in metrics
