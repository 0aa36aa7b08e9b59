"""A pool's guards against ejecting itself (Envoy's outlier detection as the model): the breakers never
eject more than `health.max_ejection_percent` of the replicas, and with none available the pool routes to
every replica (panic) rather than to none."""

from __future__ import annotations

import time

import pytest

from gateway.config.loader import parse_config
from gateway.config.sections import HealthConfig
from gateway.errors import ConfigError
from gateway.replicas import Replica, ReplicaPool

pytestmark = pytest.mark.timeout(10)
HEALTH = HealthConfig(eject_after_failures=1, backoff_s=30.0, backoff_max_s=60.0)


def pool_of(n: int) -> ReplicaPool:
    return ReplicaPool("m", [Replica(f"r{i}", f"http://r{i}") for i in range(n)])


def open_breakers(pool: ReplicaPool, health: HealthConfig) -> list[str | None]:
    return [pool.fault(r, health, "status 502") for r in pool]


@pytest.mark.parametrize(
    ("replicas", "percent", "ejected"),
    [(3, 50, 1), (4, 50, 2), (2, 50, 1), (1, 50, 1), (10, 10, 1), (5, 0, 1), (3, 100, 3)],
)
def test_the_breakers_eject_at_most_the_share_and_at_least_one(replicas: int, percent: int, ejected: int) -> None:
    pool = pool_of(replicas)
    verdicts = open_breakers(pool, HEALTH.model_copy(update={"max_ejection_percent": percent}))
    assert verdicts == ["opened"] * ejected + ["held"] * (replicas - ejected)
    assert len(pool.candidates()) == (replicas - ejected or replicas), "all ejected: panic offers every one"


def test_a_held_fault_opens_the_breaker_once_the_pool_has_room() -> None:
    pool = pool_of(2)
    first, second = pool
    health = HEALTH.model_copy(update={"eject_after_failures": 2})
    assert [pool.fault(first, health, "x") for _ in range(2)] == [None, "opened"]
    assert [pool.fault(second, health, "x") for _ in range(2)] == [None, "held"]
    first.breaker.open_until, first.breaker.openings = 0.0, 0  # the first came back
    assert pool.fault(second, health, "x") == "opened", "the faults were kept"


def test_every_replica_ejected_routes_to_all_of_them() -> None:
    pool = pool_of(3)
    for replica in pool:
        replica.healthy = False  # every probe failing: nothing is available
    assert {c.replica_id for c in pool.candidates()} == {"r0", "r1", "r2"} and pool.panic
    assert {c.replica_id for c in pool.candidates(exclude={"r0"})} == {"r1", "r2"}, "tried replicas stay out"
    pool.get("r2").ready = False  # type: ignore[union-attr]
    assert {c.replica_id for c in pool.candidates()} == {"r0", "r1"}, "an unready pod is not offered"
    pool.get("r1").healthy = True  # type: ignore[union-attr]
    assert [c.replica_id for c in pool.candidates()] == ["r1"] and not pool.panic
    assert pool.candidates(exclude={"r1"}) == [], "one available but tried: no panic"


def test_a_single_replica_with_its_breaker_open_still_gets_requests() -> None:
    pool = pool_of(1)
    assert open_breakers(pool, HEALTH) == ["opened"]
    replica = next(iter(pool))
    assert not replica.is_available(time.monotonic())
    assert [c.replica_id for c in pool.candidates()] == ["r0"]


@pytest.mark.parametrize("value", [-1, 101])
def test_max_ejection_percent_is_validated(value: int) -> None:
    with pytest.raises(ConfigError, match="health.max_ejection_percent"):
        parse_config({"pools": {"m": {"replicas": [{"url": "http://r0"}]}}, "health": {"max_ejection_percent": value}})


def test_has_candidate_answers_as_candidates_would_in_every_state() -> None:
    pool = pool_of(3)
    r0, r1, r2 = pool
    states = []
    for healthy, ready in [
        ((1, 1, 1), (1, 1, 1)),
        ((0, 0, 0), (1, 1, 1)),
        ((0, 0, 0), (1, 0, 0)),
        ((0, 1, 0), (1, 1, 1)),
    ]:
        for replica, h, r in zip((r0, r1, r2), healthy, ready):
            replica.healthy, replica.ready = bool(h), bool(r)
        for exclude in [set(), {"r0"}, {"r1"}, {"r0", "r1"}, {"r0", "r1", "r2"}]:
            states.append((pool.has_candidate(exclude), bool(pool.candidates(exclude))))
    assert all(has == built for has, built in states) and {has for has, _ in states} == {True, False}
