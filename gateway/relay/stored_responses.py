"""Stored responses of the Responses API live on the replica that made them (vLLM keeps them in its
own memory), so every request that names one must reach that replica: a follow-up with
`previous_response_id`, and `GET /v1/responses/{id}`, `DELETE` and `POST …/cancel`.

The gateway learns each response's home from the answer on its way through (its `id` is read
together with its usage: no extra parsing) and keeps the newest MAX_HOMES; with a shared Redis (the
top-level `redis:`) it also hands the home to `gateway.relay.shared_homes`, off the request path, so
every gateway of the fleet can find it. A follow-up whose home this gateway does not know is looked up
before it is routed (`locate`): one Redis GET, and when Redis has no answer (down, or the other
gateway's write still in flight) each available replica of its pool is asked in turn with
`GET /v1/responses/{id}`. A follow-up goes to its home while the home can take it; otherwise it is
routed as usual (the replica answers vLLM's 404, as it would have anyway). A by-id request for an id
this gateway never saw asks each available replica of every pool in turn until one has it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import suppress
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from gateway.errors import NotFoundError, UpstreamError
from gateway.relay import headers as h
from gateway.relay.shared_homes import SharedHomes
from gateway.replicas import Replica
from gateway.replicas.backend_auth import set_upstream_auth
from gateway.request.exchange import FinishedRequest
from gateway.request.observers import RequestObserver
from gateway.routing.model_route import ModelRoute
from gateway.routing.route_table import RouteTable
from gateway.support.bounded import put_newest
from gateway.view import RequestView

if TYPE_CHECKING:
    from gateway.config.loader import Config

MAX_HOMES = 100_000
PROBE_TIMEOUT_S = 2.0  # per replica asked for a follow-up's home: a hung one must not hold the request long
BY_ID = (
    ("GET", "/v1/responses/{response_id}"),
    ("DELETE", "/v1/responses/{response_id}"),
    ("POST", "/v1/responses/{response_id}/cancel"),
)


def _uncounted(source: str) -> None:
    pass


class ResponseHomes(RequestObserver):
    """response id -> (pool, replica that stored it), newest last; bounded. It hears of each answer that
    stored a response. `counted(source)` hears where each follow-up's home was found: local, redis,
    replicas or unknown (a metric)."""

    def __init__(
        self, limit: int = MAX_HOMES, shared: SharedHomes | None = None, counted: Callable[[str], None] = _uncounted
    ) -> None:
        self._homes: dict[str, tuple[str, str]] = {}
        self._limit = limit
        self.shared = shared
        self._counted = counted

    @classmethod
    def attach(cls, app: web.Application, config: Config, counted: Callable[[str], None]) -> ResponseHomes:
        """One per app: the fleet's homes in the shared Redis where there is one (`redis`; a change needs a
        restart), its writer running with the app."""
        redis = config.redis
        shared = SharedHomes(redis.resolved_url, redis.key_prefix, redis.response_ttl_s) if redis is not None else None
        homes = cls(shared=shared, counted=counted)
        if shared is not None:
            app.cleanup_ctx.append(homes._running)
        return homes

    @property
    def asking_replicas(self) -> bool:
        """The shared homes are configured but Redis is unreachable: unknown homes are asked of the replicas."""
        return self.shared is not None and self.shared.degraded

    def finished(self, done: FinishedRequest) -> None:
        if done.usage.response_id is not None and done.replica_id is not None:
            self.remember(done.usage.response_id, done.model, done.replica_id)

    def remember(self, response_id: str, model: str, replica_id: str, *, share: bool = True) -> None:
        put_newest(self._homes, response_id, (model, replica_id), self._limit)
        if share and self.shared is not None:
            self.shared.put(response_id, (model, replica_id))

    def home(self, response_id: str) -> tuple[str, str] | None:
        return self._homes.get(response_id)

    async def locate(
        self,
        view: RequestView,
        route: ModelRoute,
        config: Config,
        session: aiohttp.ClientSession,
        headers: Mapping[str, str],
    ) -> None:
        """Before a follow-up is routed, learn its response's home if this gateway does not know it: from
        Redis (one GET), else by asking the pool's available replicas in turn. Costs nothing but a dict
        lookup for a home this gateway knows; the request path calls it for a follow-up only (`follows_up`)."""
        previous = _previous(view)
        if previous is None:
            return
        if previous in self._homes:
            self._counted("local")
            return
        home = await self.shared.get(previous) if self.shared is not None else None
        if home is not None:
            self._counted("redis")
            self.remember(previous, *home, share=False)
            return
        replica_id = await _ask_replicas(route, previous, config, session, headers)
        self._counted("replicas" if replica_id is not None else "unknown")
        if replica_id is not None:
            self.remember(previous, route.model, replica_id)

    async def _running(self, app: web.Application) -> AsyncIterator[None]:
        assert self.shared is not None
        task = asyncio.get_running_loop().create_task(self.shared.run(), name="response-homes-writer")
        yield
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task
        await self.shared.close()

    def excluded(self, view: RequestView, route: ModelRoute, exclude: set[str]) -> set[str]:
        """`exclude`, plus every replica but the home of the response a follow-up continues (while that
        home is in the pool and not already excluded)."""
        previous = _previous(view)
        home = self._homes.get(previous) if previous is not None else None
        if (
            home is None
            or home[0] != route.model
            or home[1] in exclude
            or not any(r.replica_id == home[1] and r.is_available() for r in route.pool)
        ):
            return exclude
        return exclude | {r.replica_id for r in route.pool if r.replica_id != home[1]}


def follows_up(view: RequestView) -> bool:
    """Does the request continue a stored response (a Responses API `previous_response_id`)? Only such a request
    needs `ResponseHomes.locate`."""
    return _previous(view) is not None


def _previous(view: RequestView) -> str | None:
    """The response a Responses API request continues, if it names one."""
    if view.endpoint != "responses":
        return None
    previous = view.body.get("previous_response_id")
    return previous if isinstance(previous, str) and previous else None


async def _ask_replicas(
    route: ModelRoute, response_id: str, config: Config, session: aiohttp.ClientSession, headers: Mapping[str, str]
) -> str | None:
    """The first available replica of the pool that has the response (`GET /v1/responses/{id}` answers
    200), asked one after another; None when none has it or none answers."""
    out = h.filtered(headers, h.REQUEST_DROP)
    for name in ("Content-Length", "Content-Type", "Content-Encoding", "Transfer-Encoding"):
        out.popall(name, None)
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S, sock_connect=config.timeouts.connect_s)
    for replica in [r for r in route.pool if r.is_available()]:
        asked = CIMultiDict(out)
        set_upstream_auth(asked, config.backend_key(route.model, replica.replica_id), config.auth.enabled)
        try:
            async with session.get(
                f"{replica.url}/v1/responses/{response_id}", headers=asked, timeout=timeout, allow_redirects=False
            ) as answer:
                await answer.read()
                if answer.status == 200:
                    return replica.replica_id
        except (aiohttp.ClientError, TimeoutError):
            continue
    return None


def add_by_id_routes(
    app: web.Application,
    homes: ResponseHomes,
    state: Callable[[], RouteTable],
    session: Callable[[], aiohttp.ClientSession],
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await _by_id(request, homes, state(), session())

    for method, path in BY_ID:
        app.router.add_route(method, path, handler)


async def _by_id(
    request: web.Request, homes: ResponseHomes, state: RouteTable, session: aiohttp.ClientSession
) -> web.StreamResponse:
    """The home first if known, else every available replica in turn; the first answer that is not
    a 404 is relayed as it comes (a `?stream=true` retrieval streams)."""
    response_id = request.match_info["response_id"]
    home = homes.home(response_id)
    tries = [(model, r) for model, route in state.routes.items() for r in route.pool if r.is_available()]
    if home is not None:
        tries.sort(key=lambda t: (t[0], t[1].replica_id) != home)  # stable: the home first, the rest after
    body = await request.read()
    failed = None
    for model, replica in tries:
        try:
            answer = await _send(request, body, model, replica, state, session)
        except aiohttp.ClientError as exc:
            failed = UpstreamError(f"replica {replica.replica_id} failed: {type(exc).__name__}")
            continue
        if answer is not None:
            homes.remember(response_id, model, replica.replica_id)
            return answer
    if failed is not None:
        raise failed
    raise NotFoundError(f"Response with id '{response_id}' not found.", param="response_id")


async def _send(
    request: web.Request, body: bytes, model: str, replica: Replica, state: RouteTable, session: aiohttp.ClientSession
) -> web.StreamResponse | None:
    """One replica's answer relayed, or None when it does not have the response (404)."""
    config = state.config
    out = h.filtered(request.headers, h.REQUEST_DROP)
    set_upstream_auth(out, config.backend_key(model, replica.replica_id), config.auth.enabled)
    timeout = aiohttp.ClientTimeout(sock_connect=config.timeouts.connect_s, sock_read=config.timeouts.idle_s)
    async with session.request(
        request.method,
        replica.url + request.path_qs,
        data=body or None,
        headers=out,
        timeout=timeout,
        allow_redirects=False,
    ) as upstream:
        if upstream.status == 404:
            return None
        back = h.filtered(upstream.headers, h.response_drop(config.headers))
        back[h.REPLICA_ID] = replica.replica_id
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=back)
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
        except aiohttp.ClientError:  # bytes reached the client: it sees the answer end short, nothing else
            return response
        await response.write_eof()
        return response
