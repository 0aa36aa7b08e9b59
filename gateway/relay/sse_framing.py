"""Whole SSE events to the client, so a stream broken mid-way can always end with an error event.

A replica that breaks mid-event would leave half an event at the client, after which no error event
can be framed: the client would read a stream that stops, or one that ends cleanly without `[DONE]`.
So a relayed stream writes only complete events: an event split across two reads waits for its end
(microseconds; vLLM writes whole events, which take the one-check fast path), and on a break the
unfinished event is dropped and the error event follows (`gateway.relay.proxy`).

Where the framing cannot be followed (CRLF framing, or an event over 1 MiB: it is passed on as it
comes), `framed` says whether what went out ends on an event boundary; when it does not, the proxy
closes the connection without the chunked terminator, so the client sees a broken answer rather
than a complete one (as nginx and Envoy do).

The same writer drops the usage-only event the gateway asked for on the client's behalf
(`gateway.relay.stream_usage`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

_MAX_TAIL_BYTES = 1 << 20  # an unfinished event longer than this is passed on as it is
_BOUNDARIES = (b"\n\n", b"\r\n\r\n")


class WholeEvents:
    """Wraps the client write of one stream: complete events go out, an unfinished one waits for its end."""

    __slots__ = ("_write", "_drop_usage", "_tail", "_raw", "_at_boundary")

    def __init__(self, write: Callable[[bytes], Awaitable[None]], *, drop_usage: bool = False) -> None:
        self._write = write
        self._drop_usage = drop_usage
        self._tail = b""
        self._raw = False  # framing it cannot follow: pass everything on
        self._at_boundary = True  # in raw mode: whether the last byte out ended an event

    @property
    def framed(self) -> bool:
        """Whether everything written so far ends on an event boundary (an error event can follow)."""
        return not self._raw or self._at_boundary

    async def write(self, chunk: bytes) -> None:
        if self._raw:
            self._at_boundary = chunk.endswith(_BOUNDARIES)
            await self._write(chunk)
            return
        if not self._tail and chunk.endswith(b"\n\n") and not (self._drop_usage and b'"choices":[]' in chunk):
            await self._write(chunk)  # whole events, no usage-only one to drop among them
            return
        data = self._tail + chunk if self._tail else chunk
        end = data.rfind(b"\n\n") + 2
        if end >= 2:
            self._tail, complete = data[end:], data[:end]
            if self._drop_usage and b'"choices":[]' in complete:
                complete = b"".join(e + b"\n\n" for e in complete[:-2].split(b"\n\n") if not _usage_only(e))
        elif len(data) <= _MAX_TAIL_BYTES and b"\r\n\r\n" not in data:
            self._tail = data
            return
        else:  # an oversized event, or CRLF framing: the rest of the stream passes as it is
            self._raw, self._tail, complete = True, b"", data
            self._at_boundary = data.endswith(_BOUNDARIES)
        if complete:
            await self._write(complete)

    def cut(self) -> None:
        """The upstream broke: the unfinished event never goes out."""
        self._tail = b""

    async def finish(self) -> None:
        """What is left of a stream that did not end on an event boundary."""
        if self._tail:
            tail, self._tail = self._tail, b""
            await self._write(tail)


def _usage_only(event: bytes) -> bool:
    return event.startswith(b"data:") and b'"choices":[]' in event and b'"usage":{' in event
