"""KV-event feeds: one per replica with `kv_events`, following its router, and the restarts they cannot see."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config.pools import KVEventsConfig, ReplicaConfig
from gateway.index import MemoryIndex
from gateway.index.exact import ExactTables
from gateway.prompt import prefix_keys as prefix
from gateway.replicas import Replica, ReplicaPool
from gateway.routing.kv_feeds import KVFeeds
from gateway.routing.policies.registry import build_policy
from gateway.routing.router import Router
from lab.cluster import free_port

pytestmark = pytest.mark.timeout(30)


def router() -> Router:
    return Router(
        build_policy("round_robin", {}, "p"),
        index=MemoryIndex(10_000),
        pool="m",
        exact=ExactTables(prefix.model_seed("m"), 16),
    )


def members() -> list[ReplicaConfig]:
    """`a` publishes KV events (to a port nobody binds: a SUB socket just waits), `b` does not."""
    events = KVEventsConfig(endpoint=f"tcp://127.0.0.1:{free_port()}")
    return [ReplicaConfig(url="http://a:1", name="a", kv_events=events), ReplicaConfig(url="http://b:1", name="b")]


async def test_a_feed_follows_its_router_and_goes_with_its_replica() -> None:
    feeds, replicas, first = KVFeeds(), members(), router()
    await feeds.sync({"m": first}, lambda model: replicas)
    feed = feeds.get("m", "a")
    assert feed is not None and list(feeds.all()) == [("m", "a", feed, first.exact)]
    await feeds.sync({"m": first}, lambda model: replicas)
    assert feeds.get("m", "a") is feed, "an unchanged router and config keep their feed"
    second = router()
    await feeds.sync({"m": second}, lambda model: replicas)
    assert feeds.get("m", "a") not in (None, feed) and list(feeds.all())[0][3] is second.exact
    await feeds.sync({"m": second}, lambda model: replicas[1:])
    assert feeds.get("m", "a") is None and list(feeds.all()) == []
    await feeds.close()


async def test_a_downed_or_restarted_replica_loses_what_it_was_believed_to_hold() -> None:
    feeds, replicas, routed = KVFeeds(), members(), router()
    pool = ReplicaPool("m", [Replica.from_config(r) for r in replicas])
    await feeds.sync({"m": routed}, lambda model: replicas)
    a, b = pool.get("a"), pool.get("b")
    assert a is not None and b is not None and isinstance(routed.index, MemoryIndex)
    routed.index.record("b", [1, 2, 3])
    b.load.completed = 10.0
    feeds.watch("m", pool, routed)
    a.healthy = b.healthy = False  # `b` has no feed: a blip alone keeps its history
    feeds.watch("m", pool, routed)
    await asyncio.sleep(0)
    assert feeds.get("m", "a").resets == 1 and routed.index.match_now([1, 2, 3], ["b"]) == {"b": 3}
    b.load.completed = 2.0  # its engine counters went backwards: it restarted
    feeds.watch("m", pool, routed)
    await asyncio.sleep(0)
    assert routed.index.match_now([1, 2, 3], ["b"]) == {"b": 0} and feeds.get("m", "a").resets == 1
    await feeds.close()
