"""One generation on the engine loop, shared by every API that generates (chat, completions,
Anthropic messages, the Responses API): tokenize, check the context length, submit, and abort
the request however its handler ends, so its slot and KV blocks are freed at once."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from gateway.errors import BadRequestError, GatewayError
from replica_stub.config import StubConfig
from replica_stub.engine.base import Engine
from replica_stub.gate import ArrivalGate
from replica_stub.loop import EngineLoop
from replica_stub.lora import Lora
from replica_stub.output import RequestStream
from replica_stub.protocol import GenerateRequest, usage
from replica_stub.request import Request, SamplingParams

CONFIG = web.AppKey("config", StubConfig)
ENGINE = web.AppKey("engine", Engine)
ENGINE_LOOP = web.AppKey("engine_loop", EngineLoop)
ARRIVALS = web.AppKey("arrivals", ArrivalGate)

_ids = iter(range(1 << 62))


def submit(http: web.Request, gen: GenerateRequest, lora: Lora | None = None) -> tuple[Request, RequestStream]:
    """Tokenize `gen` as the engine does and queue it (for `lora`'s adapter, if any); BadRequestError
    past the context length."""
    config, engine_loop, tokenizer = http.app[CONFIG], http.app[ENGINE_LOOP], http.app[ENGINE].tokenizer
    prompt_ids = prompt_token_ids(http, gen)
    max_tokens = check_length(len(prompt_ids), gen.max_tokens, config.max_model_len)
    client_id = http.headers.get("X-Request-Id")
    sampling = SamplingParams(
        max_tokens=max_tokens,
        temperature=gen.temperature,
        top_p=gen.top_p,
        seed=gen.seed,
        stop=gen.stop,
        ignore_eos=gen.ignore_eos,
    )
    request = Request(
        f"{client_id or uuid.uuid4().hex}#{next(_ids)}",
        prompt_ids,
        sampling,
        config.block_size,
        eos_token_id=tokenizer.eos_token_id,
        lora=lora,
    )
    try:
        return request, engine_loop.submit(request, gen.stop)
    except RuntimeError as exc:
        raise GatewayError(str(exc)) from None


def prompt_token_ids(http: web.Request, gen: GenerateRequest) -> list[int]:
    """The prompt as the engine sees it: the client's token ids, or its text (chat: templated) tokenized."""
    config, tokenizer = http.app[CONFIG], http.app[ENGINE].tokenizer
    if gen.prompt_token_ids is not None:
        if config.engine == "real" and not all(map(tokenizer.is_known, gen.prompt_token_ids)):
            raise BadRequestError("Prompt token ids outside the model's vocabulary", param="prompt")
        return gen.prompt_token_ids
    if gen.messages is not None:
        return tokenizer.encode(tokenizer.apply_chat_template(gen.messages))
    return tokenizer.encode(gen.prompt_text or "")


@asynccontextmanager
async def generation(http: web.Request, gen: GenerateRequest, lora: Lora | None = None) -> AsyncIterator[RequestStream]:
    """`submit`, aborted at the end unless it finished (client gone, failed write, error)."""
    request, stream = submit(http, gen, lora)
    try:
        yield stream
    finally:
        if not stream.finished:
            http.app[ENGINE_LOOP].abort(request.request_id)


def check_length(num_prompt: int, max_tokens: int | None, max_model_len: int) -> int:
    if num_prompt == 0:
        raise BadRequestError("The prompt is empty", param="prompt")
    wanted = num_prompt + (max_tokens or 0)
    if num_prompt >= max_model_len or wanted > max_model_len:
        raise BadRequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{wanted} tokens ({num_prompt} in the messages, {max_tokens or 0} in the completion). "
            "Please reduce the length of the messages or completion.",
            param="messages",
        )
    return max_tokens if max_tokens is not None else max_model_len - num_prompt


def stream_usage(stream: RequestStream) -> dict[str, Any]:
    request = stream.request
    return usage(request.num_prompt_tokens, stream.num_output_tokens, request.num_cached_tokens or 0)
