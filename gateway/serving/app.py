"""The aiohttp app: routes, auth, error shapes, lifecycles; the request's story in `_proxied`, its attempt
loop in `gateway.serving.attempts` (the gateway's own routes, /health to /admin, are in `gateway.admin.ops_routes`).

Usage:
    app = make_app(load_config("config.yaml"), config_path="config.yaml")
    serve(app, config)          # gateway.serving.lifecycle: uvloop when importable, graceful SIGTERM
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path

import aiohttp
import structlog
from aiohttp import web

from gateway.admin.dashboard import DASHBOARD_PATHS, add_dashboard_routes
from gateway.admin.ops_routes import OpsParts, add_ops_routes, reload
from gateway.config.loader import Config
from gateway.config.pools import StreamChunkingConfig
from gateway.edge.auth import OPEN_PATHS, authenticate
from gateway.edge.limits import check_prompt, estimate_prompt, read_view
from gateway.edge.rate_limits import RateLimits
from gateway.edge.routes import add_model_routes
from gateway.edge.shared_quota import SharedQuota
from gateway.errors import ConfigError, GatewayError, RateLimitError, error_body, http_error_body
from gateway.insights.prefix_report import PrefixReport
from gateway.insights.sessions import Sessions
from gateway.insights.token_costs import TokenCosts
from gateway.observability.decision_log import DecisionLog
from gateway.observability.metrics import Metrics
from gateway.observability.request_log import RequestLog
from gateway.observability.request_metrics import RequestMetrics
from gateway.observability.tracing import Tracing
from gateway.relay import headers as h
from gateway.relay.phrase_chunking import chunking_for
from gateway.relay.proxy import CLIENT_CLOSED, Proxy
from gateway.relay.stored_responses import ResponseHomes, add_by_id_routes, follows_up
from gateway.relay.stream_usage import ask_for_usage
from gateway.replicas import Monitor, shared_monitor
from gateway.request.exchange import Exchange
from gateway.request.keys import CALLER, REQUEST_ID
from gateway.request.observers import Observers
from gateway.routing.adapters import named
from gateway.routing.feedback import AnswerRecords, RoutingFeedback
from gateway.routing.model_route import ModelRoute
from gateway.routing.route_table import RouteTable
from gateway.serving import attempts
from gateway.serving.admission import Admission
from gateway.serving.app_keys import (
    ADMISSION,
    DECISIONS,
    FOLLOWER,
    HOMES,
    METRICS,
    MONITOR,
    OBSERVERS,
    PREFIX_REPORT,
    PROXY,
    RATE_LIMITS,
    ROUTE_TABLE,
    SESSIONS,
    TOKEN_COSTS,
    TRACING,
)
from gateway.serving.lifecycle import LIFECYCLE, Lifecycle
from gateway.view import RequestView

log = structlog.get_logger("gateway.serving.app")
_NO_CHUNKING = StreamChunkingConfig()  # the bounds of a request no pool serves: made once, not per request


def make_app(config: Config, config_path: str | Path | None = None, *, handle_sighup: bool = False) -> web.Application:
    app = web.Application(middlewares=[edge_middleware])  # limits: read_view, live config
    app[METRICS] = registry = Metrics()
    app[ROUTE_TABLE] = state = RouteTable(config, config_path, registry.routing)
    registry.watch(state.pools)
    registry.watch_feeds(state.kv_feeds.all)
    app[ADMISSION] = Admission(
        lambda model, waited_s: registry.queue_wait.labels(model).observe(waited_s),
        lambda model, tenant: registry.admission_borrowed.labels(model, tenant).inc(),
    )
    app[RATE_LIMITS] = RateLimits(
        SharedQuota.for_config(config),  # the fleet's quota where Redis is
        config.auth.rate_limit_window_s,
    )
    app[LIFECYCLE] = Lifecycle()
    app[TOKEN_COSTS] = TokenCosts.attach(app, config, registry.registry)  # per tenant and model, shared via Redis
    app[TRACING] = Tracing(config.tracing) if config.tracing.enabled else None  # read at start only
    app[SESSIONS] = Sessions.attach(app, config.sessions, registry.registry)  # agent timelines, sized at start
    app[PREFIX_REPORT] = PrefixReport.attach(app, config.prefix_report, lambda: state.config.logging.prompts)
    app[DECISIONS] = DecisionLog()  # the latest decisions, for the dashboard
    app[HOMES] = ResponseHomes.attach(  # stored responses, by id, to the replica that has them; shared via Redis
        app, config, lambda source: registry.response_homes.labels(source).inc()
    )
    app[OBSERVERS] = _observers(app)
    app.cleanup_ctx.append(_upstream_ctx)
    if handle_sighup:
        app.cleanup_ctx.append(_sighup_ctx)
    # every vLLM route, by the body's model; `_proxied` is the handler itself (no wrapper coroutine per request)
    add_model_routes(app, lambda endpoint: partial(_proxied, endpoint=endpoint), config.routes)
    add_by_id_routes(app, app[HOMES], lambda: app[ROUTE_TABLE], lambda: app[PROXY].session)
    add_ops_routes(
        app,
        OpsParts(  # /v1/models, /health, /ready, /metrics, /admin/*
            state,
            registry,
            app[TOKEN_COSTS],
            app[PREFIX_REPORT],
            app[DECISIONS],
            app[SESSIONS],
            app[ADMISSION].waiting,
            lambda: app[LIFECYCLE].draining,
            lambda: app[RATE_LIMITS].local_only,
            lambda: app[HOMES].asking_replicas,
            app[ADMISSION].tenants_waiting,
        ),
    )
    add_dashboard_routes(app)  # /dashboard: one page over the admin routes
    return app


def _observers(app: web.Application) -> Observers:
    """Who hears of every request, in this order: the router first (the learned costs the prefix report
    reads are updated by then), and what later requests read (stored responses' homes, rate-limit
    accounts) as the request ends; the tracing span ends then too, its clock and context the request's.
    The answer's record as its conversation's next prefix, the request's metrics, log event and insights
    hear of it in a batch once the answer has gone (`gateway.request.observers`), its log event carrying
    its trace id. A feature of its own adds itself with `app[OBSERVERS].add(...)`."""
    observers = Observers()
    for observer in (RoutingFeedback(), app[HOMES], app[RATE_LIMITS], app[TRACING]):
        if observer is not None:  # tracing off: no tracing observer
            observers.add(observer)
    for batched in (
        AnswerRecords(),
        RequestMetrics(app[METRICS]),
        app[TOKEN_COSTS],
        app[DECISIONS],
        app[SESSIONS],
        app[PREFIX_REPORT],
        RequestLog(),
    ):
        observers.add(batched, batched=True)
    return observers


async def _proxied(request: web.Request, endpoint: str) -> web.StreamResponse:
    """The request's story, top to bottom (its caller is authenticated already: `edge_middleware`)."""
    started = time.perf_counter()
    app, caller = request.app, request[CALLER]
    state = app[ROUTE_TABLE]
    config = state.config
    view = await read_view(
        request, endpoint, config.limits, request[REQUEST_ID], caller.tenant, config.headers.session
    )  # parsed once
    route = _resolved(view, state)
    observers = app[OBSERVERS]
    exchange = Exchange(view, route.router, observers.first_byte, started)
    _stream_options(request, view, route, exchange, config)
    with state.using(route.router):  # a reload closes this router only once the request is done
        await _within_limits(request, view, route, config)
        if follows_up(view):  # its stored response's home, before it is routed
            await app[HOMES].locate(view, route, config, app[PROXY].session, request.headers)
        _instrumented(route, exchange, request)
        try:  # decide (admission, router) → commit → attempt → on a retryable failure undo, decide again → relay
            return await attempts.answer(request, view, route, exchange, config)
        except BaseException as exc:
            _failed(app, view, exchange, exc)
            raise
        finally:  # every observer hears of it, once
            observers.finished(exchange.finished(config, route.model, route.routing, caller))


