"""Warm-prefix index: both stores pass one suite; Redis-only tests use a real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.config.features import IndexConfig, IndexStore
from gateway.index import MemoryIndex, WarmIndex, build_index
from gateway.index.redis_store import RedisIndex
from tests.helpers import Proc, free_port, redis_server_binary

_prefixes = itertools.count()


def chain(tag: int, n: int) -> list[int]:
    return [tag * 1_000_003 + i for i in range(n)]


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis-lookups", marks=pytest.mark.redis),
    ]
)
async def index(request: pytest.FixtureRequest) -> AsyncIterator[WarmIndex]:
    """Memory; Redis with its mirror; Redis asked on every lookup (`mirror: false`)."""
    url = None if request.param == "memory" else request.getfixturevalue("redis_url")
    params = IndexConfig(capacity_blocks=1000, mirror=request.param != "redis-lookups")
    idx = build_index(IndexStore(params, url, f"test{next(_prefixes)}:"))
    yield idx
    await idx.close()


async def test_unknown_replicas_match_nothing(index: WarmIndex) -> None:
    assert await index.match(chain(1, 5), ["a", "b"]) == {"a": 0, "b": 0}
    assert await index.match([], ["a"]) == {"a": 0}


async def test_record_then_match_leading_blocks(index: WarmIndex) -> None:
    index.record("a", chain(1, 10))
    index.record("b", chain(1, 4))
    await index.flush()
    # A request that shares 6 blocks of the chain, then diverges.
    request = chain(1, 6) + chain(2, 4)
    assert await index.match(request, ["a", "b", "c"]) == {"a": 6, "b": 4, "c": 0}


async def test_branches_share_their_common_prefix(index: WarmIndex) -> None:
    trunk = chain(3, 3)
    index.record("a", trunk + chain(31, 5))
    index.record("a", trunk + chain(32, 2))
    await index.flush()
    got = [(await index.match(trunk + chain(tag, 6), ["a"]))["a"] for tag in (31, 32, 33)]
    assert got == [8, 5, 3]


async def test_long_chains_match_in_full(index: WarmIndex) -> None:
    index.record("a", chain(4, 700))
    await index.flush()
    assert (await index.match(chain(4, 700) + [1], ["a"]))["a"] == 700


async def test_capacity_trims_tails_first(index: WarmIndex) -> None:
    index.set_capacity("a", 4)
    index.record("a", chain(5, 8))
    await index.flush()
    assert (await index.match(chain(5, 8), ["a"]))["a"] == 4


async def test_lru_evicts_least_recently_used_prefix(index: WarmIndex) -> None:
    index.set_capacity("a", 8)
    index.record("a", chain(6, 4))
    index.record("a", chain(7, 4))
    index.record("a", chain(6, 4))  # touch: chain 6 is now the most recent
    index.record("a", chain(8, 2))  # evicts the two tail blocks of chain 7
    await index.flush()
    got = [(await index.match(chain(n, blocks), ["a"]))["a"] for n, blocks in ((6, 4), (7, 4), (8, 2))]
    assert got == [4, 2, 2]


async def test_forget_drops_a_replica(index: WarmIndex) -> None:
    index.record("a", chain(9, 3))
    index.record("b", chain(9, 3))
    await index.forget("a")
    await index.flush()
    assert await index.match(chain(9, 3), ["a", "b"]) == {"a": 0, "b": 3}


async def test_memory_set_capacity_trims_now() -> None:
    idx = MemoryIndex(100)
    idx.record("a", chain(1, 10))
    idx.set_capacity("a", 3)
    assert idx.size("a") == 3 and idx.match_now(chain(1, 10), ["a"]) == {"a": 3}


# --- Redis only -------------------------------------------------------------------------------


def redis_index(url: str, **kw: object) -> RedisIndex:
    params = IndexConfig(**kw)  # type: ignore[arg-type]
    index = build_index(IndexStore(params, url, f"test{next(_prefixes)}:"))
    assert isinstance(index, RedisIndex)
    return index


async def mirrored(*indexes: RedisIndex) -> None:
    """Wait until each mirroring index follows the others (a no-op for `mirror: false`)."""
    for index in indexes:
        if index.params.mirror:
            await index.match([], [])  # starts the follower
            for _ in range(500):
                if index.mirrored:
                    break
                await asyncio.sleep(0.01)
            assert index.mirrored


async def settle(*indexes: RedisIndex) -> None:
    """Every write is in Redis, then every index has applied every write."""
    for index in indexes:
        await index.flush()
    for index in indexes:
        await index.flush()


@pytest.mark.redis
@pytest.mark.parametrize("mirror", [True, False])
async def test_two_gateways_share_tables(redis_url: str, mirror: bool) -> None:
    one = redis_index(redis_url, mirror=mirror)
    two = RedisIndex(one.store)
    try:
        await mirrored(one, two)
        one.record("a", chain(10, 5))
        await settle(one, two)
        assert (await two.match(chain(10, 5), ["a", "b"])) == {"a": 5, "b": 0}
        await one.forget("a")
        await settle(one, two)
        assert (await two.match(chain(10, 5), ["a", "b"])) == {"a": 0, "b": 0}
    finally:
        await one.close()
        await two.close()


@pytest.mark.redis
async def test_redis_keys_are_namespaced_bounded_and_expire(redis_url: str) -> None:
    index = redis_index(redis_url, ttl_s=30.0)
    client = aioredis.Redis.from_url(redis_url)
    try:
        index.set_capacity("a", 5)
        index.record("a", chain(11, 9))
        await index.flush()
        key = index.key("a")
        assert key.startswith(index.key_prefix)
        assert await client.zcard(key) == 5
        assert 0 < await client.ttl(key) <= 30
        assert await client.keys(f"{index.key_prefix}*") == [key.encode()]
    finally:
        await client.aclose()
        await index.close()


@pytest.mark.redis
async def test_background_flush_needs_no_explicit_call(redis_url: str) -> None:
    one = redis_index(redis_url)
    two = RedisIndex(one.store)
    try:
        one.record("a", chain(12, 3))
        for _ in range(200):
            if (await two.match(chain(12, 3), ["a"]))["a"] == 3:
                break
            await asyncio.sleep(0.005)
        assert (await two.match(chain(12, 3), ["a"]))["a"] == 3
    finally:
        await one.close()
        await two.close()


@pytest.mark.redis
async def test_writes_and_lookups_survive_a_script_flush(redis_url: str) -> None:
    """A Redis that lost the scripts (restarted between two calls) answers NOSCRIPT: both the
    lookup and the background writes load them again instead of degrading."""
    one = redis_index(redis_url, mirror=False)
    two = RedisIndex(one.store)
    client = aioredis.Redis.from_url(redis_url)
    try:
        one.record("a", chain(15, 3))
        await one.flush()
        await client.script_flush()
        one.record("b", chain(15, 5))
        await one.flush()
        await client.script_flush()
        assert await two.match(chain(15, 5), ["a", "b", "c"]) == {"a": 3, "b": 5, "c": 0}
        assert not one.degraded and not two.degraded and one.errors == two.errors == 0
    finally:
        await client.aclose()
        await one.close()
        await two.close()


@pytest.mark.redis
@pytest.mark.parametrize("mirror", [True, False])
async def test_lookup_is_exact_whatever_the_hints(redis_url: str, mirror: bool) -> None:
    """Each local table knows only its own gateway's writes (short of what Redis holds, or
    empty): the Redis lookup still answers what Redis holds, and so does every mirror, for many
    candidates sharing a few answers, in any order."""
    one = redis_index(redis_url, capacity_blocks=100, mirror=mirror)
    two, three = RedisIndex(one.store), RedisIndex(one.store)
    try:
        await mirrored(one, two, three)
        trunk = chain(16, 20)
        for i in range(40):
            (one if i % 3 else two).record(f"r{i}", trunk[: 5 + i % 4] if i % 5 else trunk + chain(17 + i, i))
        await settle(one, two, three)
        query = trunk + chain(27, 30)  # r10 holds trunk + chain(27, 10)
        ids = [f"r{i}" for i in range(45)]  # five unknown replicas
        want = {r: 0 for r in ids}
        for i in range(40):
            want[f"r{i}"] = 5 + i % 4 if i % 5 else 30 if i == 10 else 20
        for index in (one, two, three):  # three wrote nothing
            assert await index.match(query, ids) == want
            assert await index.match(query, list(reversed(ids))) == want
    finally:
        for index in (one, two, three):
            await index.close()


Pair = tuple[RedisIndex, RedisIndex, aioredis.Redis]


@pytest.fixture
async def mirrored_pair(redis_url: str) -> AsyncIterator[Pair]:
    """Two gateways whose mirrors follow each other, and a plain client of their Redis."""
    one = redis_index(redis_url)
    two = RedisIndex(one.store)
    client = aioredis.Redis.from_url(redis_url)
    await mirrored(one, two)
    yield one, two, client
    await client.aclose()
    await one.close()
    await two.close()


@pytest.mark.redis
async def test_a_mirrored_lookup_sends_nothing_to_redis(mirrored_pair: Pair) -> None:
    one, two, client = mirrored_pair
    one.record("a", chain(18, 30))
    await settle(one, two)
    await client.config_resetstat()
    for _ in range(20):
        assert await two.match(chain(18, 30), ["a", "b"]) == {"a": 30, "b": 0}
    commands = await client.info("commandstats")
    assert set(commands) <= {"cmdstat_config|resetstat"}, commands


@pytest.mark.redis
async def test_mirror_loads_a_snapshot_and_keeps_writes_made_meanwhile(redis_url: str) -> None:
    """A gateway that starts late loads what Redis holds, trimmed as Redis trims it, and loses
    none of its own writes made while the snapshot loads."""
    one = redis_index(redis_url, capacity_blocks=6)
    client = aioredis.Redis.from_url(redis_url)
    two = three = None
    try:
        for i in range(20):
            one.record(f"r{i}", chain(19 + i, 4 + i % 5))
        await one.flush()
        two = RedisIndex(one.store)
        two.record("late", chain(40, 3))  # starts the follower: this write lands mid-load
        await mirrored(two)
        three = RedisIndex(one.store)
        await mirrored(three)
        await settle(one, two, three)
        ids = [f"r{i}" for i in range(20)] + ["late"]
        for index in (one, two, three):
            got = {r: (await index.match(chain(19 + i, 9), [r]))[r] for i, r in enumerate(ids[:-1])}
            assert got == {f"r{i}": min(6, 4 + i % 5) for i in range(20)}
            assert (await index.match(chain(40, 3), ["late"]))["late"] == 3
        assert await client.zcard(one.key("r4")) == three.local.size("r4") == 6
    finally:
        await client.aclose()
        for index in (one, two, three):
            if index is not None:
                await index.close()


@pytest.mark.redis
async def test_a_bad_message_costs_a_resync_not_a_wrong_answer(mirrored_pair: Pair) -> None:
    one, two, client = mirrored_pair
    one.record("a", chain(50, 4))
    await settle(one, two)
    await client.publish(f"{one.key_prefix}ops", b"12345678W\xff")  # truncated op
    for _ in range(500):
        if two.mirror_errors and two.mirrored:
            break
        await asyncio.sleep(0.01)
    assert two.mirror_errors >= 1 and two.mirrored
    one.record("b", chain(50, 2))
    await settle(one, two)
    assert await two.match(chain(50, 4), ["a", "b"]) == {"a": 4, "b": 2}


@pytest.mark.redis
async def test_unreachable_redis_degrades_then_catches_up(redis_url: str) -> None:
    binary = redis_server_binary()
    assert binary is not None  # redis_url already failed or skipped otherwise
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    index = redis_index(url, timeout_s=0.2, reconnect_max_s=0.1)
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc: Proc | None = None
    try:
        index.record("a", chain(13, 4))
        # Nothing listens on the port: lookups answer from the local table and count the failure.
        assert await index.match(chain(13, 4), ["a", "b"]) == {"a": 4, "b": 0}
        for _ in range(100):
            if index.degraded:
                break
            await asyncio.sleep(0.01)
        assert index.degraded and index.errors > 0
        index.record("b", chain(13, 2))
        proc = Proc(args)
        for _ in range(500):
            if not index.degraded and not index._pending:
                break
            await asyncio.sleep(0.02)
        assert not index.degraded
        fresh = RedisIndex(index.store)  # another gateway sees what was written during the outage
        try:
            assert await fresh.match(chain(13, 4), ["a", "b"]) == {"a": 4, "b": 2}
            await mirrored(index, fresh)
            # Redis restarts empty: both mirrors resubscribe, reload, and follow again.
            errors = index.mirror_errors
            proc.stop()
            proc = Proc(args)
            for _ in range(500):
                if index.mirror_errors > errors and index.mirrored and fresh.mirrored:
                    break
                await asyncio.sleep(0.02)
            assert index.mirror_errors > errors and index.mirrored and fresh.mirrored
            fresh.record("c", chain(13, 3))
            await settle(fresh, index)
            assert await index.match(chain(13, 4), ["a", "b", "c"]) == {"a": 0, "b": 0, "c": 3}
        finally:
            await fresh.close()
    finally:
        await index.close()
        if proc is not None:
            proc.stop()


async def test_write_queue_is_bounded_during_outage() -> None:
    index = redis_index(f"redis://127.0.0.1:{free_port()}/0", max_pending_writes=3, timeout_s=0.05)
    try:
        for i in range(10):
            index.record("a", chain(14 + i, 1))
        assert len(index._pending) <= 3 and index.dropped_writes >= 7
    finally:
        await index.close()


@pytest.mark.redis
async def test_a_closed_index_stays_closed(redis_url: str) -> None:
    """A request finishing after the reload that closed its index records into it: that must not
    restart the flusher or the mirror's subscription (redis-py would reconnect on the next command)."""
    index = redis_index(redis_url)
    index.record("r", [1, 2])
    await mirrored(index)
    await index.close()
    index.record("r", [3, 4])
    assert await index.match([3, 4], ["r"]) == {"r": 2}  # answered from the local table
    await index.flush()
    assert index._task is None and index._follower is None


@pytest.mark.redis
async def test_close_ends_a_flusher_that_lost_its_cancel(redis_url: str) -> None:
    """Python 3.11's wait_for (around redis-py's socket writes) can drop a cancel that lands as the
    write completes; close() must end the flusher anyway, or it waits forever holding the index."""
    index = redis_index(redis_url)

    async def send_that_swallows_a_cancel(batch: object) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)

    index._send = send_that_swallows_a_cancel  # type: ignore[method-assign]
    index.record("r", [1, 2])
    await asyncio.sleep(0.05)  # the flusher is in its send
    flusher = index._task
    assert flusher is not None and not flusher.done()
    await index.close()
    assert flusher.done()
