"""The phrase re-chunker on its own: boundaries, bounds, the OpenAI shape kept, and the relay's timer."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
import pytest

from gateway.config.loader import parse_config
from gateway.config.pools import StreamChunkingConfig
from gateway.errors import BadRequestError, ConfigError
from gateway.relay.phrase_chunking import PhraseChunker, chunking_for, relay_phrases
from gateway.relay.upstream import Dropped, UpstreamAnswer
from gateway.relay.upstream.connection import UpstreamConnection
from gateway.view import RequestView

pytestmark = pytest.mark.timeout(30)

PHRASE = StreamChunkingConfig(mode="phrase")


def sse(payload: Any) -> bytes:
    return b"data: " + (payload if isinstance(payload, bytes) else orjson.dumps(payload)) + b"\n\n"


def chat(text: str | None, index: int = 0, role: str | None = None, finish: str | None = None, **more: Any) -> bytes:
    delta: dict[str, Any] = {"role": role} if role else {}
    if text is not None:
        delta["content"] = text
    return sse(
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}],
            **more,
        }
    )


def completion(text: str, finish: str | None = None) -> bytes:
    return sse(
        {
            "id": "c1",
            "object": "text_completion",
            "model": "m",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        }
    )


def events(out: bytes) -> list[Any]:
    """Each event's data, JSON where it is JSON."""
    assert out == b"" or out.endswith(b"\n\n")
    found = []
    for raw in out.split(b"\n\n")[:-1]:
        assert raw.startswith(b"data: "), raw
        data = raw[6:]
        found.append(data.decode() if data == b"[DONE]" else orjson.loads(data))
    return found


def texts(out: bytes, index: int = 0) -> list[str]:
    """The text of each event of choice `index` that carries text."""
    found = []
    for event in events(out):
        for choice in event["choices"] if isinstance(event, dict) and event.get("choices") else ():
            text = choice["delta"].get("content") if "delta" in choice else choice["text"]
            if choice["index"] == index and text:
                found.append(text)
    return found


def run(chunker: PhraseChunker, *chunks: bytes, now: float = 0.0) -> bytes:
    return b"".join(chunker.feed(chunk, now) for chunk in chunks)


def test_text_is_merged_up_to_the_last_boundary() -> None:
    chunker = PhraseChunker(PHRASE)
    out = run(chunker, chat("Hel"), chat("lo, wor"), chat("ld. And"), chat(" then"))
    assert texts(out) == ["Hello,", " world."]
    assert texts(chunker.finish()) == [" And then"]


def test_several_boundaries_in_one_delta_go_out_together_and_newline_is_one() -> None:
    chunker = PhraseChunker(PHRASE)
    assert texts(run(chunker, chat("a; b: c! d? e"), chat("\nf"))) == ["a; b: c! d?", " e\n"]


def test_boundaries_are_configurable() -> None:
    chunker = PhraseChunker(StreamChunkingConfig(mode="phrase", boundaries="|"))
    assert texts(run(chunker, chat("one, two"), chat(" | three."))) == ["one, two |"]


def test_max_chars_bounds_a_phrase_without_boundary() -> None:
    chunker = PhraseChunker(StreamChunkingConfig(mode="phrase", max_chars=10))
    out = run(chunker, chat("abcdefgh"), chat("ijklmnopqrstuvwxy"), chat("z, end"))
    assert texts(out) == ["abcdefghij", "klmnopqrst", "uvwxyz,"]
    assert texts(chunker.flush()) == [" end"]


def test_a_boundary_past_max_chars_does_not_stretch_the_bound() -> None:
    chunker = PhraseChunker(StreamChunkingConfig(mode="phrase", max_chars=5))
    assert texts(run(chunker, chat("ab, cdefghij."))) == ["ab,", " cdef", "ghij."]


def test_max_wait_sends_pending_text_at_its_deadline() -> None:
    chunker = PhraseChunker(StreamChunkingConfig(mode="phrase", max_wait_ms=300))
    assert chunker.deadline is None
    assert run(chunker, chat("no boundary"), now=10.0) == b""
    assert chunker.feed(chat(" yet"), 10.2) == b""
    assert chunker.deadline == pytest.approx(10.3)  # counted from the oldest pending piece
    assert chunker.due(10.29) == b""
    assert texts(chunker.due(10.3)) == ["no boundary yet"]
    assert chunker.deadline is None


