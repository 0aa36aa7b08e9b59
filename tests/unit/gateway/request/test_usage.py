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


@pytest.mark.parametrize(
    "framing",
    [
        b'data: {"choices": [{"text": "Hel"}]}\n\ndata:{"choices": [{"text": "lo"}]}\n\n',  # no space after data:
        b'data:  {"choices": [{"text": "Hel"}]}  \n\ndata: {"choices": [{"text": "lo"}]}\n\n',  # extra blanks
        b': a comment\n\ndata: {"choices": [{"text": "Hel"}]}\n\nevent: x\ndata: {"choices": [{"text": "lo"}]}\n\n',
        b'data: {"choices": [{"text": "Hel"}]}\nid: 1\n\ndata: {"choices": [{"text": "lo"}]}\n\n',  # other fields
    ],
)
def test_answer_text_from_events_not_framed_as_vllm_frames_them(framing: bytes) -> None:
    """vLLM's one-line events are split in one pass; every other framing is still read, event by event."""
    usage = Usage(answer=[])
    scanner = SSEUsageScanner(usage)
    scanner.feed(framing + b'data: {"choices": [], "usage": {"prompt_tokens": 3}}\n\ndata: [DONE]\n\n')
    scanner.flush()
    assert "".join(usage.answer or []) == "Hello" and usage.prompt_tokens == 3


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


def anthropic_sse(*events: dict[str, object]) -> bytes:
    return b"".join(b"event: " + str(e["type"]).encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events)


def test_answer_text_of_anthropic_messages_whole_and_streamed() -> None:
    whole = Usage(answer=[])
    whole.read_body(
        orjson.dumps(
            {
                "type": "message",
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Hel"},
                    {"type": "tool_use", "id": "t"},
                    {"type": "text", "text": "lo"},
                ],
                "usage": {"input_tokens": 40, "output_tokens": 5},
            }
        )
    )
    assert whole.answer == ["Hello"] and whole.prompt_tokens == 40
    stream = anthropic_sse(
        {"type": "message_start", "message": {"type": "message", "content": [], "usage": {"input_tokens": 40}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{}"}},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}},
        {"type": "message_stop"},
    )
    streamed = Usage(answer=[])
    scanner = SSEUsageScanner(streamed)
    for i in range(0, len(stream), 13):
        scanner.feed(stream[i : i + 13])
    scanner.flush()
    assert "".join(streamed.answer or []) == "Hello"
    assert (streamed.prompt_tokens, streamed.completion_tokens) == (40, 5)


def test_answer_text_of_the_responses_api_whole_and_streamed_once() -> None:
    response = {
        "id": "resp_1",
        "object": "response",
        "output": [
            {"type": "reasoning", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
        ],
        "usage": {"input_tokens": 40, "output_tokens": 5},
    }
    whole = Usage(answer=[])
    whole.read_body(orjson.dumps(response))
    assert whole.answer == ["Hello"] and whole.response_id == "resp_1"
    stream = anthropic_sse(
        {"type": "response.created", "response": {**response, "output": []}},
        {"type": "response.output_text.delta", "output_index": 1, "content_index": 0, "delta": "Hel"},
        {"type": "response.output_text.delta", "output_index": 1, "content_index": 0, "delta": "lo"},
        {"type": "response.completed", "response": response},  # repeats the whole answer: not read twice
    )
    streamed = Usage(answer=[])
    scanner = SSEUsageScanner(streamed)
    scanner.feed(stream)
    scanner.flush()
    assert "".join(streamed.answer or []) == "Hello" and streamed.response_id == "resp_1"
    assert streamed.completion_tokens == 5
