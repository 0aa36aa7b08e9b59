"""The running gateway's swappable state: the config and, per model, its replica pool and router.

A reload builds everything new *before* touching the running state, so a bad file changes nothing.
Requests in flight keep the router they started with (`using`); a replaced router, with its index's
Redis clients, subscription and tasks, is closed when the last of them ends. Pools keep their
replicas' counts and health.
A pool whose routing section is unchanged keeps its router, and with it its warm-prefix index.
A pool with `discovery` also holds the replicas its DNS name resolves to, or the Service's pods the
Kubernetes API lists (`gateway.discovery`); an unready pod stays in the pool, taking no traffic.
A replica with `kv_events` gets a subscriber feeding its router's exact tables; it follows
the router (a new router starts from a fresh feed) and goes with the replica.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import structlog
import zmq.asyncio

from gateway import prefix
from gateway.adapters import AdapterMap
from gateway.config import Config, DiscoveryConfig, PoolConfig, ReplicaConfig, RoutingConfig, load_config
from gateway.discovery import Discovery, Resolver, resolve_dns
from gateway.errors import ConfigError, NotFoundError
from gateway.index import build_index
from gateway.index.exact import ExactTables
from gateway.kv_events import KVEventsConfig, KVEventSubscriber
from gateway.log import setup_logging
from gateway.policies import build_policy
from gateway.replica_tokenizer import ReplicaTokenizer
from gateway.replicas import Replica, ReplicaPool
from gateway.routing import Router
from gateway.routing_metrics import RoutingMetrics
from gateway.tokenize import PromptKeys, build_prompt_tokenizer

log = structlog.get_logger("gateway.state")


@dataclass(slots=True)
class ModelRoute:
    """Everything needed to route one model's requests."""

    model: str
    pool: ReplicaPool
    router: Router
    routing: RoutingConfig


