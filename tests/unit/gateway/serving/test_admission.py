"""Admission queue: caps, FIFO order, routing at dequeue time, 429 when full or waited too long."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.config.sections import AdmissionConfig
from gateway.errors import RateLimitError
from gateway.replicas import Replica, ReplicaPool
from gateway.serving.admission import PoolQueue
from gateway.view import RequestView

CONFIG = AdmissionConfig(max_in_flight_per_replica=1, max_queue=3, queue_timeout_s=1.0, retry_after_s=2.0)


def _pool() -> tuple[ReplicaPool, PoolQueue, list[float]]:
    pool = ReplicaPool("m", [Replica("a", "http://a"), Replica("b", "http://b")])
    waits: list[float] = []
    return pool, PoolQueue(pool, waits.append), waits


async def test_no_cap_means_no_queue() -> None:
    pool, queue, _ = _pool()
    with queue.holding(pool.get("a")), queue.holding(pool.get("a")):  # type: ignore[arg-type]
        got = await queue.candidates((), AdmissionConfig(), "m")
    assert [c.replica_id for c in got] == ["a", "b"]


async def test_full_replicas_are_skipped_then_waiters_are_served_in_order_with_fresh_state() -> None:
    pool, queue, waits = _pool()
    a, b = pool.get("a"), pool.get("b")
    assert a is not None and b is not None
    served: list[tuple[int, list[str]]] = []

    async def wait(n: int) -> None:
        served.append((n, [c.replica_id for c in await queue.candidates((), CONFIG, "m")]))

    with queue.holding(a):
        assert [c.replica_id for c in await queue.candidates((), CONFIG, "m")] == ["b"]
        with queue.holding(b):
            tasks = [asyncio.create_task(wait(n)) for n in range(3)]
            await asyncio.sleep(0.01)
            assert len(queue) == 3 and not served
            with pytest.raises(RateLimitError) as info:
                await queue.candidates((), CONFIG, "m")
            assert info.value.retry_after_s == 2.0 and "queue is full" in info.value.message
        await asyncio.sleep(0.01)  # b freed: the first waiter sees b (and only b) free
        assert served == [(0, ["b"])] and len(queue) == 2
    await asyncio.sleep(0.01)  # a freed too; nothing holds a or b now, so both remaining waiters go in turn
    assert [n for n, _ in served] == [0, 1]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert len(queue) == 0 and len(waits) == 3


async def test_wait_past_the_timeout_is_429_and_leaves_the_queue() -> None:
    pool, queue, waits = _pool()
    with queue.holding(pool.get("a")), queue.holding(pool.get("b")):  # type: ignore[arg-type]
        with pytest.raises(RateLimitError) as info:
            await queue.candidates(
                (), AdmissionConfig(max_in_flight_per_replica=1, max_in_flight_per_tenant=3, queue_timeout_s=0.05), "m"
            )
    assert "waited" in info.value.message and len(queue) == 0 and 0.04 < waits[0] < 0.5


async def test_a_cancelled_waiter_passes_its_wake_up_on() -> None:
    pool, queue, _ = _pool()
    a = pool.get("a")
    assert a is not None
    pool.remove("b")
    with queue.holding(a):
        first = asyncio.create_task(queue.candidates((), CONFIG, "m"))
        second = asyncio.create_task(queue.candidates((), CONFIG, "m"))
        await asyncio.sleep(0.01)
    first.cancel()  # woken by the release, but its client left before it ran
    assert [c.replica_id for c in await second] == ["a"]


async def test_no_ready_replica_returns_empty_instead_of_waiting() -> None:
    pool, queue, _ = _pool()
    for replica in pool:
        replica.healthy = False  # none available: panic offers every ready one
    assert len(await queue.candidates((), CONFIG, "m")) == 2
    for replica in pool:
        replica.ready = False
    assert await queue.candidates((), CONFIG, "m") == []


async def test_room_that_appears_without_a_release_goes_to_the_head_of_the_line() -> None:
    pool, queue, _ = _pool()
    a, b = pool.get("a"), pool.get("b")
    assert a is not None and b is not None
    b.healthy = False
    with queue.holding(a):
        head = asyncio.create_task(queue.candidates((), CONFIG, "m"))
        await asyncio.sleep(0.01)
        b.healthy = True  # back, with room, but nothing was released
        late = asyncio.create_task(queue.candidates((), CONFIG, "m"))
        assert [c.replica_id for c in await head] == ["b"]
        assert not late.done() and len(queue) == 1
        late.cancel()
        await asyncio.gather(late, return_exceptions=True)


async def test_a_decision_that_loses_its_slot_records_nothing_for_that_replica() -> None:
    """Admission decides, but another request takes the chosen replica's last slot before this one
    holds it: the decision is made again elsewhere, and the first choice keeps no phantom warm
    prefix and no phantom queued prefill (the decision committed nothing)."""
    from gateway.config.pools import RoutingConfig
    from gateway.routing.model_route import ModelRoute
    from gateway.serving.admission import Admission
    from tests.unit.gateway.routing.test_router import SYSTEM, chat_view, make_router

    pool, _, _ = _pool()
    router = make_router(seed=1)
    route = ModelRoute("m", pool, router, RoutingConfig(policy="prefix_affinity"))
    admission = Admission(lambda model, waited_s: None)
    view = chat_view([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello " * 200}])
    decide, taken = router.decide, []

    async def decide_then_lose_the_slot(view_: RequestView, candidates: Any) -> Any:
        decision = await decide(view_, candidates)
        if not taken:  # a concurrent request takes the chosen replica's slot meanwhile
            taken.append(pool.track(pool.get(decision.replica_id)))  # type: ignore[arg-type]
            taken[0].__enter__()
        return decision

    router.decide = decide_then_lose_the_slot  # type: ignore[method-assign]
    replica, decision = await admission.choose(route, view, (), CONFIG)  # type: ignore[misc]
    router.dispatched(view, decision)  # the attempt loop commits it once it holds the slot
    lost = "b" if replica.replica_id == "a" else "a"
    taken[0].__exit__(None, None, None)  # the other request is gone: only what was committed remains
    explained = (await router.explain(view, pool.candidates(())))["candidates"]
    rows = {row["replica"]: row for row in explained}
    assert rows[replica.replica_id]["cached_tokens"] > 0 and rows[replica.replica_id]["wait_s"] > 0
    assert rows[lost]["cached_tokens"] == 0 and rows[lost]["wait_s"] == 0.0
