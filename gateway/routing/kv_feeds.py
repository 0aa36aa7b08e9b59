"""The running gateway's KV-event feeds: one subscriber per replica with `kv_events`.

Each feed fills its router's exact tables (`gateway.index.exact`). A feed follows the router: a
router rebuilt by a reload starts from a fresh feed, and a removed replica's feed goes with it.
All feeds share one ZMQ I/O thread. Between scrapes, `watch` sees what a feed cannot: a replica
that went down or restarted. The route table (`gateway.routing.route_table`) says which replicas want feeds.
Under `serve --workers N`, `sharing` (set before start) makes worker 0's feeds the only subscribers to the
replicas and the other workers' feeds read worker 0's (`gateway.index.kv_events.relay`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Mapping

import structlog
import zmq.asyncio

from gateway.config.pools import KVEventsConfig, ReplicaConfig
from gateway.index.exact import ExactTables
from gateway.index.kv_events.relay import Sharing
from gateway.index.kv_events.subscriber import KVEventSubscriber
from gateway.replicas import ReplicaPool
from gateway.routing.router import Router

log = structlog.get_logger("gateway.routing.kv_feeds")


class KVFeeds:
    def __init__(self) -> None:
        # per (model, replica): its KV-event subscriber, the tables it feeds and the feed's config
        self._feeds: dict[tuple[str, str], tuple[KVEventSubscriber, ExactTables, KVEventsConfig]] = {}
        self._watch: dict[tuple[str, str], tuple[bool, float | None]] = {}  # (healthy, completed) last seen
        self._forgetting: set[asyncio.Task[None]] = set()  # history drops of restarted replicas, in flight
        self._zmq: zmq.asyncio.Context | None = None  # one ZMQ I/O thread for every feed
        self.sharing: Sharing | None = None  # one of `serve --workers N`; None: a gateway on its own

    async def sync(self, routers: Mapping[str, Router], members: Callable[[str], Iterable[ReplicaConfig]]) -> None:
        """One subscriber per replica with `kv_events` (of each model's `members`), feeding its
        model's current router's exact tables; a feed whose tables or config changed is replaced."""
        wanted: dict[tuple[str, str], tuple[ExactTables, KVEventsConfig]] = {}
        for model, router in routers.items():
            exact = router.exact
            if exact is None:
                continue
            for replica in members(model):
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
                relay = self.sharing.feed(*key, events) if self.sharing is not None else None
                feed = KVEventSubscriber(key[1], events, exact, relay=relay)
                feed.start(self._zmq)
                self._feeds[key] = (feed, exact, events)

    def watch(self, model: str, pool: ReplicaPool, router: Router) -> None:
        """What a KV-event feed cannot see: the replica went down (its next life starts with an
        empty cache), or its engine counters went backwards (it restarted between two probes).
        Either way what the gateway believes it holds is dropped now, not at the new engine's
        first batch: its event table (the feed then replays the new history) and its routing
        history. A replica without a feed keeps its history through a blip; only a restart drops it."""
        for replica in pool:
            key = (model, replica.replica_id)
            was_healthy, last = self._watch.get(key, (True, None))
            completed = replica.load.completed
            feed = self.get(model, replica.replica_id)
            reason = None
            if completed is not None and last is not None and completed < last:
                reason = f"its engine counters went backwards (request_success_total {last:g} -> {completed:g})"
            elif feed is not None and was_healthy and not replica.healthy:
                reason = "the replica went down"
            self._watch[key] = (replica.healthy, last if completed is None else completed)
            if reason is None:
                continue
            if feed is not None:
                feed.restart(reason)
            else:
                log.warning("replica_restarted", model=model, replica=replica.replica_id, reason=reason)
            task = asyncio.get_running_loop().create_task(router.index.forget(replica.replica_id))
            self._forgetting.add(task)
            task.add_done_callback(self._forgetting.discard)

    def get(self, model: str, replica_id: str) -> KVEventSubscriber | None:
        """The replica's KV-event subscriber, if it has one."""
        entry = self._feeds.get((model, replica_id))
        return entry[0] if entry is not None else None

    def all(self) -> Iterator[tuple[str, str, KVEventSubscriber, ExactTables]]:
        """(model, replica, subscriber, the tables it fills) for every feed (for /metrics)."""
        return ((model, replica_id, feed, exact) for (model, replica_id), (feed, exact, _) in list(self._feeds.items()))

    async def close(self) -> None:
        await asyncio.gather(*(feed.close() for feed, _, _ in self._feeds.values()))
        self._feeds.clear()
        if self._zmq is not None:
            self._zmq.destroy(linger=0)
            self._zmq = None
