"""ReplicaPool: the replicas serving one model, and the Candidates a policy sees for one request.

Usage:
    pool = ReplicaPool("llama", [Replica.from_config(r) for r in pool_config.replicas])
    candidates = pool.candidates(exclude={"r1"})      # healthy replicas only, as policy input
    with pool.track(replica):                          # in-flight +1 for the whole relay, -1 on any exit
        ...

Single-threaded asyncio: no locks, and no awaits between reading and changing a count.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager

from gateway.replicas.replica import Replica
from gateway.request.decision import Candidate


class ReplicaPool:
    def __init__(self, model: str, replicas: Iterable[Replica] = ()) -> None:
        self.model = model
        self._replicas: dict[str, Replica] = {}
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
        now = time.monotonic()
        return [
            Candidate(r.replica_id, r.weight, r.in_flight, r.load.running, r.load.waiting, r.load.kv_usage)
            for r in self._replicas.values()
            if r.is_available(now) and r.replica_id not in exclude
        ]

    def num_available(self) -> int:
        now = time.monotonic()
        return sum(r.is_available(now) for r in self._replicas.values())

    @contextmanager
    def track(self, replica: Replica) -> Iterator[Replica]:
        """Hold for the request's whole life at the replica: the count is exact on every exit path.
        A half-open breaker's trial slot is taken here and given back however the request ends."""
        trial = replica.breaker.dispatched(time.monotonic())
        replica.in_flight += 1
        try:
            yield replica
        finally:
            replica.in_flight -= 1
            if trial:
                replica.breaker.end_trial()
