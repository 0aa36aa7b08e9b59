"""Fair admission: tenants served in turn (weighted), a tenant's cap, a tenant's own bounded line, a slot
borrowed past a full pool by a tenant under its fair share (only then, and bounded), and no slot or waiter
leaked by a timeout or a cancel anywhere in the line."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from gateway.config.features import ApiKeyConfig, AuthConfig
from gateway.config.pools import RoutingConfig
from gateway.config.schema import build
from gateway.config.sections import AdmissionConfig
from gateway.errors import ConfigError, RateLimitError
from gateway.replicas import Replica, ReplicaPool
from gateway.routing.model_route import ModelRoute
from gateway.serving.admission import Admission, PoolQueue, share_of
from gateway.serving.fair_queue import ANYONE, Share
from tests.unit.gateway.routing.test_router import chat_view, make_router

pytestmark = pytest.mark.timeout(10)
ONE_SLOT = AdmissionConfig(max_in_flight_per_replica=1, max_queue=3, queue_timeout_s=2.0, borrow_factor=1)  # lines only
A, B, C = Share("a"), Share("b"), Share("c")


def _queue() -> tuple[Replica, PoolQueue]:
    replica = Replica("r", "http://r")
    return replica, PoolQueue(ReplicaPool("m", [replica]), lambda waited_s: None)


class _Served:
    """Waiters that, once admitted, hold the slot until `next()` lets the oldest go."""

    def __init__(self, queue: PoolQueue, replica: Replica, config: AdmissionConfig = ONE_SLOT) -> None:
        self.queue, self.replica, self.config = queue, replica, config
        self.order: list[str] = []
        self.releases: list[asyncio.Event] = []
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def add(self, name: str, share: Share) -> None:
        self.tasks[name] = asyncio.create_task(self._one(name, share))

    async def _one(self, name: str, share: Share) -> None:
        await self.queue.candidates((), self.config, "m", share)
        release = asyncio.Event()
        self.releases.append(release)
        with self.queue.holding(self.replica, share):
            self.order.append(name)
            await release.wait()

    async def next(self) -> None:
        self.releases.pop(0).set()
        await asyncio.sleep(0.01)


@contextmanager
def _held(queue: PoolQueue, replica: Replica, share: Share = ANYONE) -> Iterator[None]:
    with queue.holding(replica, share):
        yield


async def _tick() -> None:
    await asyncio.sleep(0.01)


async def test_tenants_are_served_in_turn_not_in_arrival_order() -> None:
    replica, queue = _queue()
    served = _Served(queue, replica)
    with _held(queue, replica):
        for name, share in (("a1", A), ("a2", A), ("a3", A), ("b1", B), ("c1", C), ("b2", B)):
            served.add(name, share)
            await _tick()
        assert len(queue) == 6 and queue.lines.waiting() == {"a": 3, "b": 2, "c": 1}
    await _tick()
    for _ in range(5):
        await served.next()
    assert served.order == ["a1", "b1", "c1", "a2", "b2", "a3"]
    await served.next()
    assert len(queue) == 0 and not queue.lines.waiting()


async def test_a_weight_gives_that_many_turns_per_round() -> None:
    replica, queue = _queue()
    served, heavy = _Served(queue, replica, ONE_SLOT.model_copy(update={"max_queue": 5})), Share("a", weight=2)
    with _held(queue, replica):
        for name, share in (("a1", heavy), ("a2", heavy), ("a3", heavy), ("a4", heavy), ("b1", B), ("b2", B)):
            served.add(name, share)
            await _tick()
    await _tick()
    for _ in range(6):
        await served.next()
    assert served.order == ["a1", "a2", "b1", "a3", "a4", "b2"]


async def test_a_tenant_at_its_cap_waits_while_another_goes_at_once() -> None:
    replica, queue = _queue()
    capped, config = Share("a", cap=2), AdmissionConfig(max_queue=5, queue_timeout_s=2.0)  # no replica cap
    served = _Served(queue, replica, config)
    for name in ("a1", "a2", "a3", "a4"):
        served.add(name, capped)
    await _tick()
    assert served.order == ["a1", "a2"] and queue.lines.waiting() == {"a": 2}
    served.add("b1", B)
    await _tick()
    assert served.order == ["a1", "a2", "b1"], "b is not behind a's line"
    await served.next()  # a1 leaves: a3 takes a's freed share
    assert served.order[-1] == "a3" and queue.lines.waiting() == {"a": 1}
    for _ in range(4):
        await served.next()
    assert served.order == ["a1", "a2", "b1", "a3", "a4"] and len(queue) == 0


async def test_a_full_line_refuses_its_own_tenant_only() -> None:
    replica, queue = _queue()
    served = _Served(queue, replica)
    with _held(queue, replica):
        for n in range(3):
            served.add(f"a{n}", A)
        await _tick()
        with pytest.raises(RateLimitError) as info:
            await queue.candidates((), ONE_SLOT, "m", A)
        assert "queue is full" in info.value.message and info.value.retry_after_s == 1.0
        served.add("b0", B)
        await _tick()
        assert queue.lines.waiting() == {"a": 3, "b": 1}
    for task in served.tasks.values():
        task.cancel()
    await asyncio.gather(*served.tasks.values(), return_exceptions=True)


async def test_cancels_and_timeouts_anywhere_in_the_lines_leak_no_slot_and_no_waiter() -> None:
    replica, queue = _queue()
    served = _Served(queue, replica, ONE_SLOT.model_copy(update={"queue_timeout_s": 0.3}))
    with _held(queue, replica, Share("a", cap=1)):
        for name, share in (("a1", A), ("b1", B), ("a2", A), ("b2", B), ("c1", C)):
            served.add(name, share)
        await _tick()
        served.tasks["b1"].cancel()  # mid-line, never woken
        served.tasks["a1"].cancel()  # the head of the first tenant in turn
        await _tick()
        assert queue.lines.waiting() == {"a": 1, "b": 1, "c": 1}
    served.tasks["a2"].cancel()  # woken by that release, cancelled before it ran: the wake-up goes on
    await _tick()
    assert served.order == ["b2"]
    await asyncio.sleep(0.4)  # c1 waits past the timeout
    assert served.tasks["c1"].done() and isinstance(served.tasks["c1"].exception(), RateLimitError)
    await served.next()
    assert len(queue) == 0 and replica.in_flight == 0 and not queue.lines._tenants
    got = await queue.candidates((), ONE_SLOT, "m", A)
    assert [c.replica_id for c in got] == ["r"], "the slot is free again, at once"


async def test_a_woken_waiter_past_its_tenant_cap_passes_the_slot_to_the_next_tenant() -> None:
    replica, queue = _queue()
    capped = Share("a", cap=1)
    two = Replica("s", "http://s")
    queue.pool.add(two)
    served = _Served(queue, replica)
    with ExitStack() as stack:
        stack.enter_context(_held(queue, replica))
        stack.enter_context(_held(queue, two, capped))  # a holds its one slot, on s
        served.add("a1", capped)
        served.add("b1", B)
        await _tick()
        assert served.order == [] and len(queue) == 2
    await _tick()  # both replicas free: a still holds nothing now, so a1 goes, and b1 too
    assert sorted(served.order) == ["a1", "b1"]
    for _ in range(2):
        await served.next()


def test_share_of_a_key_its_override_or_the_default() -> None:
    config = AdmissionConfig(max_in_flight_per_tenant=4)
    key = ApiKeyConfig(sha256="0" * 64, tenant="acme")
    assert share_of(None, config) is ANYONE
    assert share_of(key, config) == Share("acme", 4, 1)
    assert share_of(key.model_copy(update={"max_in_flight": 0, "weight": 3}), config) == Share("acme", 0, 3)


def test_bad_shares_are_config_errors_naming_the_key() -> None:
    key = ApiKeyConfig(sha256="0" * 64, tenant="acme")
    with pytest.raises(ConfigError, match=r"auth.keys\[0\].weight"):
        build(ApiKeyConfig, {**dict(key), "weight": 0}, "auth.keys[0]")
    with pytest.raises(ConfigError, match=r"auth.keys\[0\].max_in_flight"):
        build(ApiKeyConfig, {**dict(key), "max_in_flight": -1}, "auth.keys[0]")
    with pytest.raises(ConfigError, match="admission.max_in_flight_per_tenant"):
        build(AdmissionConfig, {"max_in_flight_per_tenant": -1}, "admission")
    other = key.model_copy(update={"sha256": "1" * 64, "weight": 2})
    with pytest.raises(ConfigError, match=r"auth.keys\[1\]: keys of tenant 'acme' must agree"):
        build(AuthConfig, {"keys": (key, other)}, "auth")


TWO_SLOTS = AdmissionConfig(max_in_flight_per_replica=2, max_queue=3, queue_timeout_s=0.3)  # borrow up to 4


def _route(pool: ReplicaPool) -> ModelRoute:
    return ModelRoute("m", pool, make_router("least_loaded"), RoutingConfig(policy="least_loaded"))


async def test_a_tenant_under_its_share_borrows_a_slot_from_a_full_pool_while_another_is_over() -> None:
    replica, queue = _queue()
    served = _Served(queue, replica, TWO_SLOTS)
    with _held(queue, replica, A), _held(queue, replica, A):  # a alone: both slots, nothing reserved
        served.add("a3", A)
        await _tick()
        assert served.order == [] and queue.lines.waiting() == {"a": 1}, "alone, a tenant never borrows"
        served.add("b1", B)  # b: 0 of its share of 1 (2 slots, 2 tenants); a: 2, over its 1
        await _tick()
        assert served.order == ["b1"] and replica.in_flight == 3
        served.add("b2", B)  # b at its share now: it waits in its line like anyone
        await _tick()
        assert served.order == ["b1"] and queue.lines.waiting() == {"a": 1, "b": 1}
        await served.next()  # b1's borrowed slot is given back: still 2 held, so nobody goes
        assert served.order == ["b1"] and replica.in_flight == 2
    await _tick()  # a's two slots free: a3 and b2 in turn
    assert sorted(served.order) == ["a3", "b1", "b2"] and len(queue) == 0
    for _ in range(2):
        await served.next()
    assert replica.in_flight == 0 and not queue.lines._tenants


async def test_borrowing_stops_at_the_fair_share_by_weight_and_at_the_borrow_factor() -> None:
    replica, queue = _queue()
    heavy, config = Share("b", weight=3), TWO_SLOTS.model_copy(update={"max_queue": 5})
    served = _Served(queue, replica, config)
    with _held(queue, replica, A), _held(queue, replica, A):
        for n in range(4):  # b's share is 2 × 3/4 = 1.5 slots: it borrows 2; the factor 2 allows 4 in all
            served.add(f"b{n}", heavy)
        await _tick()
        assert served.order == ["b0", "b1"] and queue.lines.waiting() == {"b": 2} and replica.in_flight == 4
        served.add("c0", C)  # c: under its share (2/5), a over its own, but the replica is at 2 × 2
        await _tick()
        assert served.order == ["b0", "b1"] and queue.lines.waiting() == {"b": 2, "c": 1}
        assert queue.borrowable(queue.pool.candidates(()), config.model_copy(update={"borrow_factor": 3}), Share("d"))
        for task in served.tasks.values():
            task.cancel()  # the held ones give their borrowed slots back, the waiting ones leave their lines
        await asyncio.gather(*served.tasks.values(), return_exceptions=True)
        assert replica.in_flight == 2 and len(queue) == 0 and set(queue.lines._tenants) == {"a"}
    assert replica.in_flight == 0 and not queue.lines._tenants


async def test_no_borrowing_at_a_tenants_own_cap_with_a_line_of_its_own_or_with_a_factor_of_1() -> None:
    replica, queue = _queue()
    with _held(queue, replica, A), _held(queue, replica, A):
        full = queue.pool.candidates(())
        assert queue.borrowable(full, TWO_SLOTS, B)
        assert not queue.borrowable(full, TWO_SLOTS.model_copy(update={"borrow_factor": 1.4}), B)  # 2 × 1.4 → 2
        assert queue.borrowable(full, TWO_SLOTS, Share("b", cap=1)), "under its cap of 1"
        with _held(queue, replica, Share("b", cap=1)):
            assert not queue.borrowable(queue.pool.candidates(()), TWO_SLOTS, Share("b", cap=1)), "at its cap"
        waiter = queue.lines.join(B)  # b has a line (it was at its share): a new request goes behind it
        assert not queue.borrowable(full, TWO_SLOTS, B)
        queue.lines.leave(B, waiter, served=False)
        assert not queue.borrowable(full, TWO_SLOTS, ANYONE), "callers without a key never borrow"


async def test_a_borrowing_request_that_times_out_or_is_cancelled_leaks_nothing() -> None:
    replica, queue = _queue()
    served = _Served(queue, replica, TWO_SLOTS)
    with _held(queue, replica, A), _held(queue, replica, A):
        served.add("b1", B)
        served.add("b2", B)  # at its share: waits, then times out
        await _tick()
        assert served.order == ["b1"]
        await asyncio.sleep(0.4)
        assert isinstance(served.tasks["b2"].exception(), RateLimitError)
        served.tasks["b1"].cancel()  # cancelled while holding its borrowed slot
        await asyncio.gather(served.tasks["b1"], return_exceptions=True)
        assert replica.in_flight == 2 and len(queue) == 0 and set(queue.lines._tenants) == {"a"}
    assert replica.in_flight == 0 and not queue.lines._tenants


async def test_choose_admits_a_borrower_and_counts_it_but_not_a_tenant_at_its_share() -> None:
    replica, queue = _queue()
    borrowed: list[tuple[str, str]] = []
    admission = Admission(lambda model, waited_s: None, lambda model, tenant: borrowed.append((model, tenant)))
    route = _route(queue.pool)
    view = chat_view([{"role": "user", "content": "hello"}])
    with _held(admission.queue(route), replica, A), _held(admission.queue(route), replica, A):
        chosen = await admission.choose(route, view, (), TWO_SLOTS, share=B)
        assert chosen is not None and chosen[0] is replica and borrowed == [("m", "b")]
        with admission.queue(route).holding(replica, B):
            with pytest.raises(RateLimitError):  # b at its share of 1: it waits for a slot, none frees
                await admission.choose(route, view, (), TWO_SLOTS, share=B)
    assert borrowed == [("m", "b")] and replica.in_flight == 0


def test_borrow_factor_below_1_is_a_config_error_naming_the_key() -> None:
    for bad in (0.5, float("nan")):
        with pytest.raises(ConfigError, match="admission.borrow_factor"):
            build(AdmissionConfig, {"borrow_factor": bad}, "admission")
