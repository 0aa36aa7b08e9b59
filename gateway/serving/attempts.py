"""The attempt loop of one request: decide (a free slot, then the router), commit the decision once its
slot is held, attempt, and on a retryable failure decide again, never on a replica already tried;
`gateway.relay.proxy` makes each attempt and its relay.

Only a committed decision reaches the router's bookkeeping (warm prefixes, queued prefill, the
prediction): a client that leaves between deciding and holding the slot leaves nothing behind.

Retries happen only before the first byte reaches the client, at most `limits.max_retries` of them. A
retried failure the input may cause (reset, silence, 5xx: `proxy.input_may_cause`) is charged to its
replica's breaker only once the request ends without proving poison (a second replica failing it so:
then none is); docs/RELIABILITY.md has the whole table. A pool in panic (no replica available: every
one is offered, `gateway.replicas.pool`) whose replica refuses the connection still answers 503.
"""

from __future__ import annotations

import time
from functools import partial

from aiohttp import web

from gateway.config.loader import Config
from gateway.errors import GatewayError, NoReplicaError
from gateway.relay.attempt import Attempt, Retryable, input_may_cause
from gateway.replicas import Replica
from gateway.request.decision import Decision
from gateway.request.exchange import Exchange
from gateway.request.keys import CALLER
from gateway.routing.model_route import ModelRoute
from gateway.serving.admission import share_of
from gateway.serving.app_keys import ADMISSION, HOMES, OBSERVERS, PROXY, ROUTE_TABLE
from gateway.serving.fair_queue import Share
from gateway.support.cancel import raise_lost_cancel
from gateway.view import RequestView


async def answer(
    request: web.Request, view: RequestView, route: ModelRoute, exchange: Exchange, config: Config
) -> web.StreamResponse:
    """The client's answer from the first replica that gives one; `NoReplicaError` (or the last attempt's
    error) when none is left."""
    app = request.app
    proxy, queue = app[PROXY], app[ADMISSION].queue(route)
    share = share_of(request[CALLER].key, config.admission)  # the caller's tenant: its cap, weight and line
    failure: GatewayError | None = None  # the last attempt's; built only when there is one (no error per request)
    deferred: list[tuple[Replica, str, str]] = []  # retried input-caused failures, charged unless it is poison
    try:
        for number in range(config.limits.max_retries + 1):
            chosen = await _decide(app, view, route, exchange, config, share)
            if chosen is None:
                break
            replica, decision = chosen
            raise_lost_cancel()  # the client left during routing and a library's wait_for dropped it
            attempt = Attempt(
                replica,
                route.pool,
                decision,
                after_fault=bool(deferred),
                final=number == config.limits.max_retries,
                others_left=partial(_others_left, app, view, route, exchange, replica.replica_id),
            )
            with queue.holding(replica, share):  # its release lets the pool's next waiting request in
                route.router.dispatched(view, decision)  # commit: the slot is held, the request is sent next
                exchange.decision, exchange.replica_id = decision, replica.replica_id  # router.finished undoes it
                exchange.usage.bound(replica.model_card.get("max_model_len"), view.body)
                try:
                    return await proxy.attempt(request, view, attempt, exchange, config)
                except Retryable as exc:
                    failure = (
                        exc.error
                        if exc.kind != "connect" or not route.pool.panic
                        else NoReplicaError(
                            f"no healthy replica for model {view.adapter or view.model!r} ({exc.error.message})",
                            retry_after_s=1,
                        )
                    )  # every replica ejected, and the one tried took no connection
                    exchange.failed_replicas.append(replica.replica_id)
                    route.router.failed(view, replica.replica_id)  # undo the commit: it never ran there
                    app[OBSERVERS].attempt_failed(exchange, replica.replica_id, exc.kind, exc.error.message)
                    if attempt.after_fault and input_may_cause(exc.kind):
                        raise proxy.poisoned(view, replica, exc, exchange) from None
                    if proxy.attempt_failed(attempt, exc, config):
                        deferred.append((replica, exc.kind, exc.error.message))
        raise failure or NoReplicaError(f"no healthy replica for model {view.adapter or view.model!r}", retry_after_s=1)
    finally:
        if not exchange.poison:
            for replica, kind, message in deferred:
                proxy.charge(route.pool, replica, kind, message, config)


async def _decide(
    app: web.Application, view: RequestView, route: ModelRoute, exchange: Exchange, config: Config, share: Share
) -> tuple[Replica, Decision] | None:
    """Admission (a replica with a free slot, waiting in the tenant's line of the pool for one) and the router's
    decision among those not yet tried; None when no healthy one is left. The wait counts as the request's queue
    time."""
    waiting = time.perf_counter()
    try:
        return await app[ADMISSION].choose(
            route,
            view,
            _narrowed(app, view, route, set(exchange.failed_replicas)),
            config.admission,
            exchange.trace,
            share,
        )
    finally:
        exchange.queue_s += time.perf_counter() - waiting


def _others_left(app: web.Application, view: RequestView, route: ModelRoute, exchange: Exchange, tried: str) -> bool:
    """Whether a retry of this request would find a replica it has not tried (`Attempt.last`)."""
    return route.pool.has_candidate(_narrowed(app, view, route, {*exchange.failed_replicas, tried}))


def _narrowed(app: web.Application, view: RequestView, route: ModelRoute, exclude: set[str]) -> set[str]:
    """`exclude`, with the replicas this request may never use: an adapter's non-servers, a follow-up's
    non-homes (what tells the last attempt, whose 5xx is the client's answer, from a retry)."""
    return app[ROUTE_TABLE].adapters.excluded(view, route, app[HOMES].excluded(view, route, exclude))
