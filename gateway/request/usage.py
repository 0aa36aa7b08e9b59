"""Token counts (and, when asked, the answer's text) read from answers on their way through.

Non-streamed: the JSON body's `usage`. Streamed: the SSE event that carries a non-null `usage`
(the last one with `stream_options.include_usage`), found by `gateway.relay.sse_usage`.
`cached_tokens` is `usage.prompt_tokens_details.cached_tokens` (vLLM: --enable-prompt-tokens-details).
The answer's text is collected only for prefix policies: the replica caches the answer's KV too,
and the next turn of the conversation starts with it. It is read from every API that carries a
conversation: chat and completions choices, Anthropic Messages' text blocks and deltas, the Responses
API's output text and its deltas.

Counts are a replica's word, so each is clamped to what is possible before anything charges or counts it:
a negative count reads as not reported (a Prometheus counter refuses to go down: the request used to end
in a 500 after the work was done), and a count over `ceiling` reads as `ceiling`: the replica's
`max_model_len` when its `/v1/models` said it (set by the attempt loop, `bound`), else `MAX_TOKENS`.
Completion tokens may reach `ceiling` once per choice (`n`). One lying replica then costs its tenant at
most one context's worth of its token rate, not a lock-out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

_MAX_ANSWER_CHARS = 1 << 18  # answer text kept for the warm-prefix index; the rest is not needed
# The most tokens one count may say when the replica's max_model_len is unknown: 1 Mi, a context as long as
# the longest served today (a larger one is known from /v1/models and bounds the count instead).
MAX_TOKENS = 1 << 20
_MAX_CHOICES = 128  # `n` beyond this does not raise the bound further


@dataclass(slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    answer: list[str] | None = None  # the first choice's text pieces; None: not collected
    answer_chars: int = 0
    response_id: str | None = None  # a Responses API answer's id (gateway.relay.stored_responses)
    ceiling: int = MAX_TOKENS  # the most tokens one sequence can count (the replica's max_model_len)
    choices: int = 1  # the request's `n`: completion tokens may reach `ceiling` once per choice

    def bound(self, max_model_len: Any, body: dict[str, Any]) -> None:
        """Bound the counts by the replica's context length (its model card's `max_model_len`, when it
        said one) and the request's number of choices."""
        known = max_model_len if isinstance(max_model_len, int) and not isinstance(max_model_len, bool) else 0
        self.ceiling = known if known > 0 else MAX_TOKENS
        n = body.get("n")
        self.choices = min(n, _MAX_CHOICES) if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1

    def update(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        # OpenAI chat/completions; Anthropic messages and the Responses API say input/output tokens
        most = self.ceiling
        self.prompt_tokens = _int(usage.get("prompt_tokens", usage.get("input_tokens")), self.prompt_tokens, most)
        self.completion_tokens = _int(
            usage.get("completion_tokens", usage.get("output_tokens")), self.completion_tokens, most * self.choices
        )
        self.cached_tokens = _int(usage.get("cache_read_input_tokens"), self.cached_tokens, most)
        details = usage.get("prompt_tokens_details", usage.get("input_tokens_details"))
        if isinstance(details, dict):
            self.cached_tokens = _int(details.get("cached_tokens"), self.cached_tokens, most)

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
            parsed = orjson.loads(b"".join((b"[", b",".join(objects), b"]")))
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
        choices = data.get("choices")
        if choices is not None:  # chat and completions, every event of their streams: no envelope, no response id
            if has_usage:
                self.update(data.get("usage"))
            if self.answer is not None:
                self._collect(_choice_text(choices))
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
            self._collect(_messages_or_responses_text(data))

    def _collect(self, text: Any) -> None:
        if isinstance(text, str) and text and self.answer is not None:
            if self.answer_chars + len(text) <= _MAX_ANSWER_CHARS:
                self.answer.append(text)
                self.answer_chars += len(text)


def _choice_text(choices: Any) -> Any:
    """Chat `message.content` / `delta.content`, or completions `text`, of choice 0."""
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    part = choice.get("message") or choice.get("delta")
    return part.get("content") if isinstance(part, dict) else choice.get("text")


def _messages_or_responses_text(data: dict[str, Any]) -> Any:
    """The answer text of an Anthropic Messages or Responses API body, or of one of their stream's events.
    A stream's text comes in its deltas only: its closing event repeats the whole answer
    (`response.completed`), and its opening one holds none yet (`message_start`)."""
    kind = data.get("type")
    if kind == "content_block_delta":  # Anthropic, streamed
        delta = data.get("delta")
        return delta.get("text") if isinstance(delta, dict) and delta.get("type") == "text_delta" else None
    if kind == "response.output_text.delta":  # Responses, streamed
        return data.get("delta")
    if kind == "message":  # Anthropic, whole: its text blocks
        return _texts(data.get("content"), "text")
    if data.get("object") == "response" and isinstance(output := data.get("output"), list):  # Responses, whole
        return "".join(
            _texts(item.get("content"), "output_text")
            for item in output
            if isinstance(item, dict) and item.get("type") == "message"
        )
    return None


def _texts(blocks: Any, kind: str) -> str:
    """The text of the `kind` blocks of a content list, joined as the chat rendering joins text parts."""
    if not isinstance(blocks, list):
        return ""
    return "".join(
        block["text"]
        for block in blocks
        if isinstance(block, dict) and block.get("type") == kind and isinstance(block.get("text"), str)
    )


def _int(value: Any, default: int | None, most: int) -> int | None:
    """A count as reported, at most `most`; not an int, or below zero: `default` (not reported)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return default
    return min(value, most)
