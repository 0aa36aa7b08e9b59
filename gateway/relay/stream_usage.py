"""Usage on every stream, so accounting covers every request.

A streamed chat or completions request without `stream_options.include_usage` carries no token
counts back: tenant token counters, tokens-per-minute limits and the prediction-accuracy metrics
would miss it. Such a request is sent on asking for usage, and the usage-only event this adds
(`"choices":[]` with a `usage`: vLLM's last event before `[DONE]`) is removed on the way back, so
the client gets exactly the stream it asked for while the gateway reads the counts.

Only complete events are written for such a stream: an event split across two reads waits for its
end (microseconds); everything but the usage event passes byte for byte (a stream framed some other
way than vLLM's `\n\n`, or an event over 1 MiB, passes whole from there on). Replicas that reject
`stream_options` (not vLLM) are served with `pools.<model>.stream_usage: false`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson

from gateway.view import RequestView

_MAX_TAIL_BYTES = 1 << 20  # an unfinished event longer than this is passed on as it is


def ask_for_usage(view: RequestView) -> bool:
    """Add `include_usage` to a stream that lacks it (one re-encode); True if the body changed."""
    if not view.stream or view.endpoint not in ("chat", "completions"):
        return False
    options = view.body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        return False
    if options is not None and not isinstance(options, dict):
        return False  # malformed: the replica answers it in its own words
    view.body["stream_options"] = {**(options or {}), "include_usage": True}
    view.raw = orjson.dumps(view.body)
    return True


class UsageStripper:
    """Wraps the client write of one stream: drops the usage-only event, keeps every other byte."""

    def __init__(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        self._write = write
        self._tail = b""
        self._raw = False  # framing it cannot follow: pass everything on

    async def write(self, chunk: bytes) -> None:
        if self._raw or (not self._tail and chunk.endswith(b"\n\n") and b'"choices":[]' not in chunk):
            await self._write(chunk)  # whole events, no usage-only one among them (or framing it cannot follow)
            return
        data = self._tail + chunk if self._tail else chunk
        end = data.rfind(b"\n\n") + 2
        if end >= 2:
            self._tail, complete = data[end:], data[:end]
            if b'"choices":[]' in complete:
                complete = b"".join(e + b"\n\n" for e in complete[:-2].split(b"\n\n") if not _usage_only(e))
        elif len(data) <= _MAX_TAIL_BYTES and b"\r\n\r\n" not in data:
            self._tail = data
            return
        else:  # an oversized event, or CRLF framing: the rest of the stream passes as it is
            self._raw, self._tail, complete = True, b"", data
        if complete:
            await self._write(complete)

    async def finish(self) -> None:
        """What is left of a stream that did not end on an event boundary."""
        if self._tail:
            tail, self._tail = self._tail, b""
            await self._write(tail)


def _usage_only(event: bytes) -> bool:
    return event.startswith(b"data:") and b'"choices":[]' in event and b'"usage":{' in event