def _resolved(view: RequestView, state: RouteTable) -> ModelRoute:
    """The route of the body's model; an alias, a pattern or the default pool renames the view to its pool
    (an adapter keeps its name)."""
    route = state.route_for(view.model)
    if route.model != view.model:
        named(view, route.model, state.adapters)
    return route


def _stream_options(
    request: web.Request, view: RequestView, route: ModelRoute, exchange: Exchange, config: Config
) -> None:
    """How the answer is relayed: chunked in phrases if asked, and the usage event stripped when the gateway
    asked for it for the accounts."""
    pool = config.pools.get(route.model)
    exchange.chunking = chunking_for(
        view,
        request.headers.get(h.STREAM_CHUNKING),
        pool.stream_chunking if pool is not None else _NO_CHUNKING,
    )
    exchange.strip_usage = pool is not None and pool.stream_usage and ask_for_usage(view)


async def _within_limits(request: web.Request, view: RequestView, route: ModelRoute, config: Config) -> None:
    """The prompt's size limits, then the caller's rate limits; a refusal is counted here and reaches no
    observer (nothing was routed)."""
    app, caller = request.app, request[CALLER]
    try:
        check_prompt(view, route.routing.prefix, config.limits)
        if caller.key is not None and (caller.key.requests_per_minute or caller.key.tokens_per_minute):
            await app[RATE_LIMITS].admit(caller.key, estimate_prompt(view, route.routing.prefix))
    except GatewayError as exc:
        app[METRICS].rejected.labels(view.model, "rate_limit" if exc.status == 429 else "limit").inc()
        if caller.key is not None:
            app[METRICS].tenant_requests.labels(caller.key.tenant, str(exc.status)).inc()
        raise


def _instrumented(route: ModelRoute, exchange: Exchange, request: web.Request) -> None:
    """Answer texts are kept for a router that records them; the request's trace starts (from here on every
    log event of the request carries its trace_id)."""
    if route.router.records_answers:
        exchange.usage.answer = []
    if (tracing := request.app[TRACING]) is not None:
        exchange.trace = tracing.request(request, exchange.view, exchange.started)


