"""What a client may send: the body read once under a size and time limit, then checked for shape.

Checks that need no routing state run in `read_view` (size, read deadline, JSON shape, number of
messages); the prompt-length estimate needs the pool's prefix parameters and runs in
`check_prompt`, once the model is known. Header sizes and the header deadline are enforced by the
HTTP server itself (see `lifecycle.serve`). Every limit is a `limits.*` key.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from aiohttp import web

from gateway.config.pools import PrefixConfig
from gateway.config.sections import LimitsConfig
from gateway.edge.encoding import decode_body
from gateway.edge.multipart_form import form_fields
from gateway.errors import BadRequestError, PayloadTooLargeError, RequestTimeoutError, json_object
from gateway.prompt.prefix_keys import prompt_source
from gateway.view import RequestView


async def read_view(
    request: web.Request,
    endpoint: str,
    limits: LimitsConfig,
    request_id: str,
    tenant: str | None = None,
    session_header: str = "X-Session-ID",
) -> RequestView:
    """Read the body once (bounded in size and time), decode its Content-Encoding (`gateway.edge.encoding`),
    parse it once with orjson; the decoded bytes are what gets forwarded. The session key comes from
    `session_header` (`headers.session`), else the body's `prompt_cache_key` or `user`."""
    limit = limits.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLargeError(f"request body of {request.content_length} bytes exceeds the limit of {limit}")
    if request.content.is_eof():  # the whole body came with the headers (most do): no wait, no copy
        received = request.content.read_nowait()
        if len(received) > limit:
            raise PayloadTooLargeError(f"request body exceeds the limit of {limit} bytes")
    else:
        received = await _read_body(request, limits)
    raw = decode_body(request.headers.get("Content-Encoding"), received, limit)
    body = form_fields(raw, request.headers.get("Content-Type")) if endpoint == "audio" else json_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequestError("`model` must be a non-empty string", param="model")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise BadRequestError("`stream` must be true or false", param="stream")
    messages = body.get("messages")
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        raise BadRequestError(f"{len(messages)} messages exceed the limit of {limits.max_messages}", param="messages")
    session, source = _session(request.headers.get(session_header), body)
    return RequestView(
        request_id=request_id,
        endpoint=endpoint,
        model=model,
        stream=stream,
        body=body,
        raw=raw,
        tenant=tenant,
        session_key=session,
        session_source=source,
    )


def _session(header: str | None, body: dict[str, Any]) -> tuple[str | None, str | None]:
    """The session key and where it came from: the header, else the body's `prompt_cache_key` or `user`
    (the first one given; not a string: none)."""
    for source, value in (
        ("header", header),
        ("prompt_cache_key", body.get("prompt_cache_key")),
        ("user", body.get("user")),
    ):
        if value:
            return (value, source) if isinstance(value, str) else (None, None)
    return None, None


async def _read_body(request: web.Request, limits: LimitsConfig) -> bytes:
    """The body as it arrives, within `limits.client_body_timeout_s` and `limits.max_body_bytes`."""
    limit, received = limits.max_body_bytes, bytearray()
    try:
        async with asyncio.timeout(limits.client_body_timeout_s):
            async for chunk in request.content.iter_any():
                received += chunk
                if len(received) > limit:
                    raise PayloadTooLargeError(f"request body exceeds the limit of {limit} bytes")
    except TimeoutError:
        raise RequestTimeoutError(f"request body not received within {limits.client_body_timeout_s:g}s") from None
    return bytes(received)


def estimate_prompt(view: RequestView, params: PrefixConfig) -> int:
    """Prompt tokens as the prefix hasher counts them: token ids exactly, text by characters."""
    if not view.prompt_tokens_estimate:
        source, _ = prompt_source(view.endpoint, view.body)
        view.prompt_tokens_estimate = (
            math.ceil(len(source) / params.chars_per_token) if isinstance(source, str) else len(source)
        )
    return view.prompt_tokens_estimate


def check_prompt(view: RequestView, params: PrefixConfig, limits: LimitsConfig) -> None:
    if limits.max_prompt_tokens and estimate_prompt(view, params) > limits.max_prompt_tokens:
        param = {"chat": "messages", "embeddings": "input"}.get(view.endpoint, "prompt")
        raise BadRequestError(
            f"the prompt is about {view.prompt_tokens_estimate} tokens, over the limit of {limits.max_prompt_tokens}",
            param=param,
        )
