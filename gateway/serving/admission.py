"""Admission control: per-replica concurrency caps and a bounded FIFO queue per pool.

When every healthy replica of a pool already holds `max_in_flight_per_replica` requests, a new
request waits in its pool's queue (FIFO; at most `max_queue` waiting, each at most
`queue_timeout_s`). It is routed only when a slot frees, so the policy sees the load of that moment
rather than of its arrival. A full queue or a wait past the timeout answers 429 with `Retry-After`:
overload is a signal to back off, never a 500 or a connection left hanging.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from gateway.config.sections import AdmissionConfig
from gateway.errors import RateLimitError
from gateway.request.exchange import NO_TRACE, RequestTrace

if TYPE_CHECKING:
    from gateway.replicas import Replica, ReplicaPool
    from gateway.request.decision import Candidate, Decision
    from gateway.routing.model_route import ModelRoute
    from gateway.view import RequestView


class PoolQueue:
    """The waiting line of one pool; a request leaving a replica (`holding`) wakes the head of the line."""

    def __init__(self, pool: ReplicaPool, on_wait: Callable[[float], None]) -> None:
        self.pool = pool
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._on_wait = on_wait  # seconds waited → metrics

    def __len__(self) -> int:
        return len(self._waiters)

    async def candidates(self, exclude: Collection[str], config: AdmissionConfig, model: str) -> list[Candidate]:
        """Healthy candidates with a free slot, waiting for one in FIFO order; [] when none is healthy."""
        cap = config.max_in_flight_per_replica
        available = self.pool.candidates(exclude)
        if not cap or not available:
            return available
        room = [c for c in available if c.in_flight < cap]
        if room and not self._waiters:
            return room
        if room:
            self._wake()  # room appeared without a release (a replica came back): the head goes first
        if len(self._waiters) >= config.max_queue:
            raise RateLimitError(
                f"every replica for model {model!r} is at capacity and the queue is full",
                retry_after_s=config.retry_after_s,
            )
        loop = asyncio.get_running_loop()
        started = loop.time()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        served = False
        try:
            async with asyncio.timeout_at(started + config.queue_timeout_s):
                while True:
                    await waiter
                    available = self.pool.candidates(exclude)  # fresh state, at dequeue time
                    room = [c for c in available if c.in_flight < cap]
                    if room or not available:
                        served = bool(room)
                        return room
                    waiter = loop.create_future()  # the slot went elsewhere: stay first in line
                    self._waiters.appendleft(waiter)
        except TimeoutError:
            raise RateLimitError(
                f"waited {config.queue_timeout_s:g}s for a free replica for model {model!r}",
                retry_after_s=config.retry_after_s,
            ) from None
        finally:
            self._on_wait(loop.time() - started)
            if not waiter.done():
                self._waiters.remove(waiter)
            elif not served:
                self._wake()  # pass on a wake-up this request can no longer use

    @contextmanager
    def holding(self, replica: Replica) -> Iterator[Replica]:
        """Hold a slot of `replica` (`pool.track`) for the request's whole life there; its release wakes the
        head of the line."""
        try:
            with self.pool.track(replica):
                yield replica
        finally:
            self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


class Admission:
    """Queues per pool (kept across reloads, like the pools) and the capped choice of a replica."""

    def __init__(self, queue_wait: Callable[[str, float], None]) -> None:
        self._queues: dict[str, PoolQueue] = {}
        self._queue_wait = queue_wait

    def queue(self, route: ModelRoute) -> PoolQueue:
        queue = self._queues.get(route.model)
        if queue is None or queue.pool is not route.pool:
            queue = self._queues[route.model] = PoolQueue(route.pool, lambda s: self._queue_wait(route.model, s))
        return queue

    def waiting(self) -> dict[str, int]:
        return {model: len(queue) for model, queue in self._queues.items()}

    async def choose(
        self,
        route: ModelRoute,
        view: RequestView,
        exclude: Collection[str],
        config: AdmissionConfig,
        trace: RequestTrace = NO_TRACE,
    ) -> tuple[Replica, Decision] | None:
        """Decide among replicas with a free slot; None when no replica is healthy. The decision is not
        committed: the caller commits it (`router.dispatched`) once it holds the slot (`PoolQueue.holding`),
        with no await between this return and that."""
        queue = self.queue(route)
        while True:
            waiting = queue.candidates(exclude, config, route.model)
            candidates = await trace.admission(waiting)
            if not candidates:
                return None
            deciding = route.router.decide(view, candidates)
            decision = await trace.routing(deciding, route.routing.policy)
            replica = route.pool.get(decision.replica_id)
            if replica is None:
                raise RuntimeError(f"policy {route.routing.policy} chose unknown replica {decision.replica_id!r}")
            cap = config.max_in_flight_per_replica
            if not cap or replica.in_flight < cap:  # no await from here to pool.track: the slot is ours
                return replica, decision