def test_the_role_goes_first_and_its_text_is_merged() -> None:
    chunker = PhraseChunker(PHRASE)
    out = run(chunker, chat("Hi", role="assistant"), chat(" there."))
    first, second = events(out)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert second["choices"][0]["delta"] == {"content": "Hi there."}
    assert chunker.phrases == 1


def test_a_role_event_without_text_passes_as_it_is() -> None:
    chunker = PhraseChunker(PHRASE)
    (event,) = events(run(chunker, chat("", role="assistant")))
    assert event["choices"][0]["delta"] == {"role": "assistant", "content": ""} and chunker.phrases == 0


def test_finish_reason_stays_on_its_event_and_takes_the_pending_text() -> None:
    chunker = PhraseChunker(PHRASE)
    out = run(chunker, chat("The end"), chat(" is near", finish="length", stop_reason=None))
    (event,) = events(out)
    choice = event["choices"][0]
    assert choice["delta"]["content"] == "The end is near" and choice["finish_reason"] == "length"


def test_an_empty_final_delta_carries_the_pending_text() -> None:
    chunker = PhraseChunker(PHRASE)
    (event,) = events(run(chunker, chat("tail"), chat(None, finish="stop")))
    assert event["choices"][0] == {"index": 0, "delta": {"content": "tail"}, "logprobs": None, "finish_reason": "stop"}


def test_usage_chunks_and_done_pass_in_order_after_a_flush() -> None:
    chunker = PhraseChunker(PHRASE)
    usage = {"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
    out = run(chunker, chat("a", usage=None), chat("b", usage=None), sse(usage), b"data: [DONE]\n\n")
    merged, passed, done = events(out)
    assert merged["choices"][0]["delta"]["content"] == "ab" and merged["usage"] is None
    assert passed == usage and done == "[DONE]"


def test_continuous_usage_keeps_the_latest_counts() -> None:
    chunker = PhraseChunker(PHRASE)
    out = run(chunker, chat("a", usage={"completion_tokens": 1}), chat("b.", usage={"completion_tokens": 2}))
    (event,) = events(out)
    assert event["usage"] == {"completion_tokens": 2} and event["choices"][0]["delta"]["content"] == "ab."


def test_choices_are_merged_each_on_its_own() -> None:
    chunker = PhraseChunker(PHRASE)
    out = run(chunker, chat("zero", 0), chat("one", 1), chat(" 0.", 0), chat(" 1", 1), chat(" more.", 1))
    assert texts(out, 0) == ["zero 0."] and texts(out, 1) == ["one 1 more."]
    two = sse(
        {"id": "c1", "choices": [{"index": 0, "delta": {"content": "x"}}, {"index": 1, "delta": {"content": "y,"}}]}
    )
    out = run(chunker, two) + chunker.flush()
    assert [e["choices"] for e in events(out)] == [
        [{"index": 1, "delta": {"content": "y,"}}],
        [{"index": 0, "delta": {"content": "x"}}],
    ]


def test_utf8_split_across_chunks_is_reassembled() -> None:
    chunker = PhraseChunker(PHRASE)
    wire = chat("Grüße, ") + chat("日本語。") + chat("🙂!")
    out = run(chunker, *(wire[i : i + 1] for i in range(len(wire))))
    assert texts(out) == ["Grüße,", " 日本語。🙂!"]


def test_error_events_pass_after_a_flush() -> None:
    chunker = PhraseChunker(PHRASE)
    error = sse({"error": {"message": "boom", "type": "InternalServerError", "code": 500}})
    out = run(chunker, chat("half a"), error, b"data: [DONE]\n\n")
    assert events(out) == [orjson.loads(chat("half a")[6:]), orjson.loads(error[6:]), "[DONE]"]


def test_tool_calls_and_logprobs_flush_and_pass_unchanged() -> None:
    chunker = PhraseChunker(PHRASE)
    tool = sse(
        {
            "id": "c1",
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{"}}]},
                    "finish_reason": None,
                }
            ],
        }
    )
    logprobs = sse({"id": "c1", "choices": [{"index": 0, "text": "x", "logprobs": {"tokens": ["x"]}}]})
    out = run(chunker, chat("thinking"), tool, logprobs)
    assert out == chat("thinking") + tool + logprobs


