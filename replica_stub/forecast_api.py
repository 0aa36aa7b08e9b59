"""`POST /debug/forecast_ttft`: the sim stub's own forecast of a request's time to first token (not a vLLM route).

The body is a chat or completions request, as a client would send it (`messages` or `prompt`). The stub
tokenizes it as it would to serve it, then replays its scheduler forward from its true state (waiting line,
running batch, the step in flight, the block pool's cached blocks) with the engine's step cost
(`replica_stub.engine.forecast`). Nothing is queued. The lab's engine-aware oracle router
(`lab.oracle_router`) asks every replica for this and sends the request where it is lowest: a yardstick no
gateway can reach, for `bench --compare oracle`. A body the stub could not serve is refused as that request
would be (400); only the sim engine forecasts (its step cost is a model it knows, the real engine's is not),
elsewhere the route answers 404.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from gateway.errors import NotFoundError
from replica_stub import lora
from replica_stub.engine import forecast
from replica_stub.engine.simulated import SimEngine
from replica_stub.generation import CONFIG, ENGINE, ENGINE_LOOP, prompt_token_ids
from replica_stub.protocol import parse_chat, parse_completion
from replica_stub.request import ROOT_HASH, chain_hashes

ReadBody = Callable[[web.Request], Awaitable[dict[str, Any]]]


def add_routes(app: web.Application, read_body: ReadBody) -> None:
    async def forecast_ttft(request: web.Request) -> web.Response:
        engine, loop = request.app[ENGINE], request.app[ENGINE_LOOP]
        if not isinstance(engine, SimEngine):
            raise NotFoundError("no forecast on this replica: only the sim engine forecasts its TTFT (--engine sim)")
        body = await read_body(request)
        config = request.app[CONFIG]
        adapter = lora.resolve(body.get("model"), config.model, config.loras)
        gen = parse_chat(body) if "messages" in body else parse_completion(body)
        prompt = prompt_token_ids(request, gen)
        scheduler = loop.scheduler
        hashes = chain_hashes(prompt, scheduler.kv.pool.block_size, adapter.hash_root if adapter else ROOT_HASH)
        step = loop.step_in_flight
        ttft_s = forecast.predicted_ttft_s(
            scheduler,
            hashes,
            len(prompt),
            time.monotonic(),
            engine.timing,
            engine.speedup,
            busy_until=engine.step_ends_at if step is not None else None,
            step=step,
        )
        answer = {
            "ttft_s": ttft_s,
            "prompt_tokens": len(prompt),
            "cached_tokens": forecast.cached_prompt_tokens(scheduler, hashes, len(prompt)),
            "running": scheduler.num_running,
            "waiting": scheduler.num_waiting,
        }
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    app.router.add_post("/debug/forecast_ttft", forecast_ttft)