class GatewayState:
    def __init__(self, config: Config, config_path: str | Path | None, routing_metrics: RoutingMetrics) -> None:
        self.config = config
        self.config_path = str(config_path) if config_path is not None else None
        self.routes: dict[str, ModelRoute] = {}
        self.adapters = AdapterMap()  # LoRA adapters: their pools and the replicas serving each
        self._routing_metrics = routing_metrics
        self.resolver: Resolver = resolve_dns  # DNS discovery's resolver; replaceable before start()
        self._discovery: Discovery | None = None
        self._found: dict[str, list[ReplicaConfig]] = {}  # per model: the replicas DNS gave last
        # per (model, replica): its KV-event subscriber, the tables it feeds and the feed's config
        self._feeds: dict[tuple[str, str], tuple[KVEventSubscriber, ExactTables, KVEventsConfig]] = {}
        self._feed_watch: dict[tuple[str, str], tuple[bool, float | None]] = {}  # (healthy, completed) last seen
        self._forgetting: set[asyncio.Task[None]] = set()  # history drops of restarted replicas, in flight
        self._zmq: zmq.asyncio.Context | None = None  # one ZMQ I/O thread for every feed
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
        await asyncio.gather(*(feed.close() for feed, _, _ in self._feeds.values()))
        self._feeds.clear()
        if self._zmq is not None:
            self._zmq.destroy(linger=0)
            self._zmq = None
        await asyncio.gather(*(route.router.close() for route in self.routes.values()),
                             *(router.close() for router in self._retired))
        self._retired.clear()
        await asyncio.gather(*self._closing)

    @contextmanager
    def using(self, router: Router) -> Iterator[Router]:
        """Hold `router` for one request: a reload that replaces it closes it only after this."""
        self._users[router] = self._users.get(router, 0) + 1
        try:
            yield router
        finally:
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
        if route is None and (pool := self.adapters.pool_of.get(model)
                              or self.config.model_names.pool_for(model)) is not None:
            route = self.routes.get(pool)
        if route is None:
            known = ", ".join(sorted(self.routes))
            raise NotFoundError(f"The model `{model}` does not exist. Served models: {known}", param="model")
        return route

    def pools(self) -> Iterator[ReplicaPool]:
        return (route.pool for route in tuple(self.routes.values()))

    def after_scrape(self) -> None:
        self.sync_capacity()
        self.watch_feeds()
        self.adapters = AdapterMap.build(self.config, self.routes)

    def sync_capacity(self) -> None:
        """Size each replica's warm-prefix table like its KV cache, once the replica has told us."""
        for route in self.routes.values():
            for replica in route.pool:
                if replica.load.num_gpu_blocks and replica.load.block_size:
                    route.router.set_capacity(replica.replica_id, replica.load.num_gpu_blocks * replica.load.block_size)
                    route.router.block_size_seen(replica.replica_id, replica.load.block_size, "cache_config_info")

    def watch_feeds(self) -> None:
        """What a KV-event feed cannot see: the replica went down (its next life starts with an
        empty cache), or its engine counters went backwards (it restarted between two probes).
        Either way what the gateway believes it holds is dropped now, not at the new engine's
        first batch: its event table (the feed then replays the new history) and its routing
        history. A replica without a feed keeps its history through a blip; only a restart drops it."""
        for route in self.routes.values():
            feeds = self.feeds(route.model)
            for replica in route.pool:
                key = (route.model, replica.replica_id)
                was_healthy, last = self._feed_watch.get(key, (True, None))
                completed = replica.load.completed
                feed = feeds.get(replica.replica_id)
                reason = None
                if completed is not None and last is not None and completed < last:
                    reason = f"its engine counters went backwards (request_success_total {last:g} -> {completed:g})"
                elif feed is not None and was_healthy and not replica.healthy:
                    reason = "the replica went down"
                self._feed_watch[key] = (replica.healthy, last if completed is None else completed)
                if reason is None:
                    continue
                if feed is not None:
                    feed.restart(reason)
                else:
                    log.warning("replica_restarted", model=route.model, replica=replica.replica_id, reason=reason)
                task = asyncio.get_running_loop().create_task(route.router.index.forget(replica.replica_id))
                self._forgetting.add(task)
                task.add_done_callback(self._forgetting.discard)

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
            log.info("discovery_changed", model=model, source=pool_config.discovery.source, added=sorted(added),
                     removed=sorted(removed), replicas=len(route.pool))

    def _router_for(self, model: str, pool: PoolConfig, config: Config) -> Router:
        """Keep the running router when its routing section and store are unchanged, else build one."""
        current = self.routes.get(model)
        same_store = config.index.for_pool(model) == self.config.index.for_pool(model)  # resolved: sees a rotated file
        if current is not None and current.routing == pool.routing and same_store:
            return current.router
        key = f"pools.{model}.routing"
        policy = build_policy(pool.routing.policy, pool.routing.params, key)
        params = pool.routing.prefix
        index = build_index(config.index.for_pool(model))
        keys = exact = None
        if params.tokenizer is not None:
            tokenizer = (ReplicaTokenizer(model, lambda: self._urls(model)) if params.tokenizer == "replica"
                         else build_prompt_tokenizer(params.tokenizer, key=f"{key}.prefix.tokenizer"))
            keys = PromptKeys(tokenizer, budget_s=params.tokenize_budget_ms / 1000)
            if pool.has_kv_events:
                shared = config.index.resolved_store != "memory"  # other gateways read what the events say
                exact = ExactTables(prefix.model_seed(model), params.block, params.speculative_ttl_s,
                                    share=index.record if shared else None)
        return Router(policy, params, index, self._routing_metrics, pool=model, keys=keys, exact=exact)

    def _urls(self, model: str) -> list[str]:
        """The model's replicas taking traffic now (for the replicas' own /tokenize)."""
        route = self.routes.get(model)
        return [r.url for r in route.pool if r.is_available()] if route is not None else []

    async def _sync_feeds(self) -> None:
        """One subscriber per replica with `kv_events`, feeding its current router's exact tables."""
        wanted: dict[tuple[str, str], tuple[ExactTables, KVEventsConfig]] = {}
        for model, route in self.routes.items():
            exact = route.router.exact
            if exact is None:
                continue
            for replica in self._members(model, self.config.pools[model]):
                if replica.kv_events is not None:
                    wanted[(model, replica.replica_id)] = (exact, replica.kv_events)
        for key, (feed, exact, events) in list(self._feeds.items()):
            if wanted.get(key) != (exact, events):
                del self._feeds[key]
                await feed.close()
                exact.forget(key[1])
        for key, (exact, events) in wanted.items():
            if key not in self._feeds:
                self._zmq = self._zmq or zmq.asyncio.Context()
                feed = KVEventSubscriber(key[1], events, exact)
                feed.start(self._zmq)
                self._feeds[key] = (feed, exact, events)

    def feeds(self, model: str) -> dict[str, KVEventSubscriber]:
        """The model's KV-event subscribers by replica (for /admin/replicas)."""
        return {replica_id: feed for (m, replica_id), (feed, _, _) in self._feeds.items() if m == model}

    def all_feeds(self) -> Iterator[tuple[str, str, KVEventSubscriber, ExactTables]]:
        """(model, replica, subscriber, the tables it fills) for every feed (for /metrics)."""
        return ((model, replica_id, feed, exact) for (model, replica_id), (feed, exact, _) in list(self._feeds.items()))


def _discovery_specs(config: Config) -> dict[str, DiscoveryConfig]:
    return {model: pool.discovery for model, pool in config.pools.items() if pool.discovery is not None}
