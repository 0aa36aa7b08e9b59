"""The SGLang runtime's informational routes, so SGLang's routers accept the stub as a worker.

sglang-router and SMG probe a worker with `/server_info` (or `/get_server_info`) and
`/model_info` (or `/get_model_info`) before they route to it, and cache-aware SGLang policies
read `/get_load`. The stub answers them in SGLang's shapes from its own config and scheduler,
so peers can be benchmarked in front of the same replicas as the gateway.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from replica_stub import __version__
from replica_stub.config import StubConfig
from replica_stub.scheduler import Scheduler


def add_routes(app: web.Application, config: StubConfig, scheduler: Scheduler) -> None:
    async def server_info(request: web.Request) -> web.Response:
        return _json(
            {
                "model_path": config.model,
                "served_model_name": config.model,
                "tokenizer_path": None,
                "context_length": config.max_model_len,
                "page_size": config.block_size,
                "max_running_requests": config.max_num_seqs,
                "max_total_num_tokens": config.num_gpu_blocks * config.block_size,
                "chunked_prefill_size": config.max_num_batched_tokens,
                "dp_size": 1,
                "version": __version__,
            }
        )

    async def model_info(request: web.Request) -> web.Response:
        return _json(
            {
                "model_path": config.model,
                "tokenizer_path": None,
                "is_generation": True,
                "served_model_name": config.model,
                "max_context_length": config.max_model_len,
            }
        )

    async def get_load(request: web.Request) -> web.Response:
        pool = scheduler.kv.pool
        return _json(
            [
                {
                    "dp_rank": 0,
                    "num_reqs": scheduler.num_running + scheduler.num_waiting,
                    "num_waiting_reqs": scheduler.num_waiting,
                    "num_tokens": (pool.num_blocks - pool.num_free_blocks) * pool.block_size,
                }
            ]
        )

    for path, handler in (
        ("/server_info", server_info),
        ("/get_server_info", server_info),
        ("/model_info", model_info),
        ("/get_model_info", model_info),
        ("/get_load", get_load),
    ):
        app.router.add_get(path, handler)


def _json(data: Any) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json")
