"""Usage read from whole bodies and from SSE chunks split anywhere."""

from __future__ import annotations

import orjson
import pytest

from gateway.relay.sse_usage import SSEUsageScanner
from gateway.request.usage import Usage

USAGE = {"prompt_tokens": 40, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 32}}


def sse(*events: object) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def test_body_usage() -> None:
    usage = Usage()
    usage.read_body(orjson.dumps({"choices": [], "usage": USAGE}))
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (40, 5, 32)
    blank = Usage()
    blank.read_body(b'not json with "usage"')
    assert blank == Usage()


@pytest.mark.parametrize("split", [1, 7, 50, 10_000])
def test_stream_usage_found_across_any_split(split: int) -> None:
    stream = sse({"choices": [{"delta": {"content": "x"}}], "usage": None}, {"choices": [], "usage": USAGE})
    usage = Usage()
    scanner = SSEUsageScanner(usage)
    for i in range(0, len(stream), split):
        scanner.feed(stream[i : i + split])
    scanner.flush()
    assert (usage.prompt_tokens, usage.cached_tokens) == (40, 32)


def test_stream_without_usage_leaves_none() -> None:
    usage = Usage()
    scanner = SSEUsageScanner(usage)
    scanner.feed(sse({"choices": [], "usage": None}))
    scanner.flush()
    assert usage.prompt_tokens is None


@pytest.mark.parametrize("split", [1, 9, 10_000])
def test_answer_text_collected_from_stream_only_when_asked(split: int) -> None:
    stream = sse(
        {"choices": [{"delta": {"role": "assistant"}}]},
        {"choices": [{"delta": {"content": "Hel"}}]},
        {"choices": [{"delta": {"content": "lo"}}], "usage": None},
        {"choices": [], "usage": USAGE},
    )
    asked, not_asked = Usage(answer=[]), Usage()
    for usage in (asked, not_asked):
        scanner = SSEUsageScanner(usage)
        for i in range(0, len(stream), split):
            scanner.feed(stream[i : i + split])
        scanner.flush()
    assert "".join(asked.answer or []) == "Hello" and asked.cached_tokens == 32
    assert not_asked.answer is None and not_asked.cached_tokens == 32


def test_answer_text_from_whole_bodies() -> None:
    chat, completion = Usage(answer=[]), Usage(answer=[])
    chat.read_body(orjson.dumps({"choices": [{"message": {"content": "Paris."}}], "usage": USAGE}))
    completion.read_body(orjson.dumps({"choices": [{"text": " upon a time"}]}))
    assert chat.answer == ["Paris."] and completion.answer == [" upon a time"]


def test_one_broken_event_costs_only_itself() -> None:
    """The events of a batch are parsed together; one that is not JSON is skipped, the others still count."""
    stream = (
        sse({"choices": [{"delta": {"content": "Hel"}}]})
        + b'data: {"choices": [broken\n\n'
        + sse({"choices": [{"delta": {"content": "lo"}}]}, {"choices": [], "usage": USAGE})
    )
    usage = Usage(answer=[])
    scanner = SSEUsageScanner(usage)
    scanner.feed(stream)
    scanner.flush()
    assert "".join(usage.answer or []) == "Hello" and usage.prompt_tokens == 40


@pytest.mark.parametrize("collect", [True, False])
def test_a_long_stream_is_read_in_batches_to_the_same_counts(collect: bool) -> None:
    words = [{"choices": [{"delta": {"content": f"w{i} "}}], "usage": None} for i in range(5000)]
    stream = sse(*words, {"choices": [], "usage": USAGE})
    usage = Usage(answer=[] if collect else None)
    scanner = SSEUsageScanner(usage)
    for i in range(0, len(stream), 333):
        scanner.feed(stream[i : i + 333])
    scanner.flush()
    assert (usage.prompt_tokens, usage.cached_tokens) == (40, 32)
    assert "".join(usage.answer or []) == ("".join(f"w{i} " for i in range(5000)) if collect else "")


def test_negative_counts_read_as_not_reported() -> None:
    usage = Usage()
    usage.update({"prompt_tokens": -5, "completion_tokens": -1, "prompt_tokens_details": {"cached_tokens": -9}})
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (None, None, None)


def test_counts_clamped_to_the_context_and_the_choices() -> None:
    from gateway.request.usage import MAX_TOKENS

    usage = Usage()
    usage.update({"prompt_tokens": 10**15, "completion_tokens": 10**15})
    assert usage.prompt_tokens == usage.completion_tokens == MAX_TOKENS, "no model card: the documented cap"
    usage = Usage()
    usage.bound(4096, {"n": 3})
    usage.update({"prompt_tokens": 5000, "completion_tokens": 10**15, "input_tokens_details": {"cached_tokens": 9999}})
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (4096, 3 * 4096, 4096)
    usage.bound(True, {"n": 10**9})  # not a length, absurd n: the cap, and at most 128 choices
    assert (usage.ceiling, usage.choices) == (MAX_TOKENS, 128)
