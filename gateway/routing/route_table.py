"""The route table: the running config and, per model, its replica pool and router; and its reload.

A reload builds everything new *before* touching the running state, so a bad file changes nothing.
Requests in flight keep the router they started with (`using`); a replaced router, with its index's
Redis clients, subscription and tasks, is closed when the last of them ends. Pools keep their
replicas' counts and health.
A pool whose routing section is unchanged keeps its router, and with it its warm-prefix index.
A pool with `discovery` also holds the replicas its DNS name resolves to, or the Service's pods the
Kubernetes API lists (`gateway.replicas.discovery.dns`); an unready pod stays in the pool, taking no traffic.
Two jobs around the table live apart, so this module is only about what is routed to: how a
router is built (`gateway.routing.build`), and the KV-event feeds filling the routers' exact tables
(`gateway.routing.kv_feeds`), which the table re-syncs whenever its replicas or routers change.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import structlog

from gateway.config.loader import Config, load_config
from gateway.config.pools import DiscoveryConfig, PoolConfig, ReplicaConfig
from gateway.errors import ConfigError, NotFoundError
from gateway.log import setup_logging
from gateway.observability.routing_metrics import RoutingMetrics
from gateway.replicas import Replica, ReplicaPool
from gateway.replicas.discovery.dns import Discovery, Resolver, resolve_dns
from gateway.routing.adapters import AdapterMap
from gateway.routing.build import build_router
from gateway.routing.kv_feeds import KVFeeds
from gateway.routing.model_route import ModelRoute
from gateway.routing.router import Router

log = structlog.get_logger("gateway.routing.route_table")


class Using:
    """A request's hold on a router (`RouteTable.using`); a class, as every request enters one."""

    __slots__ = ("_table", "_router")

    def __init__(self, table: RouteTable, router: Router) -> None:
        self._table, self._router = table, router

    def __enter__(self) -> Router:
        self._table._use(self._router)
        return self._router

    def __exit__(self, *exc: object) -> None:
        self._table._done_with(self._router)


