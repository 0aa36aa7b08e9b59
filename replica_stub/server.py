"""The aiohttp app: vLLM's routes and shapes over the engine loop.

A generation handler reads as the request's story: parse and validate, tokenize, check the
context length, submit to the loop, then either stream SSE chunks as deltas arrive or
return one JSON body. Whatever way the handler ends early (client gone -> cancellation,
failed write), `finally` aborts the request so its slot and KV blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import structlog
from aiohttp import web

from gateway.errors import BadRequestError, GatewayError, UnsupportedMediaTypeError, error_body, json_object
from replica_stub import __version__, audio_api, chat_apis, forecast_api, lora, pooling_api, sglang_api
from replica_stub.block_pool import BlockPool
from replica_stub.config import StubConfig
from replica_stub.engine.registry import build_engine
from replica_stub.gate import ArrivalGate
from replica_stub.generation import ARRIVALS, CONFIG, ENGINE, ENGINE_LOOP, generation, stream_usage
from replica_stub.kv_cache import KVCacheManager
from replica_stub.kv_events import KVEventPublisher
from replica_stub.loop import EngineLoop, probe_loop_lag
from replica_stub.metrics import StubMetrics
from replica_stub.output import RequestStream
from replica_stub.protocol import (
    SSE_DONE,
    GenerateRequest,
    Kind,
    ResponseFormatter,
    check_model,
    parse_chat,
    parse_completion,
)
from replica_stub.scheduler import Scheduler

log = structlog.get_logger("replica_stub.server")

METRICS = web.AppKey("metrics", StubMetrics)
KV_EVENTS = web.AppKey("kv_events", KVEventPublisher)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BlocksInUseError(GatewayError):
    """409: the prefix cache can only be reset while no request holds blocks (as in vLLM)."""

    status, type = 409, "ConflictError"


def make_app(config: StubConfig) -> web.Application:
    config, engine = build_engine(config)
    app = web.Application(middlewares=[error_middleware, api_key_middleware], client_max_size=64 * 1024 * 1024)
    publisher = _kv_event_publisher(config)
    if publisher is not None:
        app[KV_EVENTS] = publisher
    # Both engines schedule through this one pool (the real one indexes its KV tensors by its block ids),
    # so both publish KV events.
    pool = BlockPool(config.num_gpu_blocks, config.block_size, on_event=publisher.on_event if publisher else None)
    scheduler = Scheduler(
        KVCacheManager(pool),
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.max_model_len,
        batching=config.batching,
    )
    metrics = StubMetrics(config, scheduler)
    app[CONFIG], app[ENGINE], app[METRICS] = config, engine, metrics
    app[ENGINE_LOOP] = EngineLoop(scheduler, engine, metrics, publish_events=publisher.flush if publisher else None)
    app[ARRIVALS] = ArrivalGate()
    app.on_response_prepare.append(add_replica_headers)
    app.cleanup_ctx.append(background_tasks)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/ping", health)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/version", version)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_get("/debug/kv_cache", kv_cache_state)
    sglang_api.add_routes(app, config, scheduler)  # what SGLang's routers probe
    pooling_api.add_routes(app, _json_body)  # embeddings, pooling, classify, score, rerank
    chat_apis.add_routes(app, _json_body)  # Anthropic messages, the Responses API
    audio_api.add_routes(app)  # transcriptions, translations (fixed text)
    forecast_api.add_routes(app, _json_body)  # the sim engine's own TTFT forecast, for the lab's oracle router
    return app


def _kv_event_publisher(config: StubConfig) -> KVEventPublisher | None:
    if not config.kv_events_endpoint:
        return None
    return KVEventPublisher(
        config.kv_events_endpoint,
        config.kv_events_replay_endpoint or None,
        topic=config.kv_events_topic,
        buffer_steps=config.kv_events_buffer_steps,
        encoding=config.kv_events_encoding,
    )


async def background_tasks(app: web.Application) -> AsyncIterator[None]:
    """The engine loop, the lag probe and the KV-event replay server live exactly as long as the app."""
    tasks = [
        asyncio.create_task(app[ENGINE_LOOP].run(), name="engine-loop"),
        asyncio.create_task(probe_loop_lag(app[METRICS], app[ENGINE_LOOP].scheduler), name="loop-lag-probe"),
    ]
    publisher = app.get(KV_EVENTS)
    if publisher is not None:
        publisher.start()
    yield
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if publisher is not None:
        await publisher.close()
    await app[ENGINE].close()


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except GatewayError as exc:
        return _error_response(exc.body(), exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        type_ = "NotFoundError" if exc.status == 404 else "BadRequestError"
        return _error_response(error_body(exc.reason, type_, exc.status), exc.status)
    except ConnectionResetError:
        raise
    except Exception:
        log.exception("internal_error", path=request.path)
        return _error_response(error_body("Internal server error", "InternalServerError", 500), 500)


@web.middleware
async def api_key_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """vLLM's `--api-key`: only /v1/* is guarded, and a wrong or missing key gets `{"error": "Unauthorized"}`."""
    key = request.app[CONFIG].api_key
    if (
        key
        and request.path.startswith("/v1")
        and request.method != "OPTIONS"
        and not hmac.compare_digest(request.headers.get("Authorization", "").encode(), f"Bearer {key}".encode())
    ):
        return web.Response(status=401, body=b'{"error":"Unauthorized"}', content_type="application/json")
    return await handler(request)


def _error_response(body: bytes, status: int) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json")


async def add_replica_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["X-Replica-Id"] = request.app[CONFIG].replica_id
    request_id = request.headers.get("X-Request-Id")
    if request_id:
        response.headers["X-Request-Id"] = request_id


