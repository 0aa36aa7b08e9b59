"""Token counts (and, when asked, the answer's text) read from answers on their way through,
without touching or delaying the bytes.

Non-streamed: the JSON body's `usage`. Streamed: the SSE event that carries a non-null `usage`
(the last one with `stream_options.include_usage`); chunks are scanned after they were written.
`cached_tokens` is `usage.prompt_tokens_details.cached_tokens` (vLLM: --enable-prompt-tokens-details).
The answer's text is collected only for prefix policies: the replica caches the answer's KV too,
and the next turn of the conversation starts with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

_MAX_TAIL_BYTES = 1 << 20  # an SSE event larger than this is not scanned
_BATCH_BYTES = 1 << 16  # streamed bytes scanned together
_MAX_ANSWER_CHARS = 1 << 18  # answer text kept for the warm-prefix index; the rest is not needed


@dataclass(slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    answer: list[str] | None = None  # the first choice's text pieces; None: not collected
    answer_chars: int = 0
    response_id: str | None = None  # a Responses API answer's id (gateway.relay.stored_responses)

    def update(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        # OpenAI chat/completions; Anthropic messages and the Responses API say input/output tokens
        self.prompt_tokens = _int(usage.get("prompt_tokens", usage.get("input_tokens")), self.prompt_tokens)
        self.completion_tokens = _int(usage.get("completion_tokens", usage.get("output_tokens")),
                                      self.completion_tokens)
        self.cached_tokens = _int(usage.get("cache_read_input_tokens"), self.cached_tokens)
        details = usage.get("prompt_tokens_details", usage.get("input_tokens_details"))
        if isinstance(details, dict):
            self.cached_tokens = _int(details.get("cached_tokens"), self.cached_tokens)

    def read_body(self, body: bytes) -> None:
        """A whole JSON answer, or one SSE event's data."""
        has_usage = b'"usage"' in body
        if not has_usage and self.answer is None:
            return
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return
        self._read(data, has_usage)

    def read_events(self, bodies: list[bytes]) -> None:
        """Several SSE events' data, as `read_body` each, parsed in one orjson.loads of a JSON array where
        they are all JSON objects (one call, not one per event: with the answer collected, every event is read)."""
        if self.answer is None:
            bodies = [body for body in bodies if b'"usage"' in body]
        objects = [body for body in bodies if body.startswith(b"{")]  # [DONE] and the like: no object to read
        if len(objects) < 2:  # nothing to batch
            for body in objects:
                self.read_body(body)
            return
        try:
            parsed = orjson.loads(b"[" + b",".join(objects) + b"]")
        except orjson.JSONDecodeError:
            parsed = None
        if parsed is None or len(parsed) != len(objects):  # some event is not JSON: each on its own
            for body in objects:
                self.read_body(body)
            return
        for body, data in zip(objects, parsed):
            self._read(data, b'"usage"' in body)

    def _read(self, data: Any, has_usage: bool) -> None:
        """Usage is looked for only in bodies that name it (as the stream scan does)."""
        if not isinstance(data, dict):
            return
        if has_usage:
            self.update(data.get("usage"))
            for envelope in ("message", "response"):  # Anthropic message_start, Responses response.completed
                if isinstance(inner := data.get(envelope), dict):
                    self.update(inner.get("usage"))
        response = data.get("response", data)  # streamed: response.completed's; whole: the body itself
        if isinstance(response, dict) and response.get("object") == "response" and isinstance(response.get("id"), str):
            self.response_id = response["id"]
        if self.answer is not None:
            self._collect(data.get("choices"))

    def _collect(self, choices: Any) -> None:
        """Chat `message.content` / `delta.content`, or completions `text`, of choice 0."""
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        part = choice.get("message") or choice.get("delta")
        text = part.get("content") if isinstance(part, dict) else choice.get("text")
        if isinstance(text, str) and text and self.answer is not None:
            if self.answer_chars + len(text) <= _MAX_ANSWER_CHARS:
                self.answer.append(text)
                self.answer_chars += len(text)


class SSEUsageScanner:
    """Feed it every relayed chunk, `flush()` it once the stream is over. Chunks are read in batches (of
    `_BATCH_BYTES`, and the rest at `flush()`): a short stream is split into events and parsed once, at its
    end, where a scan per chunk cost more than the relay itself. Between batches it keeps only the
    unfinished last event."""

    def __init__(self, usage: Usage) -> None:
        self.usage = usage
        self._tail = b""
        self._chunks: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> None:
        if self.usage.answer is None and not self._chunks and not self._tail and chunk.endswith(b"\n\n") \
                and _no_usage(chunk):
            return  # whole events, none with a usage to read (vLLM's every event but the last): nothing to keep
        self._chunks.append(chunk)
        self._size += len(chunk)
        if self._size >= _BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Read what was fed since the last batch (an unfinished last event waits for more, or stays unread)."""
        if not self._chunks:
            return
        data = self._tail + b"".join(self._chunks)
        self._chunks.clear()
        self._size = 0
        end = data.rfind(b"\n\n")
        if end < 0:
            self._tail = data if len(data) <= _MAX_TAIL_BYTES else b""
            return
        self._tail = data[end + 2:]
        complete = data[:end]
        collect = self.usage.answer is not None
        if not collect and _no_usage(complete):
            return
        self.usage.read_events([line[5:].strip() for event in complete.split(b"\n\n")
                                if collect or (b'"usage"' in event and b'"usage":null' not in event)
                                for line in event.split(b"\n") if line.startswith(b"data:")])


def _no_usage(events: bytes) -> bool:
    """No event here has a usage to read: each one that names it says null (vLLM's every event but the last)."""
    return events.count(b'"usage"') == events.count(b'"usage":null')


def _int(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
