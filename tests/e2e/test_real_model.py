"""The real engine (SmolLM2-135M-Instruct on the CPU) over HTTP: answers, the prefix cache, stop
conditions, batching. One replica process per module (model loaded once, two torch threads).
Each test uses a prompt that starts with its own nonce, so no test hits another's cache blocks.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.e2e.real_replica import MODEL, RealReplica, start_real_replica

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]
BLOCK = 16
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def replica() -> Iterator[RealReplica]:
    # float32: a cached prefix then reproduces a cold prefill's greedy output token for token (in
    # bfloat16 the two differ in the last bits, different matmul shapes, and greedy can flip a near-tie).
    started = start_real_replica("real-test", "--dtype", "float32", threads=2)
    yield started
    started.stop()


def facts(n: int) -> str:
    """A long, varied, deterministic text (about 14 tokens per fact)."""
    colours = ("red", "green", "blue", "yellow", "purple", "orange")
    return " ".join(f"Fact {i}: box {i} is {colours[i % 6]} and weighs {i * 7 % 50} kilograms." for i in range(n))


def post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{url}{path}", json={"model": MODEL, **body}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def complete(url: str, prompt: str | list[int], **params: Any) -> dict[str, Any]:
    return post(url, "/v1/completions", {"prompt": prompt, "temperature": 0, **params})


def cached(answer: dict[str, Any]) -> int:
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


async def stream(client: httpx.AsyncClient, url: str, prompt: str, **params: Any) -> dict[str, Any]:
    """Stream a completion; TTFT, text, usage and each chunk's arrival time as the client saw them."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **params,
    }
    start = time.perf_counter()
    times, text, usage = [], "", None
    async with client.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                times.append(time.perf_counter() - start)
                text += choice["text"]
    return {"ttft": times[0], "times": times, "text": text, "usage": usage}


def test_greedy_answer_is_the_models_own(replica: RealReplica) -> None:
    for _ in range(2):
        answer = post(replica.url, "/v1/chat/completions", {"messages": FRANCE, "temperature": 0, "max_tokens": 24})
        assert answer["choices"][0]["message"]["content"] == "The capital of France is Paris."
        assert answer["choices"][0]["finish_reason"] == "stop"
    ids = post(replica.url, "/tokenize", {"messages": FRANCE})["tokens"]
    assert answer["usage"]["prompt_tokens"] == len(ids) and ids[0] == 1  # real SmolLM2 ids (<|im_start|> = 1)


def test_output_is_the_same_with_and_without_a_cache_hit(replica: RealReplica) -> None:
    prompt = f"{uuid.uuid4().hex}\n{facts(25)}\nList the first three boxes and their colours:"
    cold = complete(replica.url, prompt, max_tokens=40)
    warm = complete(replica.url, prompt, max_tokens=40)
    n = cold["usage"]["prompt_tokens"]
    assert cached(cold) == 0 and cached(warm) == (n - 1) // BLOCK * BLOCK
    assert warm["choices"][0]["text"] == cold["choices"][0]["text"]
    assert len(cold["choices"][0]["text"]) > 20


async def test_shared_prefix_is_reused_and_cuts_ttft(replica: RealReplica) -> None:
    prefix = f"{uuid.uuid4().hex}\n{facts(45)}\n"
    first, second = prefix + "What colour is box 3?", prefix + "How heavy is box 12?"
    ids = [post(replica.url, "/tokenize", {"prompt": p})["tokens"] for p in (first, second)]
    shared = next(i for i, (a, b) in enumerate(zip(*ids)) if a != b)
    assert shared >= 500
    async with httpx.AsyncClient() as client:
        await stream(client, replica.url, "Warm up.", max_tokens=2)
        cold = await stream(client, replica.url, first, max_tokens=8)
        warm = await stream(client, replica.url, second, max_tokens=8)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == shared // BLOCK * BLOCK
    print(f"shared {shared} tokens: TTFT cold {cold['ttft']:.3f}s, warm {warm['ttft']:.3f}s")
    assert warm["ttft"] * 3 <= cold["ttft"], (cold["ttft"], warm["ttft"])


def test_stop_strings_and_max_tokens_end_generation(replica: RealReplica) -> None:
    stopped = post(
        replica.url, "/v1/chat/completions", {"messages": FRANCE, "temperature": 0, "max_tokens": 24, "stop": ["Paris"]}
    )
    assert stopped["choices"][0]["message"]["content"] == "The capital of France is "
    assert stopped["choices"][0]["finish_reason"] == "stop"
    cut = post(replica.url, "/v1/chat/completions", {"messages": FRANCE, "temperature": 0, "max_tokens": 3})
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 3
    assert cut["choices"][0]["message"]["content"] == "The capital of"


def test_seeded_sampling_is_reproducible(replica: RealReplica) -> None:
    params = {
        "messages": [{"role": "user", "content": "Write a sentence about the sea."}],
        "max_tokens": 20,
        "temperature": 1.0,
        "top_p": 0.9,
        "seed": 1234,
    }
    texts = {post(replica.url, "/v1/chat/completions", params)["choices"][0]["message"]["content"] for _ in range(2)}
    assert len(texts) == 1 and next(iter(texts))


async def test_concurrent_streams_progress_together_and_health_answers(replica: RealReplica) -> None:
    async with httpx.AsyncClient() as client:
        long_prompt = asyncio.create_task(stream(client, replica.url, f"{uuid.uuid4().hex} {facts(130)}", max_tokens=1))
        await asyncio.sleep(0.3)  # the ~1,800-token prefill is computing now
        start = time.perf_counter()
        health = await client.get(f"{replica.url}/health", timeout=5)
        health_s = time.perf_counter() - start
        assert health.status_code == 200 and not long_prompt.done()
        assert health_s < 0.5, health_s
        await long_prompt
        a, b = await asyncio.gather(
            *(
                stream(client, replica.url, f"{uuid.uuid4().hex} Tell me a story.", max_tokens=24, ignore_eos=True)
                for _ in range(2)
            )
        )
    assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"] == 24
    # Batched: each stream got tokens while the other was still streaming.
    assert a["times"][1] < b["times"][-1] and b["times"][1] < a["times"][-1]


def test_token_ids_outside_the_vocabulary_are_rejected(replica: RealReplica) -> None:
    answer = httpx.post(f"{replica.url}/v1/completions", json={"model": MODEL, "prompt": [1, 2, 10**9]}, timeout=10)
    assert answer.status_code == 400, answer.text
    assert complete(replica.url, [1, 9690, 198], max_tokens=2)["usage"]["prompt_tokens"] == 3
