"""Usage read from whole bodies and from SSE chunks split anywhere."""

from __future__ import annotations

import orjson
import pytest

from gateway.usage import SSEUsageScanner, Usage

USAGE = {"prompt_tokens": 40, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 32}}


def sse(*events: object) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def test_body_usage() -> None:
    usage = Usage()
    usage.read_body(orjson.dumps({"choices": [], "usage": USAGE}))
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (40, 5, 32)
    blank = Usage()
    blank.read_body(b"not json with \"usage\"")
    assert blank == Usage()


@pytest.mark.parametrize("split", [1, 7, 50, 10_000])
def test_stream_usage_found_across_any_split(split: int) -> None:
    stream = sse({"choices": [{"delta": {"content": "x"}}], "usage": None}, {"choices": [], "usage": USAGE})
    usage = Usage()
    scanner = SSEUsageScanner(usage)
    for i in range(0, len(stream), split):
        scanner.feed(stream[i:i + split])
    assert (usage.prompt_tokens, usage.cached_tokens) == (40, 32)


def test_stream_without_usage_leaves_none() -> None:
    usage = Usage()
    SSEUsageScanner(usage).feed(sse({"choices": [], "usage": None}))
    assert usage.prompt_tokens is None


@pytest.mark.parametrize("split", [1, 9, 10_000])
def test_answer_text_collected_from_stream_only_when_asked(split: int) -> None:
    stream = sse({"choices": [{"delta": {"role": "assistant"}}]}, {"choices": [{"delta": {"content": "Hel"}}]},
                 {"choices": [{"delta": {"content": "lo"}}], "usage": None}, {"choices": [], "usage": USAGE})
    asked, not_asked = Usage(answer=[]), Usage()
    for usage in (asked, not_asked):
        scanner = SSEUsageScanner(usage)
        for i in range(0, len(stream), split):
            scanner.feed(stream[i:i + split])
    assert "".join(asked.answer or []) == "Hello" and asked.cached_tokens == 32
    assert not_asked.answer is None and not_asked.cached_tokens == 32


def test_answer_text_from_whole_bodies() -> None:
    chat, completion = Usage(answer=[]), Usage(answer=[])
    chat.read_body(orjson.dumps({"choices": [{"message": {"content": "Paris."}}], "usage": USAGE}))
    completion.read_body(orjson.dumps({"choices": [{"text": " upon a time"}]}))
    assert chat.answer == ["Paris."] and completion.answer == [" upon a time"]
