"""One KV-event subscription for many workers (`gateway.index.kv_events.relay`), over real ZMQ sockets: the
owner's subscriber forwards what the replica's PUB sends, unchanged and in order; a follower builds the
same table from it, and recovers from the replica's replay socket what it missed while the owner was away."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from itertools import count

import pytest
import zmq
import zmq.asyncio

from gateway.config.pools import KVEventsConfig
from gateway.index.kv_events.relay import REBIND_S, FeedRelay, Forwarder, Sharing
from gateway.index.kv_events.subscriber import KVEventSubscriber
from tests.unit.gateway.index.kv_events.test_subscriber import FakePublisher, RecordingSink, removed, stored, until

pytestmark = pytest.mark.timeout(30)
_GROUPS = count()


def sharing(owner: bool) -> Sharing:
    """A supervisor's name of its own for each test, as `serve --workers N` names one by its pid."""
    return Sharing(f"test-relay-{os.getpid()}-{next(_GROUPS)}", owner)


def config_of(pub: FakePublisher) -> KVEventsConfig:
    return KVEventsConfig(endpoint=pub.endpoint, replay_endpoint=pub.replay_endpoint, topic="kv")


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
async def publisher(ctx: zmq.asyncio.Context) -> AsyncIterator[FakePublisher]:
    pub = FakePublisher(ctx, topic=b"kv")
    yield pub
    await pub.close()


async def started(
    pub: FakePublisher, relay: FeedRelay, ctx: zmq.asyncio.Context
) -> tuple[KVEventSubscriber, RecordingSink]:
    sink = RecordingSink()
    sub = KVEventSubscriber("r1", config_of(pub), sink, replay_timeout_s=0.5, relay=relay)
    sub.start(ctx)
    await until(lambda: sink.certain)  # past its start-up replay
    return sub, sink


async def joined(sub: zmq.asyncio.Socket, pub: FakePublisher, owner: KVEventSubscriber) -> None:
    """Slow joiners: publish until both the owner and the raw follower `sub` receive, then drain `sub`."""
    while not await sub.poll(50):
        await pub.publish(["AllBlocksCleared"])
    while await sub.poll(100):
        await sub.recv_multipart()
    await until(lambda: owner.last_seq == pub.seq - 1)


async def caught_up(follower: KVEventSubscriber, pub: FakePublisher) -> None:
    """Publish a batch at a time until `follower` has applied the last (the owner's relay reached it)."""
    for n in range(100):
        if follower.last_seq == pub.seq - 1 and pub.seq > 0:
            return
        await pub.publish(stored(1000 + n))
        await asyncio.sleep(0.05)
    raise AssertionError(f"the follower is at seq {follower.last_seq}, the publisher at {pub.seq - 1}")


def test_every_worker_names_a_feed_alike_and_another_feed_otherwise() -> None:
    owner, follower = Sharing("affinity-gateway-42", True), Sharing("affinity-gateway-42", False)
    config = KVEventsConfig(endpoint="tcp://10.0.0.5:5557")
    one = owner.feed("m", "r1", config)
    assert one == FeedRelay(one.endpoint, forwards=True) and one.endpoint.startswith("ipc://@affinity-gateway-42-kv-")
    assert follower.feed("m", "r1", config) == FeedRelay(one.endpoint, forwards=False)
    others = {
        owner.feed("m", "r2", config).endpoint,
        owner.feed("m2", "r1", config).endpoint,
        owner.feed("m", "r1", KVEventsConfig(endpoint="tcp://10.0.0.6:5557")).endpoint,
        owner.feed("m", "r1", KVEventsConfig(endpoint="tcp://10.0.0.5:5557", topic="kv")).endpoint,
        Sharing("affinity-gateway-43", True).feed("m", "r1", config).endpoint,
    }
    assert one.endpoint not in others and len(others) == 5


