"""Phrase-chunked streams for voice agents: a text-to-speech engine reads whole phrases better than tokens.

Opt in per request (`X-Stream-Chunking: phrase|none`, which wins) or per pool (`stream_chunking`). The
SSE stream of a chat or completions answer is re-chunked: the text deltas of each choice are merged
until a phrase boundary, `max_chars` or `max_wait_ms`, then sent as one event in the OpenAI shape. The
role delta comes first, `finish_reason` stays on the event that carries it, and everything that is not
plain text (tool calls, logprobs, usage chunks, errors, `[DONE]`) flushes the pending text and passes
through unchanged. Only one unfinished event and each choice's pending text are held, never the stream.
Requests that did not opt in never come here: their relay stays byte for byte (`gateway.relay.proxy`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.config.pools import StreamChunkingConfig
from gateway.errors import BadRequestError
from gateway.relay.headers import STREAM_CHUNKING as HEADER
from gateway.relay.upstream import UpstreamAnswer, UpstreamFailure
from gateway.view import RequestView

_MAX_EVENT_BYTES = 1 << 20  # an unfinished event longer than this is relayed raw up to the next event's start
# Values a choice or delta may carry without carrying anything merging could lose.
_UNSET: tuple[object, ...] = (None, [], {})
_CHOICE_KEYS = frozenset(("index", "delta", "text", "finish_reason", "stop_reason"))


def chunking_for(view: RequestView, header: str | None, pool: StreamChunkingConfig) -> StreamChunkingConfig | None:
    """The chunking a request gets: None unless it streams chat or completions and opted in. A header
    value other than phrase or none is the client's mistake, answered 400 whatever the request."""
    if header is not None:
        value = header.strip().lower()
        if value not in ("phrase", "none"):
            raise BadRequestError(f"{HEADER} must be phrase or none, got {header[:40]!r}", param=HEADER)
        if value == "none":
            return None
        pool = pool.phrased
    if pool.mode != "phrase" or not view.stream or view.endpoint not in ("chat", "completions"):
        return None
    return pool


@dataclass(slots=True)
class _Pending:
    event: dict[str, Any]  # the latest merged event of this choice: its id, model, usage, choice fields
    text: str
    since: float  # when the oldest pending piece came


class PhraseChunker:
    """Upstream SSE bytes in, re-chunked SSE bytes out; time comes from the caller (loop time)."""

    def __init__(self, config: StreamChunkingConfig) -> None:
        self._boundaries = tuple(config.boundaries)
        self._wait_s, self._max_chars = config.max_wait_ms / 1000, config.max_chars
        self._pending: dict[int, _Pending] = {}  # by choice index, in arrival order
        self._tail = b""  # the unfinished last event
        self._skipping = False  # inside an oversized event: raw bytes until the next event starts
        self.phrases = 0  # events sent that carry text

    @property
    def framed(self) -> bool:
        """Whether what was sent so far ends at an event boundary (so an error event can follow)."""
        return not self._skipping

    @property
    def deadline(self) -> float | None:
        """When the oldest pending text must go out, boundary or not."""
        return min(p.since for p in self._pending.values()) + self._wait_s if self._pending else None

    def feed(self, chunk: bytes, now: float) -> bytes:
        data, out = self._tail + chunk, b""
        if self._skipping:
            end = data.find(b"\n\n")
            if end < 0:
                self._tail = data[-1:]  # the next chunk may start with the end of "\n\n"
                return data[:-1]
            self._skipping, out, data = False, data[: end + 2], data[end + 2 :]
        *events, self._tail = data.split(b"\n\n")
        for raw in events:
            out += self._event(raw, now)
        if len(self._tail) > _MAX_EVENT_BYTES:
            out += self.flush() + self._tail
            self._tail, self._skipping = b"", True
        return out

    def due(self, now: float) -> bytes:
        """The pending text of every choice whose wait is over."""
        return b"".join(self._send(i) for i, p in list(self._pending.items()) if p.since + self._wait_s <= now)

    def flush(self) -> bytes:
        return b"".join(self._send(i) for i in list(self._pending))

    def finish(self) -> bytes:
        """End of the upstream stream: everything pending, then an unfinished last event as it came."""
        out, self._tail = self.flush() + self._tail, b""
        return out

    def _event(self, raw: bytes, now: float) -> bytes:
        raw = raw.lstrip(b"\n")  # a blank line too many between events frames nothing
        if not raw:
            return b""
        if all(line.startswith(b":") for line in raw.split(b"\n")):
            return raw + b"\n\n"  # a comment (a keep-alive): nothing to keep in order with the text
        event = _json(raw[5:]) if raw.startswith(b"data:") and b"\n" not in raw else None
        choices = event.get("choices") if isinstance(event, dict) else None
        if not isinstance(choices, list) or not choices:  # usage, errors, [DONE], other fields than data
            return self.flush() + raw + b"\n\n"
        texts = [text for choice in choices if (text := _text_of(choice)) is not None]
        if len(texts) != len(choices):  # tool calls, logprobs, ...
            return self.flush() + raw + b"\n\n"
        assert isinstance(event, dict)
        return b"".join(
            self._merge({**event, "choices": [choice]}, choice, text, now) for choice, text in zip(choices, texts)
        )

    def _merge(self, event: dict[str, Any], choice: dict[str, Any], text: str, now: float) -> bytes:
        """One choice's plain-text delta: the role goes out at once, a finish_reason takes the pending
        text along, other text waits for a boundary, the length bound or the deadline."""
        index, out = choice["index"], b""
        delta = choice.get("delta")
        if isinstance(delta, dict) and delta.get("role") is not None:
            out = self._send(index)
            if not text or choice.get("finish_reason") is not None:
                self.phrases += bool(text)
                return out + _encode(event)
            out += _encode(_with_text(event, choice, ""))  # the role first, its text merged like any other
            choice = {**choice, "delta": {k: v for k, v in delta.items() if k != "role"}}
            event = {**event, "choices": [choice]}
        pending = self._pending.get(index)
        if choice.get("finish_reason") is not None:
            if pending is not None:
                del self._pending[index]
                event = _with_text(event, choice, pending.text + text)
            self.phrases += bool(text or pending)
            return out + _encode(event)
        if not text:
            if pending is not None:
                pending.event = event  # keep its latest fields (continuous usage), drop the empty delta
            return out
        if pending is None:
            pending = self._pending[index] = _Pending(event, text, now)
        else:
            pending.event, pending.text = event, pending.text + text
        return out + self._ready(index, pending, now)

    def _ready(self, index: int, pending: _Pending, now: float) -> bytes:
        """Send each phrase the pending text holds: up to its last boundary within max_chars, or max_chars."""
        out = b""
        while pending.text:
            window = pending.text[: self._max_chars]
            cut = max(map(window.rfind, self._boundaries)) + 1
            if not cut and len(pending.text) < self._max_chars:
                break
            cut = cut or self._max_chars
            out += self._phrase(pending, pending.text[:cut])
            pending.text, pending.since = pending.text[cut:], now  # the rest came with the latest delta
        if not pending.text:
            del self._pending[index]
        return out

    def _send(self, index: int) -> bytes:
        pending = self._pending.pop(index, None)
        return self._phrase(pending, pending.text) if pending is not None else b""

    def _phrase(self, pending: _Pending, text: str) -> bytes:
        self.phrases += 1
        event = pending.event
        return _encode(_with_text(event, event["choices"][0], text))


