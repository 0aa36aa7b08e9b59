"""The gateway's mirror of real vLLM's prefix cache: what /admin/route/explain predicts is what vLLM
then reports as `cached_tokens`, over a conversation, under eviction and after a cache reset; the
feeds stay certain with zero decode errors; a client's cancel reaches vLLM."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.integration.gateway_procs import Gateway
from tests.integration.reliability_tools import eventually
from tests.vllm.conftest import MODEL, VLLMPair, chat_turn, feed

pytestmark = pytest.mark.timeout(420)  # may be the first vLLM test: waits for the session's start-up
QUESTIONS = ("Which shelf holds box 3?", "And box 7?", "Which boxes are red?", "Summarise in one line.")


def system_prompt(words: int = 90) -> str:
    """Fresh per conversation (the id leads), several 128-token blocks long."""
    rules = " ".join(f"Box {i} is {('red', 'blue', 'green')[i % 3]} on shelf {i % 5}." for i in range(words // 6))
    return f"Session {uuid.uuid4().hex}. You are a warehouse assistant; answer briefly. {rules}"


def settled(gw: Gateway, replica: str) -> None:
    """The replica's events for the last request arrived (no speculative entry left)."""
    eventually(lambda: feed(gw, replica)["speculative"] == 0, timeout_s=20, interval_s=0.1)


def converse(gw: Gateway, messages: list[dict[str, Any]], questions: tuple[str, ...]) -> list[Any]:
    turns = []
    for question in questions:
        messages.append({"role": "user", "content": question})
        turn, text = chat_turn(gw, messages)
        turns.append(turn)
        messages.append({"role": "assistant", "content": text})
        settled(gw, turn.replica)
    return turns


def test_predicted_equals_reported_over_a_conversation(gateway: Gateway) -> None:
    turns = converse(gateway, [{"role": "system", "content": system_prompt()}], QUESTIONS)
    assert [t.predicted for t in turns] == [t.reported for t in turns], turns
    assert all(t.reported > 0 for t in turns[1:]), (turns, gateway.replicas(MODEL))  # it stayed with its cache


def direct(pair: VLLMPair, replica: str, content: str, max_tokens: int = 1) -> None:
    """A request straight to vLLM, past the gateway: only the events tell the gateway about it."""
    url = next(r.url for r in pair.replicas if f"vllm-{r.index}" == replica)
    answer = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=120,
        json={"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens},
    )
    assert answer.status_code == 200, answer.text


def test_predicted_equals_reported_under_eviction(vllm: VLLMPair, gateway: Gateway) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt()}]
    first = converse(gateway, messages, QUESTIONS[:2])
    home = first[-1].replica
    for n in range(4):  # ~7,000 tokens of other prompts on a 6,144-token cache
        direct(vllm, home, " ".join(f"filler{n} word{i}" for i in range(300)))
    settled(gateway, home)
    eventually(lambda: feed(gateway, home)["blocks"] <= 48, timeout_s=10)
    later = converse(gateway, messages, QUESTIONS[2:])
    assert [t.predicted for t in later] == [t.reported for t in later], later


def test_predicted_equals_reported_after_a_prefix_cache_reset(vllm: VLLMPair, gateway: Gateway) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt()}]
    home = converse(gateway, messages, QUESTIONS[:2])[-1].replica
    url = next(r.url for r in vllm.replicas if f"vllm-{r.index}" == home)
    assert httpx.post(f"{url}/reset_prefix_cache", timeout=30).status_code == 200
    direct(vllm, home, "ping")  # AllBlocksCleared goes out with the next engine step
    eventually(lambda: feed(gateway, home)["blocks"] == 0, timeout_s=20)
    later = converse(gateway, messages, QUESTIONS[2:])
    assert later[0].reported == 0 or later[0].replica != home, later
    assert [t.predicted for t in later] == [t.reported for t in later], later


def test_feeds_are_certain_with_zero_decode_errors(gateway: Gateway) -> None:
    converse(gateway, [{"role": "system", "content": system_prompt()}], QUESTIONS[:1])  # at least one batch
    for replica in ("vllm-0", "vllm-1"):
        state = feed(gateway, replica)
        assert state["certain"] and state["decode_errors"] == 0, state
    assert sum(feed(gateway, r)["batches"] for r in ("vllm-0", "vllm-1")) > 0


def test_a_client_cancel_reaches_vllm(vllm: VLLMPair, gateway: Gateway) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 3000,
        "min_tokens": 3000,
        "ignore_eos": True,
        "temperature": 0,  # ~3 min of decoding:
        "stream": True,
    }  # min_tokens also holds back the model's other stop tokens (ignore_eos: only EOS)
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", f"{gateway.url}/v1/chat/completions", json=body) as answer,
    ):
        assert answer.status_code == 200
        index = int(answer.headers["X-Replica-Id"].rsplit("-", 1)[1])
        lines = answer.iter_lines()
        seen = [next(lines) for _ in range(12)]  # several tokens: the request is decoding
        assert all("error" not in line for line in seen), seen
        eventually(lambda: vllm.metric(index, "vllm:num_requests_running") >= 1, timeout_s=60, interval_s=0.2)
    # The client is gone: the gateway must abort the vLLM request (generous: a busy 2-core machine).
    eventually(lambda: vllm.metric(index, "vllm:num_requests_running") == 0, timeout_s=90, interval_s=0.2)
