"""`/ready`: whether this gateway should take traffic, for the fleet or for one pool.

One empty pool must not pull every gateway pod out of its Service (the other models still work),
so by default `/ready` fails only when *every* pool is empty; `readiness.require_all_pools: true`
asks for all of them. `/ready?model=NAME` answers for that pool alone (a per-model probe or
load-balancer check), 404 for a model the gateway does not serve. A SIGTERM makes every answer 503.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.routing.route_table import RouteTable


def report(
    state: RouteTable,
    model: str | None,
    draining: bool,
    queued: Mapping[str, int],
    local_rate_limits: bool = False,
    homes_from_replicas: bool = False,
) -> tuple[dict[str, Any], int]:
    """The body and status of `/ready` (`model` from `?model=`); NotFoundError for an unknown model.
    `local_rate_limits`: the fleet's shared quota is unreachable, this gateway enforces its own.
    `homes_from_replicas`: the shared response homes are unreachable, a follow-up whose home this gateway
    does not know asks the replicas in turn (slower, still answered)."""
    routes = [state.route_for(model)] if model is not None else list(state.routes.values())
    pools = {route.model: route.pool.num_available() for route in routes}
    empty = sorted(m for m, n in pools.items() if not n)
    degraded = sorted(route.model for route in routes if route.router.index.degraded)
    if model is not None or state.config.readiness.require_all_pools:
        pools_ready = not empty
    else:
        pools_ready = any(pools.values())
    is_ready = pools_ready and not draining
    body = {
        "ready": is_ready,
        "draining": draining,
        "available_replicas": pools,
        "empty_pools": empty,
        "degraded": {
            **({"index": degraded} if degraded else {}),
            **({"rate_limits": "local"} if local_rate_limits else {}),
            **({"response_homes": "ask_replicas"} if homes_from_replicas else {}),
        },
        "queued": {m: n for m, n in queued.items() if m in pools},
    }
    return body, 200 if is_ready else 503
