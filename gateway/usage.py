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
_MAX_ANSWER_CHARS = 1 << 18  # answer text kept for the warm-prefix index; the rest is not needed


@dataclass(slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    answer: list[str] | None = None  # the first choice's text pieces; None: not collected
    answer_chars: int = 0
    response_id: str | None = None  # a Responses API answer's id (gateway.stored_responses)

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
        if b'"usage"' not in body and self.answer is None:
            return
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return
        if isinstance(data, dict):
            self.update(data.get("usage"))
            for envelope in ("message", "response"):  # Anthropic message_start, Responses response.completed
                if isinstance(inner := data.get(envelope), dict):
                    self.update(inner.get("usage"))
            response = data.get("response", data)  # streamed: response.completed's; whole: the body itself
            if isinstance(response, dict) and response.get("object") == "response" \
                    and isinstance(response.get("id"), str):
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
    """Feed it every relayed chunk; it keeps only the unfinished last event between chunks."""

    def __init__(self, usage: Usage) -> None:
        self.usage = usage
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        data = self._tail + chunk if self._tail else chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._tail = data if len(data) <= _MAX_TAIL_BYTES else b""
            return
        self._tail = data[end + 2:]
        complete = data[:end]
        collect = self.usage.answer is not None
        if b'"usage"' not in complete and not collect:
            return
        for event in complete.split(b"\n\n"):
            if collect or (b'"usage"' in event and b'"usage":null' not in event):
                for line in event.split(b"\n"):
                    if line.startswith(b"data:"):
                        self.usage.read_body(line[5:].strip())


def _int(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
