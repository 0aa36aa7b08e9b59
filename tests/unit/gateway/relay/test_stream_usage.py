"""Usage on every stream: the body asks for usage only when the client did not, and the usage-only
event is the one thing removed from the stream, however the reads split it."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.relay.stream_usage import UsageStripper, ask_for_usage
from gateway.view import RequestView

pytestmark = pytest.mark.timeout(10)

CONTENT = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
LAST = b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
USAGE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'
DONE = b"data: [DONE]\n\n"


def view(body: dict[str, Any], endpoint: str = "chat") -> RequestView:
    return RequestView("r", endpoint, "m", bool(body.get("stream")), body, orjson.dumps(body))


@pytest.mark.parametrize(
    ("body", "endpoint", "asked"),
    [
        ({"stream": True}, "chat", True),
        ({"stream": True, "stream_options": {"continuous_usage_stats": False}}, "completions", True),
        ({"stream": True, "stream_options": {"include_usage": True}}, "chat", False),
        ({"stream": False}, "chat", False),
        ({"stream": True}, "embeddings", False),
        ({"stream": True, "stream_options": "nonsense"}, "chat", False),  # the replica's 400 to give
    ],
)
def test_only_a_stream_without_usage_is_asked_for_it(body: dict[str, Any], endpoint: str, asked: bool) -> None:
    v = view(dict(body), endpoint)
    before = v.raw
    assert ask_for_usage(v) is asked
    if asked:
        sent = orjson.loads(v.raw)
        assert sent["stream_options"]["include_usage"] is True
        assert {k: x for k, x in sent["stream_options"].items() if k != "include_usage"} == (
            body.get("stream_options") or {}
        )
    else:
        assert v.raw == before


def stripped(chunks: list[bytes]) -> bytes:
    out: list[bytes] = []

    async def write(data: bytes) -> None:
        out.append(data)

    async def run() -> None:
        stripper = UsageStripper(write)
        for chunk in chunks:
            await stripper.write(chunk)
        await stripper.finish()

    asyncio.run(run())
    return b"".join(out)


def test_the_usage_event_goes_and_every_other_byte_stays_however_the_reads_split() -> None:
    stream = CONTENT * 3 + LAST + USAGE + DONE
    expected = CONTENT * 3 + LAST + DONE
    assert stripped([stream]) == expected
    for cut in range(1, len(stream)):  # every split into two reads
        assert stripped([stream[:cut], stream[cut:]]) == expected, cut
    assert stripped([bytes([b]) for b in stream]) == expected  # a byte at a time


def test_a_stream_framed_otherwise_passes_whole() -> None:
    crlf = CONTENT.replace(b"\n\n", b"\r\n\r\n") + USAGE.replace(b"\n\n", b"\r\n\r\n")
    assert stripped([crlf]) == crlf
    assert stripped([CONTENT, b'data: {"unfinished']) == CONTENT + b'data: {"unfinished'
