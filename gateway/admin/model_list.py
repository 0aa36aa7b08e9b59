"""`GET /v1/models`: each pool, its exact aliases and its LoRA adapters, with the cards the replicas
gave at their last probe (`gateway.replicas.models`): answered from memory, no replica is asked."""

from __future__ import annotations

import time
from typing import Any

from gateway.config.loader import Config
from gateway.config.model_names import exact_aliases
from gateway.routing.adapters import AdapterMap
from gateway.routing.model_route import ModelRoute

_STARTED = int(time.time())


def model_list(routes: dict[str, ModelRoute], config: Config, adapters: AdapterMap) -> dict[str, Any]:
    """Each pool, then its exact aliases, with the card its replicas give (wildcards are not listed),
    then its adapters with `parent` (the pool) and `root` (the path a replica listed, if one did)."""
    data = []
    for m, route in routes.items():
        card = {"object": "model", "created": _STARTED, "owned_by": "affinity-gateway", **_replica_card(route)}
        pool = config.pools.get(m)
        data += [{"id": name, **card} for name in (m, *(exact_aliases(pool.aliases) if pool else ()))]
        data += [
            {
                "id": name,
                "object": "model",
                "created": _STARTED,
                "owned_by": "affinity-gateway",
                "root": root,
                "parent": m,
            }
            for name, root in adapters.roots.get(m, {}).items()
        ]
    return {"object": "list", "data": data}


def _replica_card(route: ModelRoute) -> dict[str, Any]:
    """The first available replica's own card for the pool's model (empty before any answered)."""
    return next((r.model_card for r in route.pool if r.is_available() and r.model_card), {})
