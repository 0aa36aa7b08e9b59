"""ReplicaPool: the replicas serving one model, and the Candidates a policy sees for one request.

Usage:
    pool = ReplicaPool("llama", [Replica.from_config(r) for r in pool_config.replicas])
    candidates = pool.candidates(exclude={"r1"})      # healthy replicas only, as policy input
    with pool.track(replica):                          # in-flight +1 for the whole relay, -1 on any exit
        ...
    pool.fault(replica, health, "status 502")           # an upstream fault, within the ejection cap

Two guards keep a pool serving when its replicas look broken, as Envoy's outlier detection does:
- the circuit breakers never eject more than `health.max_ejection_percent` of the replicas (at least
  one may always be ejected); a fault beyond the cap is kept but opens nothing (`fault`);
- panic: with no replica available at all (every breaker open, every probe failing), `candidates`
  offers every replica (but those Kubernetes calls unready) rather than none: a request that may
  fail beats a 503 for everyone. Entering and leaving panic is logged; a pool with one available
  replica pays nothing for it.

Single-threaded asyncio: no locks, and no awaits between reading and changing a count.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Iterator

import structlog

from gateway.config.sections import HealthConfig
from gateway.replicas.replica import Replica
from gateway.request.decision import Candidate

log = structlog.get_logger("gateway.replicas.pool")


class Tracked:
    """A request held at a replica (`ReplicaPool.track`): a class, not a generator's context manager, as
    it is entered by every request (a third of the cost)."""

    __slots__ = ("replica", "_trial")

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self._trial = False

    def __enter__(self) -> Replica:
        self._trial = self.replica.breaker.dispatched(time.monotonic())
        self.replica.in_flight += 1
        return self.replica

    def __exit__(self, *exc: object) -> None:
        self.replica.in_flight -= 1
        if self._trial:
            self.replica.breaker.end_trial()


class ReplicaPool:
    def __init__(self, model: str, replicas: Iterable[Replica] = ()) -> None:
        self.model = model
        self._replicas: dict[str, Replica] = {}
        self.panic = False  # no replica available at the last look: every one is offered
        for replica in replicas:
            self.add(replica)

    def __iter__(self) -> Iterator[Replica]:
        return iter(tuple(self._replicas.values()))

    def __len__(self) -> int:
        return len(self._replicas)

    def get(self, replica_id: str) -> Replica | None:
        return self._replicas.get(replica_id)

    def add(self, replica: Replica) -> None:
        """Add a replica, or update address, weight, declared adapters and role of a known one (keeping its
        counts and health): a relabelled pod keeps its id."""
        known = self._replicas.get(replica.replica_id)
        if known is None:
            self._replicas[replica.replica_id] = replica
        else:
            known.url, known.weight = replica.url, replica.weight
            known.declared_adapters, known.role = replica.declared_adapters, replica.role

    def remove(self, replica_id: str) -> Replica | None:
        """Stop routing to a replica; requests already at it finish normally."""
        return self._replicas.pop(replica_id, None)

    def replace(self, replicas: Iterable[Replica]) -> None:
        """Make the pool exactly `replicas` (config reload, DNS discovery)."""
        wanted = {r.replica_id: r for r in replicas}
        for replica_id in set(self._replicas) - set(wanted):
            self.remove(replica_id)
        for replica in wanted.values():
            self.add(replica)

    def candidates(self, exclude: Collection[str] = ()) -> list[Candidate]:
        """The available replicas not in `exclude`, as policy input; in panic (none available at all) every
        ready one not in `exclude`."""
        now = time.monotonic()
        chosen = [r for r in self._replicas.values() if r.is_available(now) and r.replica_id not in exclude]
        if not chosen and self._replicas and not any(r.is_available(now) for r in self._replicas.values()):
            chosen = [r for r in self._replicas.values() if r.ready and r.replica_id not in exclude]
            if not self.panic:
                self.panic = True
                log.warning(
                    "pool_panic",
                    model=self.model,
                    replicas=len(self._replicas),
                    reason="no replica available: routing to every replica",
                )
        elif self.panic and chosen:
            self.panic = False
            log.info("pool_panic_over", model=self.model)
        return [
            Candidate(r.replica_id, r.weight, r.in_flight, r.load.running, r.load.waiting, r.load.kv_usage)
            for r in chosen
        ]

    def has_candidate(self, exclude: Collection[str]) -> bool:
        """`bool(self.candidates(exclude))` without building them (or changing the panic state): whether a
        retry would have a replica left."""
        now = time.monotonic()
        replicas = self._replicas.values()
        if any(r.is_available(now) and r.replica_id not in exclude for r in replicas):
            return True
        if any(r.is_available(now) for r in replicas):
            return False
        return any(r.ready and r.replica_id not in exclude for r in replicas)

    def fault(self, replica: Replica, health: HealthConfig, error: str) -> str | None:
        """Count an upstream fault of `replica`: "opened" when it opened its breaker, "held" when it would
        have but the pool is at `max_ejection_percent`, else None."""
        now = time.monotonic()
        may_open = (
            replica.breaker.state(now) != "closed"
            or replica.replica_id not in self._replicas
            or sum(r.breaker.state(now) != "closed" for r in self._replicas.values()) < self.max_ejected(health)
        )
        if replica.request_failed(health, error, may_open):
            return "opened"
        return "held" if not may_open and len(replica.breaker.faults) >= health.eject_after_failures else None

    def max_ejected(self, health: HealthConfig) -> int:
        """How many replicas the breakers may hold open at once: the share, rounded down, and at least one."""
        return max(1, len(self._replicas) * health.max_ejection_percent // 100)

    def num_available(self) -> int:
        now = time.monotonic()
        return sum(r.is_available(now) for r in self._replicas.values())

    def track(self, replica: Replica) -> Tracked:
        """Hold for the request's whole life at the replica (`with pool.track(replica):`): the count is exact on
        every exit path. A half-open breaker's trial slot is taken here and given back however the request ends."""
        return Tracked(replica)