async def test_the_owner_forwards_the_replicas_frames_unchanged_and_in_order(
    ctx: zmq.asyncio.Context, publisher: FakePublisher
) -> None:
    relay = sharing(owner=True).feed("m", "r1", config_of(publisher))
    owner, owner_sink = await started(publisher, relay, ctx)
    raw = ctx.socket(zmq.SUB)
    raw.setsockopt(zmq.SUBSCRIBE, b"")
    raw.connect(relay.endpoint)
    try:
        await joined(raw, publisher, owner)
        first = publisher.seq
        big = stored(*range(1, 5000))  # ~50 kB: a long prompt's batch
        batches = [stored(1, 2), big, removed(2), ["AllBlocksCleared"], stored(3, parent=1)]
        for event in batches:
            await publisher.publish(event)
        sent = [[b"kv", seq.to_bytes(8, "big"), payload] for seq, payload in list(publisher.buffer)[-len(batches) :]]
        got = [await asyncio.wait_for(raw.recv_multipart(), 2.0) for _ in batches]
        assert got == sent and [int.from_bytes(f[1], "big") for f in got] == list(range(first, first + len(batches)))
        await until(lambda: owner.last_seq == first + len(batches) - 1)
        described = owner.describe()["relay"]
        assert described | {"forwarded": "-"} == {
            "role": "forwards",
            "endpoint": relay.endpoint,
            "forwarded": "-",
            "unbound": 0,
        }
        assert described["forwarded"] >= len(batches) and owner_sink.certain
    finally:
        raw.close(linger=0)
        await owner.close()


async def test_a_follower_mirrors_the_owners_table_and_recovers_what_it_missed_while_the_owner_was_away(
    ctx: zmq.asyncio.Context, publisher: FakePublisher
) -> None:
    group = sharing(owner=True).group
    owner_relay = Sharing(group, True).feed("m", "r1", config_of(publisher))
    owner, owner_sink = await started(publisher, owner_relay, ctx)
    follower, follower_sink = await started(publisher, Sharing(group, False).feed("m", "r1", config_of(publisher)), ctx)
    again: KVEventSubscriber | None = None
    try:
        await caught_up(follower, publisher)
        await publisher.publish(stored(1, 2), removed(2))
        await until(lambda: follower.last_seq == owner.last_seq == publisher.seq - 1)
        pair = [("stored", "r1", (1, 2), None), ("removed", "r1", (2,))]
        assert follower_sink.calls[-2:] == owner_sink.calls[-2:] == pair
        assert follower.describe()["relay"] == {"role": "follows", "endpoint": owner_relay.endpoint}
        gaps, replays = follower.gaps, follower.replays

        await owner.close()  # the owner restarts: the follower hears nothing of these two
        await publisher.publish(stored(7))
        await publisher.publish(stored(8, parent=7))
        again, _ = await started(publisher, owner_relay, ctx)
        await caught_up(follower, publisher)  # silence, then a gap, filled from the replica's replay socket
        assert follower.gaps == gaps + 1 and follower.replays == replays + 1
        assert follower.resets == 0 and follower_sink.certain
        missed = follower_sink.calls[follower_sink.calls.index(pair[-1]) + 1 :][:2]
        assert missed == [("stored", "r1", (7,), None), ("stored", "r1", (8,), 7)]
    finally:
        for sub in (owner, follower, again):
            if sub is not None:
                await sub.close()


async def test_a_name_still_held_is_bound_once_it_is_free(ctx: zmq.asyncio.Context) -> None:
    endpoint = sharing(owner=True).feed("m", "r1", KVEventsConfig(endpoint="tcp://127.0.0.1:1")).endpoint
    first = Forwarder(ctx, endpoint)
    second = Forwarder(ctx, endpoint)
    try:
        second.send([b"kv", b"\0" * 8, b"x"])
        assert second.describe() == {"forwarded": 0, "unbound": 1}
        first.close()  # ZMQ lets go of the name a moment later, in its I/O thread
        for _ in range(20):
            await asyncio.sleep(REBIND_S)
            second.send([b"kv", b"\0" * 8, b"x"])
            if second.forwarded:
                break
        assert second.forwarded == 1 and second.unbound <= 2
    finally:
        first.close()
        second.close()