def test_completions_text_is_merged() -> None:
    chunker = PhraseChunker(PHRASE)
    out = run(chunker, completion("Once"), completion(" upon"), completion(" a time,"), completion(" the", "stop"))
    first, last = events(out)
    assert first["choices"][0]["text"] == "Once upon a time," and first["object"] == "text_completion"
    assert last["choices"][0] == {"index": 0, "text": " the", "logprobs": None, "finish_reason": "stop"}


def test_comments_pass_without_flushing_and_empty_deltas_are_dropped() -> None:
    chunker = PhraseChunker(PHRASE)
    out = run(chunker, chat("a"), b": keep-alive\n\n", chat(""), chat("b."))
    assert out.startswith(b": keep-alive\n\n") and texts(out.removeprefix(b": keep-alive\n\n")) == ["ab."]


def test_events_with_other_fields_flush_and_pass_unchanged() -> None:
    chunker = PhraseChunker(PHRASE)
    named = b'event: note\ndata: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'
    assert run(chunker, chat("first"), named) == chat("first") + named


def test_an_oversized_event_ending_across_chunks_is_found() -> None:
    chunker = PhraseChunker(PHRASE)
    huge = b"data: " + b"x" * ((1 << 20) + 10)
    out = run(chunker, huge, b"x\n", b"\n" + chat("ok."))
    assert out.startswith(huge + b"x\n\n") and texts(out.removeprefix(huge + b"x\n\n")) == ["ok."]


def test_an_oversized_event_is_relayed_raw_and_parsing_resumes_after_it() -> None:
    chunker = PhraseChunker(PHRASE)
    huge = b"data: " + b"x" * ((1 << 20) + 10)
    out = run(chunker, chat("before"), huge)
    assert out == chat("before") + huge and not chunker.framed
    out = run(chunker, b"yz\n\n" + chat("af"), chat("ter."))
    assert out.startswith(b"yz\n\n") and texts(out.removeprefix(b"yz\n\n")) == ["after."] and chunker.framed


def test_finish_sends_pending_text_then_an_unfinished_event() -> None:
    chunker = PhraseChunker(PHRASE)
    assert run(chunker, chat("left"), b'data: {"cut') == b""
    out = chunker.finish()
    assert out.endswith(b'\n\ndata: {"cut') and texts(out.rsplit(b"data: {", 1)[0]) == ["left"]


@pytest.mark.parametrize("seed", range(5))
def test_random_cuts_keep_the_text_and_end_phrases_at_a_boundary_or_the_bound(seed: int) -> None:
    rng = random.Random(seed)
    words = "the quick, brown fox; jumps over: the lazy dog. Really? Yes!\nAgain".split(" ")
    pieces = [rng.choice(words) + rng.choice(("", " ")) for _ in range(200)]
    wire = chat("", role="assistant") + b"".join(chat(p) for p in pieces) + chat("", finish="stop")
    cuts = sorted(rng.sample(range(1, len(wire)), 40))
    config = StreamChunkingConfig(mode="phrase", max_chars=rng.randint(5, 40))
    chunker = PhraseChunker(config)
    out = run(chunker, *(wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)]))) + chunker.finish()
    found = texts(out)
    assert "".join(found) == "".join(pieces)
    assert all(t[-1] in config.boundaries or len(t) == config.max_chars for t in found[:-1])
    assert all(len(t) <= config.max_chars for t in found[:-1])


def _view(stream: bool = True, endpoint: str = "chat") -> RequestView:
    return RequestView("r", endpoint, "m", stream, {}, b"{}")


def test_the_header_opts_in_or_out_over_the_pool() -> None:
    pool = StreamChunkingConfig(mode="phrase", max_chars=7)
    assert chunking_for(_view(), None, StreamChunkingConfig()) is None
    assert chunking_for(_view(), None, pool) == pool
    phrase = StreamChunkingConfig(mode="phrase", max_chars=9)
    assert chunking_for(_view(), " Phrase ", StreamChunkingConfig(max_chars=9)) == phrase
    assert chunking_for(_view(), "none", pool) is None
    assert chunking_for(_view(stream=False), "phrase", pool) is None
    assert chunking_for(_view(endpoint="embeddings"), "phrase", pool) is None
    with pytest.raises(BadRequestError) as err:
        chunking_for(_view(stream=False), "words", pool)
    assert err.value.status == 400 and err.value.param == "X-Stream-Chunking"


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ({"mode": "words"}, "pools.m.stream_chunking.mode"),
        ({"boundaries": ""}, "pools.m.stream_chunking.boundaries"),
        ({"max_wait_ms": 0}, "pools.m.stream_chunking.max_wait_ms"),
        ({"max_chars": 0}, "pools.m.stream_chunking.max_chars"),
        ({"max_chars": "many"}, "pools.m.stream_chunking.max_chars"),
        ({"phrases": True}, "pools.m.stream_chunking.phrases"),
    ],
)
def test_pool_settings_are_validated_at_load(setting: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"pools": {"m": {"replicas": [{"url": "http://h:1"}], "stream_chunking": setting}}})
    assert err.value.key == key


