"""OpenAI/vLLM request validation and response shapes for /v1/chat/completions and /v1/completions.

Errors reuse the gateway's tree (`gateway.errors`): both answer with vLLM's error JSON,
`{"error": {message, type, param, code}}` with `code` the integer HTTP status.
Validation follows vLLM's rules for the fields a router or client sends; unknown fields are
ignored (vLLM warns and ignores them too). Responses and SSE chunks carry vLLM's keys,
including `usage.prompt_tokens_details.cached_tokens`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.errors import BadRequestError, NotFoundError

Kind = Literal["chat", "completion"]


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """A validated generation request: chat `messages`, or a completion's text or token ids
    (the engine's tokenizer renders and encodes them)."""

    kind: Kind
    messages: list[dict[str, Any]] | None
    prompt_text: str | None
    prompt_token_ids: list[int] | None
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    ignore_eos: bool
    stream: bool
    include_usage: bool


def check_model(body: Mapping[str, Any], served: str) -> None:
    model = body.get("model")
    if model is not None and model != served:
        raise NotFoundError(f"The model `{model}` does not exist.", param="model")


def parse_chat(body: Mapping[str, Any]) -> GenerateRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("`messages` must be a non-empty list", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequestError(f"messages[{i}] must be an object with a string `role`", param="messages")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadRequestError(f"messages[{i}].content must be a string or a list of parts", param="messages")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(part, dict) or (part.get("type") == "text" and not isinstance(part.get("text"), str)):
                raise BadRequestError(
                    f"messages[{i}].content[{j}] must be a content part object; a text part's `text` a string",
                    param="messages",
                )  # vLLM: a validation error, 400
    max_tokens = _max_tokens(body, "max_completion_tokens") or _max_tokens(body, "max_tokens")
    return _common(body, "chat", max_tokens, messages=messages)


def parse_completion(body: Mapping[str, Any]) -> GenerateRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return _common(body, "completion", _max_tokens(body, "max_tokens", default=16), text=prompt)
    if isinstance(prompt, list) and prompt and all(_is_token_id(t) for t in prompt):
        return _common(body, "completion", _max_tokens(body, "max_tokens", default=16), ids=list(prompt))
    raise BadRequestError(
        "`prompt` must be a string or a non-empty list of token ids (one prompt per request)", param="prompt"
    )


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def _common(
    body: Mapping[str, Any],
    kind: Kind,
    max_tokens: int | None,
    *,
    messages: list[dict[str, Any]] | None = None,
    text: str | None = None,
    ids: list[int] | None = None,
) -> GenerateRequest:
    n = _typed(body, "n", int, 1)
    if n != 1:
        raise BadRequestError("Only n=1 is supported", param="n")
    temperature = float(_typed(body, "temperature", (int, float), 1.0))
    if temperature < 0:
        raise BadRequestError(f"temperature must be non-negative, got {temperature}.", param="temperature")
    top_p = float(_typed(body, "top_p", (int, float), 1.0))
    if not 0 < top_p <= 1:
        raise BadRequestError(f"top_p must be in (0, 1], got {top_p}.", param="top_p")
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(s for s in stop if s)
    else:
        raise BadRequestError("`stop` must be a string or a list of strings", param="stop")
    stream_options = _typed(body, "stream_options", dict, None) or {}
    return GenerateRequest(
        kind=kind,
        messages=messages,
        prompt_text=text,
        prompt_token_ids=ids,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=_typed(body, "seed", int, None),
        stop=stops,
        ignore_eos=_typed(body, "ignore_eos", bool, False),
        stream=_typed(body, "stream", bool, False),
        include_usage=bool(stream_options.get("include_usage", False)),
    )


def _typed(body: Mapping[str, Any], key: str, types: type | tuple[type, ...], default: Any) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, types) or (isinstance(value, bool) and types is not bool):
        names = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise BadRequestError(f"`{key}` must be of type {names}, got {type(value).__name__}", param=key)
    return value


def _max_tokens(body: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    value: int | None = _typed(body, key, int, default)
    if value is not None and value < 1:
        raise BadRequestError(f"{key} must be at least 1, got {value}.", param=key)
    return value


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class ResponseFormatter:
    """Builds one request's response body or SSE chunks in vLLM's shapes."""

    def __init__(self, kind: Kind, model: str, request_id: str | None = None) -> None:
        self.kind, self.model = kind, model
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        self.id = f"{prefix}-{request_id or uuid.uuid4().hex}"
        self.created = int(time.time())
        self._chunk_object = "chat.completion.chunk" if kind == "chat" else "text_completion"
        # The hot path (one content chunk per token) splices the text into pre-rendered bytes.
        head = orjson.dumps(
            {"id": self.id, "object": self._chunk_object, "created": self.created, "model": self.model}
        )[:-1]
        text_key = b'"delta":{"content":' if kind == "chat" else b'"text":'
        self._content_head = b"data: " + head + b',"choices":[{"index":0,' + text_key
        self._content_tail = (
            b"}" if kind == "chat" else b""
        ) + b',"logprobs":null,"finish_reason":null,"stop_reason":null}]'

    def _choice(self, text: str, finish_reason: str | None, stop_reason: str | None, *, first: bool) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
            return {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
            }
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": stop_reason}

    def content_chunk(self, text: str) -> bytes:
        """Same bytes as `chunk(text)`, without building and encoding a dict."""
        return self._content_head + orjson.dumps(text) + self._content_tail + b"}\n\n"

    def chunk(
        self, text: str, finish_reason: str | None = None, stop_reason: str | None = None, *, first: bool = False
    ) -> bytes:
        """No `usage` key, as vLLM (it serialises unset fields away; OpenAI sends `"usage": null`)."""
        return sse(
            {
                "id": self.id,
                "object": self._chunk_object,
                "created": self.created,
                "model": self.model,
                "choices": [self._choice(text, finish_reason, stop_reason, first=first)],
            }
        )

    def usage_chunk(self, usage_: dict[str, Any]) -> bytes:
        return sse(
            {
                "id": self.id,
                "object": self._chunk_object,
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage_,
            }
        )

    def full(
        self, text: str, finish_reason: str | None, stop_reason: str | None, usage_: dict[str, Any]
    ) -> dict[str, Any]:
        if self.kind == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
            }
            obj = "text_completion"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage_,
        }


def sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
