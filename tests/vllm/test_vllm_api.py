"""The OpenAI API through the gateway in front of real vLLM: chat and completions, streamed and
not, vLLM's errors passed through, `/v1/models` with vLLM's `max_model_len`."""

from __future__ import annotations

import httpx
import openai
import pytest

from lab import vllm_replica
from tests.integration.gateway_procs import Gateway
from tests.vllm.conftest import MODEL

pytestmark = pytest.mark.timeout(420)  # the first test also waits for the session's vLLM start-up


def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", timeout=120, max_retries=0)


def test_chat_streamed_and_not(gateway: Gateway) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    done = client(gateway).chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert done.choices[0].message.content
    assert done.usage is not None and done.usage.prompt_tokens > 0
    chunks = list(
        client(gateway).chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == done.choices[0].message.content  # greedy, fp32: the same answer either way
    assert chunks[-1].usage is not None and chunks[-1].choices == []


def test_completions_streamed_and_not(gateway: Gateway) -> None:
    done = client(gateway).completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0
    )
    assert done.choices[0].text
    before = completion_tokens(gateway)
    chunks = list(
        client(gateway).completions.create(
            model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == done.choices[0].text
    # the gateway asked vLLM for usage (stream_usage) and dropped vLLM's usage event: none reaches the client,
    # and the gateway still counted the stream's tokens
    assert all(c.choices and c.usage is None for c in chunks)
    assert done.usage is not None and completion_tokens(gateway) - before == done.usage.completion_tokens


def completion_tokens(gw: Gateway) -> float:
    """The gateway's own count of completion tokens (every tenant, this model)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in httpx.get(f"{gw.url}/metrics", timeout=10).text.splitlines()
        if line.startswith("affinity_gateway_tokens_total{") and 'kind="completion"' in line
    )


def test_vllm_errors_pass_through(gateway: Gateway) -> None:
    too_long = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=too_long, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["message"] and error["type"] == "BadRequestError"  # vLLM's own words, not the gateway's


def test_models_carry_max_model_len(gateway: Gateway) -> None:
    models = httpx.get(f"{gateway.url}/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in models] == [MODEL]
    assert models[0]["max_model_len"] == vllm_replica.MAX_MODEL_LEN
