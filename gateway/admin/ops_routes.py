"""The gateway's own routes, next to the model routes it proxies: the model list, health and
readiness, Prometheus metrics, and the admin API (replicas, token usage and cost, agent sessions, the
prompt-prefix hygiene report, the latest routing decisions, a dry-run route explanation, reload)."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
from aiohttp import web

from gateway.admin.model_list import model_list
from gateway.admin.readiness import report
from gateway.edge.limits import read_view
from gateway.errors import BadRequestError, ConfigError, NoReplicaError, NotFoundError, error_body
from gateway.insights.prefix_report import PrefixReport
from gateway.insights.sessions import Sessions
from gateway.insights.token_costs import TokenCosts, UsageQuery
from gateway.observability.decision_log import DecisionLog
from gateway.observability.metrics import CONTENT_TYPE, Metrics
from gateway.replicas import Replica
from gateway.request.keys import REQUEST_ID
from gateway.routing.adapters import named
from gateway.routing.model_route import ModelRoute
from gateway.routing.route_table import RouteTable

log = structlog.get_logger("gateway.admin")


@dataclass(frozen=True)
class OpsParts:
    """What the gateway's own routes read, handed over once by the app that owns it (`gateway.serving.app`):
    admin imports no part of serving."""

    state: RouteTable
    metrics: Metrics
    token_costs: TokenCosts
    prefix_report: PrefixReport
    decisions: DecisionLog
    sessions: Sessions
    waiting: Callable[[], dict[str, int]]  # requests waiting in each pool's admission queue
    draining: Callable[[], bool]  # a SIGTERM came: not ready
    local_only: Callable[[], bool]  # the shared quota is unreachable: this gateway's own windows stand in
    homes_from_replicas: Callable[[], bool]  # the shared response homes are unreachable: replicas are asked
    tenants_waiting: Callable[[], dict[tuple[str, str], int]]  # the same by (pool, tenant)


OPS = web.AppKey("ops", OpsParts)


def add_ops_routes(app: web.Application, parts: OpsParts) -> None:
    app[OPS] = parts
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/admin/replicas", admin_replicas)
    app.router.add_get("/admin/usage", admin_usage)
    app.router.add_get("/admin/decisions", admin_decisions)
    app.router.add_get("/admin/prefix-report", admin_prefix_report)
    app.router.add_get("/admin/sessions", admin_sessions)
    app.router.add_get("/admin/sessions/{session_id}", admin_session)
    app.router.add_post("/admin/reload", admin_reload)
    app.router.add_post("/admin/route/explain", admin_explain)


async def models(request: web.Request) -> web.Response:
    state = request.app[OPS].state
    return _json(model_list(state.routes, state.config, state.adapters))


async def health(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    """Ready unless every pool is empty (or any, with `readiness.require_all_pools`), or a SIGTERM came;
    `?model=` asks for one pool (`gateway.admin.readiness`). A degraded part (the shared index, quota or response
    homes unreachable: this gateway's own table and buckets, or asking the replicas, stand in) is reported but
    still ready."""
    ops = request.app[OPS]
    body, status = report(
        ops.state,
        request.query.get("model"),
        ops.draining(),
        ops.waiting(),
        ops.local_only(),
        ops.homes_from_replicas(),
    )
    return _json(body, status=status)


async def metrics(request: web.Request) -> web.Response:
    ops = request.app[OPS]
    if not ops.state.config.metrics.enabled:
        raise NotFoundError("metrics are disabled (metrics.enabled: false)")
    m = ops.metrics
    m.draining.set(float(ops.draining()))
    for model, waiting in ops.waiting().items():
        m.queue_waiting.labels(model).set(waiting)
    m.tenant_queue_waiting.clear()  # a tenant no longer waiting leaves the series (tenants come and go)
    for (model, tenant), waiting in ops.tenants_waiting().items():
        m.tenant_queue_waiting.labels(model, tenant).set(waiting)
    for route in ops.state.routes.values():  # fresh even when no request came since the store changed
        m.routing.index_degraded.labels(route.model).set(float(route.router.index.degraded))
        m.routing.index_mirror_synced.labels(route.model).set(float(route.router.index.mirrored))
    return web.Response(body=m.render(), headers={"Content-Type": CONTENT_TYPE})


async def admin_replicas(request: web.Request) -> web.Response:
    state = request.app[OPS].state
    return _json(
        {
            r.model: {"policy": r.routing.policy, "replicas": [_describe(state, r, rep) for rep in r.pool]}
            for r in state.routes.values()
        }
    )


def _describe(state: RouteTable, route: ModelRoute, replica: Replica) -> dict[str, Any]:
    """A replica's health and load, and its KV-event feed with the exact table it fills, if any."""
    feed = state.kv_feeds.get(route.model, replica.replica_id)
    if feed is None or route.router.exact is None:
        return replica.describe()
    return {**replica.describe(), "kv_events": {**feed.describe(), **route.router.exact.describe(replica.replica_id)}}


async def admin_usage(request: web.Request) -> web.Response:
    """Tokens, cost and cache savings per tenant and model over a window (`gateway.insights.token_costs`)."""
    query = UsageQuery.parse(request.query, time.time())
    return _json(await request.app[OPS].token_costs.report(query))


async def admin_prefix_report(request: web.Request) -> web.Response:
    """Families of prompts that diverge early and match after it: the cache they lose (`insights.prefix_report`)."""
    return _json(request.app[OPS].prefix_report.report(), headers=THIS_GATEWAYS_VIEW)


async def admin_decisions(request: web.Request) -> web.Response:
    """The latest routing decisions, newest first, each candidate's score (`observability.decision_log`); `?limit=`."""
    return _json({"decisions": request.app[OPS].decisions.latest(_limit(request))}, headers=THIS_GATEWAYS_VIEW)


async def admin_sessions(request: web.Request) -> web.Response:
    """The most recently active agent sessions, their totals (`gateway.insights.sessions`); `?limit=` (default 50)."""
    return _json({"sessions": request.app[OPS].sessions.recent(_limit(request))}, headers=THIS_GATEWAYS_VIEW)


def _limit(request: web.Request) -> int:
    text = request.query.get("limit", "50")
    if not text.isdigit() or int(text) < 1:
        raise BadRequestError(f"limit must be an integer >= 1, got {text!r}", param="limit")
    return int(text)


async def admin_session(request: web.Request) -> web.Response:
    """One session's requests in order, with their queue, TTFT, decode time and replica."""
    session_id = request.match_info["session_id"]
    found = request.app[OPS].sessions.get(session_id)
    if found is None:
        raise NotFoundError(
            f"no session {session_id!r} (unknown, or no longer among the recent ones on this gateway)",
            param="session_id",
        )
    return _json(found, headers=THIS_GATEWAYS_VIEW)


async def admin_explain(request: web.Request) -> web.Response:
    """Dry run: the decision a chat or completions body would get now, with every candidate's score."""
    state = request.app[OPS].state
    view = await read_view(
        request, "chat", state.config.limits, request[REQUEST_ID], session_header=state.config.headers.session
    )
    if "messages" not in view.body:
        view = dataclasses.replace(view, endpoint="completions")
    route = state.route_for(view.model)
    if route.model != view.model:  # keyed and filtered as the request itself would be
        named(view, route.model, state.adapters)
    candidates = route.pool.candidates(state.adapters.excluded(view, route, set()))
    if not candidates:
        raise NoReplicaError(f"no healthy replica for model {view.adapter or view.model!r}", retry_after_s=1.0)
    with state.using(route.router):
        return _json(await route.router.explain(view, candidates))


async def admin_reload(request: web.Request) -> web.Response:
    error = await reload(request.app)
    if error is not None:
        return web.Response(
            status=400,
            body=error_body(str(error), "ConfigError", 400, error.key or None),
            content_type="application/json",
        )
    return _json({"status": "reloaded", "models": sorted(request.app[OPS].state.routes)})


async def reload(app: web.Application) -> ConfigError | None:
    """Swap in the file's config atomically; a bad file keeps the running config and says why."""
    ops = app[OPS]
    try:
        config = await ops.state.reload()
    except ConfigError as exc:
        ops.metrics.reloads.labels("error").inc()
        log.error("config_reload_failed", error=str(exc), file=exc.file, key=exc.key)
        return exc
    ops.metrics.reloads.labels("ok").inc()
    log.info(
        "config_reloaded", models=sorted(config.pools), policies={m: p.routing.policy for m, p in config.pools.items()}
    )
    return None


def _json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json", headers=headers)


# The sessions, the prefix report and the decision log are what this gateway process saw (docs/SCALING.md:
# kept per gateway by choice); their answers say whose view they are, for a reader behind a load balancer.
VIEW_HEADER = "X-Gateway-View"
THIS_GATEWAYS_VIEW = {VIEW_HEADER: f"this gateway only: {socket.gethostname()} pid {os.getpid()}"}