class RouteTable:
    def __init__(self, config: Config, config_path: str | Path | None, routing_metrics: RoutingMetrics) -> None:
        self.config = config
        self.config_path = str(config_path) if config_path is not None else None
        self.routes: dict[str, ModelRoute] = {}
        self.adapters = AdapterMap()  # LoRA adapters: their pools and the replicas serving each
        self._routing_metrics = routing_metrics
        self.resolver: Resolver = resolve_dns  # DNS discovery's resolver; replaceable before start()
        self._discovery: Discovery | None = None
        self._found: dict[str, list[ReplicaConfig]] = {}  # per model: the replicas DNS gave last
        self.kv_feeds = KVFeeds()  # the replicas' KV-event subscribers, following this table
        self._users: dict[Router, int] = {}  # requests routing with each router now
        self._retired: set[Router] = set()  # replaced by a reload, still used by requests in flight
        self._closing: set[asyncio.Task[None]] = set()  # retired routers being closed

    async def start(self) -> None:
        """Build pools and routers inside the running loop (a Redis index needs one), then discover."""
        self._install(self.config)
        self._discovery = Discovery(self.resolver, self._discovered)
        self._discovery.sync(_discovery_specs(self.config))
        await self._discovery.resolved(timeout_s=5.0)
        await self._sync_feeds()

    async def close(self) -> None:
        if self._discovery is not None:
            await self._discovery.close()
        await self.kv_feeds.close()
        await asyncio.gather(
            *(route.router.close() for route in self.routes.values()), *(router.close() for router in self._retired)
        )
        self._retired.clear()
        await asyncio.gather(*self._closing)

    def using(self, router: Router) -> Using:
        """Hold `router` for one request (`with state.using(router):`): a reload that replaces it closes it only
        after this."""
        return Using(self, router)

    def _use(self, router: Router) -> None:
        self._users[router] = self._users.get(router, 0) + 1

    def _done_with(self, router: Router) -> None:
        self._users[router] -= 1
        if not self._users[router]:
            del self._users[router]
            if router in self._retired:
                self._retired.discard(router)
                self._close_later(router)

    async def _retire(self, router: Router) -> None:
        """Close a replaced router now, or when the last request using it ends."""
        if router in self._users:
            self._retired.add(router)
        else:
            await router.close()

    def _close_later(self, router: Router) -> None:
        task = asyncio.get_running_loop().create_task(router.close(), name="router-close")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def route_for(self, model: str) -> ModelRoute:
        """The pool `model` names: its own name, an alias, an adapter, a pattern or the default pool."""
        route = self.routes.get(model)
        if (
            route is None
            and (pool := self.adapters.pool_of.get(model) or self.config.model_names.pool_for(model)) is not None
        ):
            route = self.routes.get(pool)
        if route is None:
            known = ", ".join(sorted(self.routes))
            raise NotFoundError(f"The model `{model}` does not exist. Served models: {known}", param="model")
        return route

    def pools(self) -> Iterator[ReplicaPool]:
        return (route.pool for route in tuple(self.routes.values()))

    def after_scrape(self) -> None:
        self.sync_capacity()
        for route in self.routes.values():
            self.kv_feeds.watch(route.model, route.pool, route.router)
        self.adapters = AdapterMap.build(self.config, self.routes)

    def sync_capacity(self) -> None:
        """Size each replica's warm-prefix table like its KV cache, once the replica has told us
        (`vllm:cache_config_info`), and its KV-event table to as many blocks: a publisher naming more
        blocks than its cache holds is lying, and its table must not grow with the lie."""
        for route in self.routes.values():
            exact = route.router.exact
            for replica in route.pool:
                load, calibration = replica.load, route.router.calibration
                if load.num_gpu_blocks and load.block_size:
                    calibration.set_capacity(replica.replica_id, load.num_gpu_blocks * load.block_size)
                    calibration.block_size_seen(replica.replica_id, load.block_size, "cache_config_info")
                if exact is not None and load.num_gpu_blocks:
                    exact.set_capacity(replica.replica_id, load.num_gpu_blocks)

    async def reload(self) -> Config:
        """Re-read the config file; on any ConfigError the running state is untouched (the error propagates)."""
        if self.config_path is None:
            raise ConfigError("this gateway was started without a config file (serve --replica): nothing to reload")
        config = await asyncio.to_thread(load_config, self.config_path, os.environ)
        if config.listen != self.config.listen:
            log.warning("config_listen_changed", detail="the listen address changes only on restart")
        retired, removed = self._install(config)
        for route in self.routes.values():
            for replica_id in removed.get(route.model, ()):
                await route.router.removed(replica_id)
        await asyncio.gather(*(self._retire(router) for router in retired))
        await self._sync_feeds()
        if self._discovery is not None:
            self._discovery.sync(_discovery_specs(config))
        setup_logging(config.logging.level, config.logging.format)
        return config

    def _install(self, config: Config) -> tuple[list[Router], dict[str, set[str]]]:
        """Build new routers first (may raise), then swap; returns retired routers and removed replicas."""
        routers = {model: self._router_for(model, pool, config) for model, pool in config.pools.items()}
        retired = [r.router for m, r in self.routes.items() if routers.get(m) is not r.router]
        routes: dict[str, ModelRoute] = {}
        removed: dict[str, set[str]] = {}
        self._found = {m: found for m, found in self._found.items() if m in _discovery_specs(config)}
        for model, pool_config in config.pools.items():
            replicas = [Replica.from_config(r) for r in self._members(model, pool_config)]
            pool = self.routes[model].pool if model in self.routes else ReplicaPool(model)
            removed[model] = {r.replica_id for r in pool} - {r.replica_id for r in replicas}
            pool.replace(replicas)
            routes[model] = ModelRoute(model, pool, routers[model], pool_config.routing)
        self.routes, self.config = routes, config
        self.adapters = AdapterMap.build(config, routes)
        return retired, removed

    def _members(self, model: str, pool: PoolConfig) -> list[ReplicaConfig]:
        """The static replicas, then the discovered ones (a static entry wins a name clash)."""
        static = {r.replica_id for r in pool.replicas}
        return [*pool.replicas, *(r for r in self._found.get(model, ()) if r.replica_id not in static)]

    async def _discovered(self, model: str, found: list[ReplicaConfig], unready: frozenset[str]) -> None:
        """Discovery answered for `model`: add new replicas, remove gone ones and forget their warm
        prefixes; an unready one stays (its warm prefixes with it) but takes no traffic until ready."""
        route, pool_config = self.routes.get(model), self.config.pools.get(model)
        if route is None or pool_config is None or pool_config.discovery is None:
            return
        self._found[model] = found
        wanted = self._members(model, pool_config)
        before = {r.replica_id for r in route.pool}
        route.pool.replace(Replica.from_config(r) for r in wanted)
        for replica in route.pool:
            replica.ready = replica.replica_id not in unready
        self.adapters = AdapterMap.build(self.config, self.routes)
        added = {r.replica_id for r in wanted} - before
        removed = before - {r.replica_id for r in wanted}
        for replica_id in removed:
            await route.router.removed(replica_id)
        await self._sync_feeds()
        if added or removed:
            log.info(
                "discovery_changed",
                model=model,
                source=pool_config.discovery.source,
                added=sorted(added),
                removed=sorted(removed),
                replicas=len(route.pool),
            )

    def _router_for(self, model: str, pool: PoolConfig, config: Config) -> Router:
        """Keep the running router when its routing section and store are unchanged, else build one."""
        current = self.routes.get(model)
        same_store = config.index_store(model) == self.config.index_store(model)  # resolved: sees a rotated file
        if current is not None and current.routing == pool.routing and same_store:
            return current.router
        return build_router(model, pool, config, self._routing_metrics, lambda: self._urls(model))

    def _urls(self, model: str) -> list[str]:
        """The model's replicas taking traffic now (for the replicas' own /tokenize)."""
        route = self.routes.get(model)
        return [r.url for r in route.pool if r.is_available()] if route is not None else []

    async def _sync_feeds(self) -> None:
        """Feeds follow the table: its current routers, and every member replica with `kv_events`."""
        await self.kv_feeds.sync(
            {model: route.router for model, route in self.routes.items()},
            lambda model: self._members(model, self.config.pools[model]),
        )


def _discovery_specs(config: Config) -> dict[str, DiscoveryConfig]:
    return {model: pool.discovery for model, pool in config.pools.items() if pool.discovery is not None}
