"""WholeEvents: only complete events reach the client, so a break can always be followed by an error
event, and `framed` says when it cannot (framing it does not follow)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.relay.sse_framing import WholeEvents

pytestmark = pytest.mark.timeout(10)
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'


def written(chunks: list[bytes], *, finish: bool) -> tuple[bytes, bool]:
    out: list[bytes] = []

    async def write(data: bytes) -> None:
        out.append(data)

    async def run() -> bool:
        events = WholeEvents(write)
        for chunk in chunks:
            await events.write(chunk)
        if finish:
            await events.finish()
        else:
            events.cut()
        return events.framed

    framed = asyncio.run(run())
    return b"".join(out), framed


def test_a_half_event_waits_and_a_break_drops_it() -> None:
    for cut in range(1, len(EVENT)):
        assert written([EVENT, EVENT[:cut]], finish=False) == (EVENT, True), cut
        assert written([EVENT, EVENT[:cut], EVENT[cut:]], finish=True) == (EVENT * 2, True), cut


def test_a_stream_ending_mid_event_keeps_its_tail_on_a_clean_end() -> None:
    assert written([EVENT, b"data: {"], finish=True) == (EVENT + b"data: {", True)


def test_an_oversized_event_passes_raw_and_is_not_framed_until_it_ends() -> None:
    huge = b"data: " + b"x" * (1 << 20)
    assert written([EVENT, huge], finish=False) == (EVENT + huge, False)
    assert written([EVENT, huge, b"\n\n"], finish=False)[1] is True
    crlf = EVENT.replace(b"\n\n", b"\r\n\r\n")
    assert written([crlf, b"data: {"], finish=False) == (crlf + b"data: {", False)