def test_pool_settings_load() -> None:
    config = parse_config(
        {
            "pools": {
                "m": {
                    "replicas": [{"url": "http://h:1"}],
                    "stream_chunking": {"mode": "phrase", "boundaries": ".\n", "max_wait_ms": 120, "max_chars": 80},
                }
            }
        }
    )
    assert config.pools["m"].stream_chunking == StreamChunkingConfig(
        mode="phrase", boundaries=".\n", max_wait_ms=120.0, max_chars=80
    )


def _answer() -> UpstreamAnswer:
    """An upstream answer its test feeds by hand (the connection it would come on is never opened)."""
    connection = UpstreamConnection(lambda _: None, lambda _: None)
    return UpstreamAnswer(connection, 200, "OK", [(b"Content-Type", b"text/event-stream")])


async def _relay(
    reader: UpstreamAnswer,
    chunker: PhraseChunker,
    written: list[tuple[float, bytes]],
    seen: list[bytes],
    first: list[float],
) -> None:
    loop = asyncio.get_running_loop()

    async def on_seen(chunk: bytes) -> None:
        seen.append(chunk)

    async def write(out: bytes) -> None:
        written.append((loop.time(), out))

    await relay_phrases(reader, chunker, on_seen, write, lambda: first.append(loop.time()))


async def test_the_relay_sends_pending_text_at_max_wait_while_upstream_is_silent() -> None:
    loop = asyncio.get_running_loop()
    reader = _answer()
    written: list[tuple[float, bytes]] = []
    seen: list[bytes] = []
    first: list[float] = []
    task = asyncio.create_task(
        _relay(reader, PhraseChunker(StreamChunkingConfig(mode="phrase", max_wait_ms=100)), written, seen, first)
    )
    start = loop.time()
    reader.feed(chat("no boundary"))
    await asyncio.sleep(0.3)  # nothing more comes: the timer, not a new chunk, sends the text
    assert [texts(out) for _, out in written] == [["no boundary"]]
    assert 0.09 <= written[0][0] - start < 0.25 and first[0] == pytest.approx(written[0][0], abs=0.01)
    reader.feed(chat("rest.") + b"data: [DONE]\n\n")
    reader.end()
    await asyncio.wait_for(task, 5)
    assert texts(b"".join(out for _, out in written)) == ["no boundary", "rest."]
    assert written[-1][1].endswith(b"data: [DONE]\n\n")
    assert b"".join(seen) == chat("no boundary") + chat("rest.") + b"data: [DONE]\n\n"  # upstream bytes, as they came


async def test_the_relay_flushes_pending_text_before_an_upstream_error() -> None:
    reader = _answer()
    written: list[tuple[float, bytes]] = []
    task = asyncio.create_task(_relay(reader, PhraseChunker(PHRASE), written, [], []))
    reader.feed(chat("cut off"))
    await asyncio.sleep(0.05)
    reader.fail(Dropped("broken"))
    with pytest.raises(Dropped):
        await asyncio.wait_for(task, 5)
    assert [texts(out) for _, out in written] == [["cut off"]]


async def test_the_relay_keeps_max_wait_while_upstream_never_pauses() -> None:
    reader = _answer()
    written: list[tuple[float, bytes]] = []
    task = asyncio.create_task(
        _relay(reader, PhraseChunker(StreamChunkingConfig(mode="phrase", max_wait_ms=100)), written, [], [])
    )
    for _ in range(25):  # a piece every 20 ms, never a boundary: only the deadline sends text
        reader.feed(chat("ab"))
        await asyncio.sleep(0.02)
    reader.end()
    await asyncio.wait_for(task, 5)
    phrases = [text for _, out in written for text in texts(out)]
    assert "".join(phrases) == "ab" * 25 and 3 <= len(phrases) <= 8
