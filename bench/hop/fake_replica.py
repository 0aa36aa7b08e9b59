"""A zero-delay OpenAI-compatible replica for the hop benchmark: every answer is canned, so the
replica costs as little as aiohttp can and the routers in front of it are what is measured.

    python -m bench.hop.fake_replica --port 9001 [--model bench-model] [--token-gap-ms 2]

It answers `/v1/completions` (whole or as SSE: four events and `[DONE]` in one write; a stream asking for more
than four tokens gets one event per token, each in its own write `--token-gap-ms` apart, as an engine streams
them), `/health`, `/v1/models`
and a vLLM-shaped `/metrics`, which is what a router's probes and load scrapes read. `GET /bench/counts`
says how many requests each of those paths got (`bench.hop.background` reads it).
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SSE_CHUNKS = 4


def _completion(model: str, text: str, finish: str | None, usage: bool) -> dict[str, object]:
    body: dict[str, object] = {
        "id": "cmpl-bench",
        "object": "text_completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
    }
    if usage:
        body["usage"] = {"prompt_tokens": 8, "completion_tokens": SSE_CHUNKS, "total_tokens": 8 + SSE_CHUNKS}
    return body


def _event(model: str, last: bool) -> bytes:
    return b"data: " + orjson.dumps(_completion(model, " ok", "length" if last else None, False)) + b"\n\n"


def build_app(model: str, token_gap_s: float = 0.002) -> web.Application:
    """Every answer is encoded once, at start-up."""
    whole = orjson.dumps(_completion(model, " ok", "length", usage=True))
    token, last_token = _event(model, False), _event(model, True)
    events = token * (SSE_CHUNKS - 1) + last_token + b"data: [DONE]\n\n"
    models = orjson.dumps({"object": "list", "data": [{"id": model, "object": "model", "max_model_len": 4096}]})
    metrics = (
        f'vllm:num_requests_running{{model_name="{model}"}} 0.0\n'
        f'vllm:num_requests_waiting{{model_name="{model}"}} 0.0\n'
        f'vllm:kv_cache_usage_perc{{model_name="{model}"}} 0.0\n'
    ).encode()

    counts: Counter[str] = Counter()

    @web.middleware
    async def counted(request: web.Request, handler: Handler) -> web.StreamResponse:
        counts[request.path] += 1
        return await handler(request)

    async def completions(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if not body.get("stream"):
            return web.Response(body=whole, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        tokens = body.get("max_tokens")
        if isinstance(tokens, int) and tokens > SSE_CHUNKS:  # token by token, as an engine streams them
            for _ in range(tokens - 1):
                await response.write(token)
                await asyncio.sleep(token_gap_s)
            await response.write(last_token + b"data: [DONE]\n\n")
        else:
            await response.write(events)
        await response.write_eof()
        return response

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    async def list_models(_: web.Request) -> web.Response:
        return web.Response(body=models, content_type="application/json")

    async def scrape(_: web.Request) -> web.Response:
        return web.Response(body=metrics, content_type="text/plain")

    async def report(_: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(counts), content_type="application/json")

    app = web.Application(middlewares=[counted])
    app.router.add_get("/bench/counts", report)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/metrics", scrape)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.hop.fake_replica", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="bench-model")
    parser.add_argument("--token-gap-ms", type=float, default=2.0, help="between a token-by-token stream's events")
    args = parser.parse_args()
    import uvloop

    uvloop.install()
    app = build_app(args.model, args.token_gap_ms / 1e3)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