def _json(payload: Any) -> web.Response:
    return web.Response(body=orjson.dumps(payload), content_type="application/json")


async def _json_body(request: web.Request) -> dict[str, Any]:
    if "Content-Type" in request.headers and request.content_type != "application/json":
        raise UnsupportedMediaTypeError(
            f"Unsupported Media Type: Only 'application/json' is allowed, got {request.content_type!r}"
        )
    return json_object(await request.read())


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def _generate(http: web.Request, kind: Kind) -> web.StreamResponse:
    config = http.app[CONFIG]
    await http.app[ARRIVALS].enter()
    body = await _json_body(http)
    adapter = lora.resolve(body.get("model"), config.model, config.loras)
    if config.fail_on_marker and config.fail_on_marker.encode() in await http.read():
        raise GatewayError(f"injected fault: the request contains {config.fail_on_marker!r}")  # a 500
    gen = parse_chat(body) if kind == "chat" else parse_completion(body)
    fmt = ResponseFormatter(kind, adapter.name if adapter else config.model, http.headers.get("X-Request-Id"))
    async with generation(http, gen, adapter) as stream:
        if gen.stream:
            return await _stream_response(http, stream, fmt, gen)
        return await _full_response(stream, fmt)


async def _full_response(stream: RequestStream, fmt: ResponseFormatter) -> web.Response:
    text = "".join([delta.text async for batch in stream.batches() for delta in batch])
    if stream.finish_reason == "abort":
        raise GatewayError("The engine failed while generating")
    return _json(fmt.full(text, stream.finish_reason, stream.stop_reason, stream_usage(stream)))


async def _stream_response(
    http: web.Request, stream: RequestStream, fmt: ResponseFormatter, gen: GenerateRequest
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(http)
    parts = [fmt.chunk("", first=True)] if fmt.kind == "chat" else []
    try:
        async for batch in stream.batches():
            for delta in batch:
                if delta.finish_reason == "abort":
                    parts.append(b"data: " + error_body("The engine failed", "InternalServerError", 500) + b"\n\n")
                elif delta.finish_reason is not None:
                    parts.append(fmt.chunk(delta.text, delta.finish_reason, delta.stop_reason))
                elif delta.text:
                    parts.append(fmt.content_chunk(delta.text))
            if stream.finished:
                break
            await response.write(b"".join(parts))
            parts = []
        if gen.include_usage and stream.finish_reason != "abort":
            parts.append(fmt.usage_chunk(stream_usage(stream)))
        parts.append(SSE_DONE)
        await response.write(b"".join(parts))
        await response.write_eof()
    except ConnectionResetError:
        log.info("client_disconnected", request_id=stream.request.request_id)
    return response


async def models(request: web.Request) -> web.Response:
    """The base model, then each LoRA adapter with its `parent`, as vLLM lists them."""
    config, created = request.app[CONFIG], int(time.time())
    card = {
        "id": config.model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": config.model,
        "parent": None,
        "max_model_len": config.max_model_len,
    }
    return _json({"object": "list", "data": [card, *lora.cards(config.loras, config.model, created)]})


async def health(request: web.Request) -> web.Response:
    return web.Response(status=503 if request.app[ENGINE_LOOP].dead is not None else 200)


async def metrics_handler(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[METRICS].render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )


async def version(request: web.Request) -> web.Response:
    return _json({"version": __version__})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    """Drop every cached prefix (AllBlocksCleared); 409 while a request holds blocks."""
    if not request.app[ENGINE_LOOP].reset_prefix_cache():
        raise BlocksInUseError("Cannot reset the prefix cache while requests hold KV blocks; retry when idle")
    return web.Response()


async def kv_cache_state(request: web.Request) -> web.Response:
    """What the prefix cache holds now (not a vLLM endpoint): lets tests compare a router's view of
    this replica with the truth; with KV events on, how many subscribers and replays they cost it."""
    pool = request.app[ENGINE_LOOP].scheduler.kv.pool
    publisher = request.app.get(KV_EVENTS)
    events = (
        {} if publisher is None else {"kv_events": {"subscribers": publisher.subscribers, "replays": publisher.replays}}
    )
    return _json(
        {
            "block_size": pool.block_size,
            "num_gpu_blocks": pool.num_blocks,
            "cached_blocks": len(pool.cached),
            "free_blocks": pool.num_free_blocks,
            **events,
        }
    )


async def tokenize(request: web.Request) -> web.Response:
    body = await _json_body(request)
    config, tokenizer = request.app[CONFIG], request.app[ENGINE].tokenizer
    lora.resolve(body.get("model"), config.model, config.loras)  # an adapter tokenizes as its base
    if isinstance(body.get("prompt"), str):
        text = body["prompt"]
    elif isinstance(body.get("messages"), list):
        parse_chat(body)  # same validation as a chat request
        generation_prompt = bool(body.get("add_generation_prompt", True))
        text = tokenizer.apply_chat_template(body["messages"], add_generation_prompt=generation_prompt)
    else:
        raise BadRequestError("Either `prompt` (string) or `messages` (list) is required", param="prompt")
    ids = tokenizer.encode(text)
    return _json({"count": len(ids), "max_model_len": config.max_model_len, "tokens": ids, "token_strs": None})


async def detokenize(request: web.Request) -> web.Response:
    body = await _json_body(request)
    check_model(body, request.app[CONFIG].model)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise BadRequestError("`tokens` must be a list of integers", param="tokens")
    tokenizer = request.app[ENGINE].tokenizer
    unknown = [t for t in tokens if not tokenizer.is_known(t)]
    if unknown:
        raise BadRequestError(f"Unknown token ids: {unknown[:5]}", param="tokens")
    return _json({"prompt": tokenizer.decode(tokens, skip_special_tokens=False)})