def _json(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None  # [DONE] and anything else not JSON


def _text_of(choice: Any) -> str | None:
    """A choice's text when it is a plain text delta (chat `delta.content`, completions `text`) with
    nothing else in it that merging would lose; None otherwise."""
    if not isinstance(choice, dict) or not isinstance(choice.get("index"), int):
        return None
    if any(value not in _UNSET for key, value in choice.items() if key not in _CHOICE_KEYS):
        return None
    delta = choice.get("delta")
    if delta is None:
        text = choice.get("text")
    elif not isinstance(delta, dict) or any(
        value not in _UNSET for key, value in delta.items() if key not in ("content", "role")
    ):
        return None
    else:
        text = delta.get("content") or ""
    return text if isinstance(text, str) else None


def _with_text(event: dict[str, Any], choice: dict[str, Any], text: str) -> dict[str, Any]:
    if isinstance(choice.get("delta"), dict):
        choice = {**choice, "delta": {**choice["delta"], "content": text}}
    else:
        choice = {**choice, "text": text}
    return {**event, "choices": [choice]}


def _encode(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


async def relay_phrases(
    source: UpstreamAnswer,
    chunker: PhraseChunker,
    seen: Callable[[bytes], Awaitable[None]],
    write: Callable[[bytes], Awaitable[None]],
    first_phrase: Callable[[], None],
) -> None:
    """Read upstream chunks (each handed to `seen` first: watch, first byte, usage scan) and write the
    re-chunked events. The read waits only until the pending text's deadline, so text goes out on time
    while the replica is silent; a read cut by that deadline consumes nothing (`read_any` takes
    bytes only once it is resumed)."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            deadline = chunker.deadline
            try:
                async with asyncio.timeout_at(deadline) as timer:
                    chunk = await source.read_any()
            except TimeoutError:
                if not timer.expired():
                    raise
                out = chunker.due(deadline or loop.time())
            else:
                if not chunk:
                    break
                await seen(chunk)
                now = loop.time()
                out = chunker.feed(chunk, now) + chunker.due(now)  # due too: a replica that never pauses
            if out:
                await _write_phrases(write, out, chunker, first_phrase)
        await _write_phrases(write, chunker.finish(), chunker, first_phrase)
    except UpstreamFailure:
        if chunker.framed and (out := chunker.flush()):  # the text that came, before the error event
            await write(out)
        raise


async def _write_phrases(
    write: Callable[[bytes], Awaitable[None]], out: bytes, chunker: PhraseChunker, first_phrase: Callable[[], None]
) -> None:
    if not out:
        return
    counted = chunker.phrases
    await write(out)
    if counted:
        first_phrase()
