"""Fair admission: tenants served in turn (weighted), a tenant's cap, a tenant's own bounded line, and no slot
or waiter leaked by a timeout or a cancel anywhere in the line."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from gateway.config.features import ApiKeyConfig, AuthConfig
from gateway.config.sections import AdmissionConfig
from gateway.errors import ConfigError, RateLimitError
from gateway.replicas import Replica, ReplicaPool
from gateway.serving.admission import PoolQueue, share_of
from gateway.serving.fair_queue import ANYONE, Share

pytestmark = pytest.mark.timeout(10)
ONE_SLOT = AdmissionConfig(max_in_flight_per_replica=1, max_queue=3, queue_timeout_s=2.0)
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
    served, heavy = _Served(queue, replica, dataclasses.replace(ONE_SLOT, max_queue=5)), Share("a", weight=2)
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
    served = _Served(queue, replica, dataclasses.replace(ONE_SLOT, queue_timeout_s=0.3))
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
    assert share_of(dataclasses.replace(key, max_in_flight=0, weight=3), config) == Share("acme", 0, 3)


def test_bad_shares_are_config_errors_naming_the_key() -> None:
    key = ApiKeyConfig(sha256="0" * 64, tenant="acme")
    with pytest.raises(ConfigError, match="weight"):
        dataclasses.replace(key, weight=0).validate("auth.keys[0]")
    with pytest.raises(ConfigError, match="max_in_flight"):
        dataclasses.replace(key, max_in_flight=-1).validate("auth.keys[0]")
    with pytest.raises(ConfigError, match="max_in_flight_per_tenant"):
        AdmissionConfig(max_in_flight_per_tenant=-1).validate("admission")
    other = dataclasses.replace(key, sha256="1" * 64, weight=2)
    with pytest.raises(ConfigError, match=r"keys\[1\].*must agree|must agree"):
        AuthConfig(keys=(key, other)).validate("auth")
