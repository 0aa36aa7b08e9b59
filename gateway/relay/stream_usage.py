"""Usage on every stream, so accounting covers every request.

A streamed chat or completions request without `stream_options.include_usage` carries no token
counts back: tenant token counters, tokens-per-minute limits and the prediction-accuracy metrics
would miss it. Such a request is sent on asking for usage, and the usage-only event this adds
(`"choices":[]` with a `usage`: vLLM's last event before `[DONE]`) is removed on the way back, so
the client gets exactly the stream it asked for while the gateway reads the counts.

Only complete events are written for such a stream, as for every relayed stream
(`gateway.relay.sse_framing`); everything but the usage event passes byte for byte. Replicas that reject
`stream_options` (not vLLM) are served with `pools.<model>.stream_usage: false`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson

from gateway.relay.sse_framing import WholeEvents
from gateway.view import RequestView


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


class UsageStripper(WholeEvents):
    """Wraps the client write of one stream: drops the usage-only event, keeps every other byte."""

    __slots__ = ()

    def __init__(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        super().__init__(write, drop_usage=True)
