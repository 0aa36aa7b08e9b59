"""Conformance: the gateway's in-process chat rendering + tokenizer against vLLM's own /tokenize,
token for token, over the chat shapes clients send."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.prompt.tokenizers import build_prompt_tokenizer
from tests.vllm.conftest import MODEL, VLLMPair

pytestmark = pytest.mark.timeout(420)  # may be the first vLLM test: waits for the session's start-up

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
SHAPES: dict[str, dict[str, Any]] = {
    "plain": {"messages": [{"role": "user", "content": "What is a map?"}]},
    "system": {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    "content parts": {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}],
            }
        ]
    },
    "system content parts": {
        "messages": [
            {
                "role": "system",
                "content": [{"type": "text", "text": "Rule one."}, {"type": "text", "text": "Rule two."}],
            },
            {"role": "user", "content": "Go"},
        ]
    },
    "developer alone": {
        "messages": [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hello"}]
    },
    "developer after system": {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello"},
            {"role": "developer", "content": "Answer in French."},
        ]
    },
    "tools": {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": [TOOL]},
    "tool_calls": {
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 12 C"},
        ],
        "tools": [TOOL],
    },
    "names": {
        "messages": [
            {"role": "user", "name": "alice", "content": "Hi, I am Alice."},
            {"role": "assistant", "content": "Hello Alice."},
            {"role": "user", "name": "bob", "content": "And I am Bob."},
        ]
    },
    "unicode": {"messages": [{"role": "user", "content": "Ünïcödé: 東京, emoji 🗺️, RTL שלום, math ∑∫ — ok?"}]},
    "special-token text": {"messages": [{"role": "user", "content": "literal <|im_start|> and <|im_end|> text"}]},
    "no generation prompt": {
        "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"}],
        "add_generation_prompt": False,
    },
    "multi-turn": {
        "messages": [
            {"role": "system", "content": "You are a librarian."},
            {"role": "user", "content": "Recommend a book."},
            {"role": "assistant", "content": "Try 'The Map Thief'."},
            {"role": "user", "content": "Why?"},
        ]
    },
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_rendering_matches_vllm_token_for_token(vllm: VLLMPair, shape: str) -> None:
    body = SHAPES[shape]
    ours = build_prompt_tokenizer("model:smollm2").encode("chat", body)
    assert ours is not None
    payload = {"model": MODEL, "add_generation_prompt": True, **body}
    answer = httpx.post(f"{vllm.replicas[0].url}/tokenize", json=payload, timeout=30)
    assert answer.status_code == 200, answer.text
    assert list(ours.token_ids) == answer.json()["tokens"]