def _failed(app: web.Application, view: RequestView, exchange: Exchange, exc: BaseException) -> None:
    """The status and error a request that got no answer ends with, for the observers."""
    if isinstance(exc, GatewayError):
        exchange.status, exchange.error = exc.status, exc.message
        if isinstance(exc, RateLimitError):  # the admission queue's: full, or waited too long
            app[METRICS].rejected.labels(view.model, "queue").inc()
    elif isinstance(exc, asyncio.CancelledError):
        exchange.status, exchange.error = CLIENT_CLOSED, "client disconnected"
    elif isinstance(exc, Exception):
        exchange.status, exchange.error = 500, f"internal error: {type(exc).__name__}"


# The dashboard's page and assets hold no data; the monitor's findings are answered on a worker's private
# socket only (gateway.serving.workers), 404 on the public port.
_OPEN_PATHS = OPEN_PATHS | DASHBOARD_PATHS | {shared_monitor.PATH}


@web.middleware
async def edge_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The only middleware (one layer, not one per concern: it wraps every request): the request's id, who is
    calling, before anything else is read (the key itself goes no further than this), and every failure as
    an OpenAI-shape error; unexpected ones are logged as 500s."""
    request[REQUEST_ID] = request_id = h.request_id(request.headers.get(h.REQUEST_ID))
    try:
        request[CALLER] = authenticate(request.app[ROUTE_TABLE].config.auth, request.path, request.headers, _OPEN_PATHS)
        return await handler(request)
    except GatewayError as exc:
        if exc.status in (401, 403):
            request.app[METRICS].rejected.labels("", "auth").inc()
        config = request.app[ROUTE_TABLE].config
        hide = None if exc.status < 500 or config.headers.replica_id else _replica_names(config)
        return _error(request, exc.status, exc.body(hide), exc.headers())
    except web.HTTPException as exc:  # aiohttp's own: unknown route, wrong method, body over client_max_size
        if exc.status < 400:
            raise
        return _error(request, exc.status, http_error_body(exc.status, exc.reason), {})
    except Exception:
        log.exception("unhandled_error", request_id=request_id, path=request.path)
        return _error(request, 500, error_body("internal gateway error", "InternalServerError", 500), {})


def _replica_names(config: Config) -> Iterator[str]:
    """Every configured replica's id and URL, hidden from error bodies with `headers.replica_id` off (a
    discovered replica is named by its address, which is hidden as any address is)."""
    for pool in config.pools.values():
        for replica in pool.replicas:
            yield replica.replica_id
            yield replica.url


def _error(request: web.Request, status: int, body: bytes, headers: dict[str, str]) -> web.Response:
    """An error answer; with `Connection: close` when the body was not read to its end (an oversized or
    unauthenticated one), as the rest of it would otherwise be read as the connection's next request."""
    response = web.Response(
        status=status,
        body=body,
        headers={**headers, "Content-Type": "application/json", h.REQUEST_ID: request[REQUEST_ID]},
    )
    if not request.content.is_eof():
        response.force_close()
    return response


async def _upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    """One shared ClientSession for the app's life; the monitor's tasks start and stop with it."""
    config = app[ROUTE_TABLE].config
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, enable_cleanup_closed=False),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=config.timeouts.connect_s),
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
        cookie_jar=aiohttp.DummyCookieJar(),  # a replica's Set-Cookie goes to its client, never to other requests
    )
    metrics = app[METRICS]
    app[PROXY] = Proxy(
        session,
        lambda replica_id, kind: metrics.upstream_errors.labels(replica_id, kind).inc(),
        metrics.poison_requests.inc,
    )
    state = app[ROUTE_TABLE]
    await state.start()
    app[LIFECYCLE].cut_streams = partial(app[PROXY].watches.cut, "shutdown")
    app[MONITOR] = monitor = Monitor(
        session,
        state.pools,
        lambda: state.config,
        after_scrape=state.after_scrape,
        on_ejected=partial(app[PROXY].watches.cut, "ejected", "replica ejected by its health probes"),
        follower=app.get(FOLLOWER),
    )
    monitor.start()
    yield
    app[OBSERVERS].flush()  # the last requests' batch, should the loop not have turned since they ended
    await monitor.stop()
    await state.close()
    await app[PROXY].close()
    await session.close()
    if (tracing := app[TRACING]) is not None:
        await asyncio.to_thread(tracing.shutdown)  # flushing to a slow collector must not stall the loop
    if (shared := app[RATE_LIMITS].shared) is not None:
        await shared.close()


async def _sighup_ctx(app: web.Application) -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[ConfigError | None]] = set()  # the loop keeps only weak references to tasks

    def on_sighup() -> None:
        task = loop.create_task(reload(app))
        pending.add(task)
        task.add_done_callback(pending.discard)

    loop.add_signal_handler(signal.SIGHUP, on_sighup)
    yield
    loop.remove_signal_handler(signal.SIGHUP)
    await asyncio.gather(*pending, return_exceptions=True)
