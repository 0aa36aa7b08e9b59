"""`GET /v1/models`: each pool, its exact aliases and its LoRA adapters, with the cards the replicas give."""

from __future__ import annotations

import time
from typing import Any

import aiohttp

from gateway.adapters import AdapterMap
from gateway.backend_auth import auth_headers
from gateway.config import Config
from gateway.model_names import exact_aliases
from gateway.state import ModelRoute

_MODEL_FIELDS = ("max_model_len",)  # taken from a replica's own /v1/models entry
_STARTED = int(time.time())


async def model_list(session: aiohttp.ClientSession, routes: dict[str, ModelRoute], config: Config,
                     adapters: AdapterMap) -> dict[str, Any]:
    """Each pool, then its exact aliases, with the card its replicas give (wildcards are not listed),
    then its adapters with `parent` (the pool) and `root` (the path a replica listed, if one did)."""
    data = []
    for m, route in routes.items():
        card = {"object": "model", "created": _STARTED, "owned_by": "affinity-gateway",
                **await _replica_model_fields(session, route, config)}
        pool = config.pools.get(m)
        data += [{"id": name, **card} for name in (m, *(exact_aliases(pool.aliases) if pool else ()))]
        data += [{"id": name, "object": "model", "created": _STARTED, "owned_by": "affinity-gateway", "root": root,
                  "parent": m} for name, root in adapters.roots.get(m, {}).items()]
    return {"object": "list", "data": data}


async def _replica_model_fields(session: aiohttp.ClientSession, route: ModelRoute, config: Config) -> dict[str, Any]:
    """What a replica says of the model that clients size requests by (vLLM's `max_model_len`);
    empty when no replica answers within a second (the list itself never fails)."""
    for replica in route.pool:
        if not replica.is_available():
            continue
        try:
            async with session.get(f"{replica.url}/v1/models", timeout=aiohttp.ClientTimeout(total=1.0),
                                   headers=auth_headers(config.backend_key(route.model, replica.replica_id))) as r:
                listed = (await r.json(content_type=None)).get("data", []) if r.status == 200 else []
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
            continue
        for entry in listed if isinstance(listed, list) else []:
            if isinstance(entry, dict) and entry.get("id") == route.model:
                return {k: entry[k] for k in _MODEL_FIELDS if k in entry}
        return {}
    return {}
