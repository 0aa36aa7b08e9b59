from __future__ import annotations

import orjson
import pytest

from gateway.errors import BadRequestError, NotFoundError, json_object
from replica_stub.protocol import ResponseFormatter, check_model, parse_chat, parse_completion

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def test_chat_request_defaults() -> None:
    gen = parse_chat(CHAT)
    assert gen.messages == CHAT["messages"] and gen.prompt_text is None
    assert (gen.max_tokens, gen.temperature, gen.stream, gen.include_usage, gen.stop) == (None, 1.0, False, False, ())


def test_max_completion_tokens_wins_and_stop_accepts_a_string() -> None:
    gen = parse_chat(
        {
            **CHAT,
            "max_tokens": 5,
            "max_completion_tokens": 7,
            "stop": "END",
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    assert (gen.max_tokens, gen.stop, gen.include_usage) == (7, ("END",), True)


def test_completion_prompt_forms() -> None:
    assert parse_completion({"prompt": "abc"}).max_tokens == 16  # vLLM's completions default
    assert parse_completion({"prompt": [1, 2, 3]}).prompt_token_ids == [1, 2, 3]
    assert parse_completion({"prompt": ["only one"]}).prompt_text == "only one"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"messages": []},
        {"messages": [{"content": "no role"}]},
        {"messages": [{"role": "user", "content": 5}]},
        {**CHAT, "n": 2},
        {**CHAT, "temperature": -1},
        {**CHAT, "temperature": "hot"},
        {**CHAT, "top_p": 0},
        {**CHAT, "max_tokens": 0},
        {**CHAT, "max_tokens": True},
        {**CHAT, "stop": [1]},
        {**CHAT, "seed": 1.5},
        {**CHAT, "stream": "yes"},
    ],
    ids=[
        "missing",
        "empty",
        "no-role",
        "content-type",
        "n",
        "negative-temp",
        "temp-type",
        "top-p",
        "zero-max",
        "bool-max",
        "stop-type",
        "seed-type",
        "stream-type",
    ],
)
def test_invalid_chat_requests_are_400(body: dict) -> None:
    with pytest.raises(BadRequestError):
        parse_chat(body)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"prompt": 3},
        {"prompt": ["a", "b"]},
        {"prompt": []},
        {"prompt": [1, "x"]},
        {"prompt": [-1]},
        {"prompt": [1 << 64]},
    ],
)
def test_invalid_completion_requests_are_400(body: dict) -> None:
    with pytest.raises(BadRequestError):
        parse_completion(body)


def test_body_and_model_checks() -> None:
    with pytest.raises(BadRequestError):
        json_object(b"[]")
    with pytest.raises(NotFoundError):
        check_model({"model": "other"}, "served")
    check_model({}, "served")  # model is optional, as in vLLM


def test_chunks_and_full_bodies_have_vllm_shapes() -> None:
    fmt = ResponseFormatter("chat", "m", "rid")
    first = orjson.loads(fmt.chunk("", first=True)[6:])
    assert first["id"] == "chatcmpl-rid" and first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "usage" not in first  # vLLM leaves unset fields out
    usage_chunk = orjson.loads(fmt.usage_chunk({"prompt_tokens": 1})[6:])
    assert usage_chunk["choices"] == [] and usage_chunk["object"] == "chat.completion.chunk"
    full = ResponseFormatter("completion", "m").full("txt", "stop", "END", {})
    assert full["object"] == "text_completion" and full["choices"][0]["text"] == "txt"


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_fast_content_chunk_is_byte_identical(kind: str) -> None:
    fmt = ResponseFormatter(kind, 'm"odel', "rid")  # type: ignore[arg-type]
    for text in ("word ", "", 'quote " and \\ and \n and \u00e9'):
        assert fmt.content_chunk(text) == fmt.chunk(text)
