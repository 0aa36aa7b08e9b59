"""Admission control: per-replica and per-tenant concurrency caps and bounded waiting lines per pool.

When every healthy replica of a pool already holds `max_in_flight_per_replica` requests, or the caller's
tenant already holds its cap of the pool's slots, a new request waits in its tenant's line of the pool
(`gateway.serving.fair_queue`: tenants served in turn, each line in order; at most `max_queue` waiting per
tenant, each at most `queue_timeout_s`). It is routed only when a slot frees, so the policy sees the load of that moment
rather than of its arrival. A full queue or a wait past the timeout answers 429 with `Retry-After`:
overload is a signal to back off, never a 500 or a connection left hanging.

A tenant under its fair share of a full pool, while another holds more than its own, is not made to wait for
that tenant's requests to end (they may be streams of minutes): it borrows a slot of a replica holding fewer
than `max_in_flight_per_replica × borrow_factor` (`FairQueue.may_borrow`). Each tenant borrows at most up to
its fair share, so the pool's overcommit is at most its slots, and lasts as long as the borrowing requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from gateway.config.sections import AdmissionConfig
from gateway.errors import RateLimitError
from gateway.request.exchange import NO_TRACE, RequestTrace
from gateway.serving.fair_queue import ANYONE, FairQueue, Share

if TYPE_CHECKING:
    from gateway.config.features import ApiKeyConfig
    from gateway.replicas import Replica, ReplicaPool
    from gateway.replicas.pool import Tracked
    from gateway.request.decision import Candidate, Decision
    from gateway.routing.model_route import ModelRoute
    from gateway.view import RequestView


class Holding:
    """A request's slot at a replica, counted to its tenant (`PoolQueue.holding`); a class, as every request
    enters one."""

    __slots__ = ("_lines", "_tracked", "_share")

    def __init__(self, lines: FairQueue, tracked: Tracked, share: Share) -> None:
        self._lines, self._tracked, self._share = lines, tracked, share

    def __enter__(self) -> Replica:
        self._lines.hold(self._share)
        try:
            return self._tracked.__enter__()
        except BaseException:
            self._release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self._tracked.__exit__()
        finally:
            self._release()

    def _release(self) -> None:
        self._lines.release(self._share)
        self._lines.wake()


class PoolQueue:
    """The waiting lines of one pool (`gateway.serving.fair_queue`: one per tenant, served in turn); a request
    leaving a replica (`holding`) wakes the next in turn."""

    def __init__(self, pool: ReplicaPool, on_wait: Callable[[float], None]) -> None:
        self.pool = pool
        self.lines = FairQueue()
        self._on_wait = on_wait  # seconds waited → metrics

    def __len__(self) -> int:
        return len(self.lines)

    async def candidates(
        self, exclude: Collection[str], config: AdmissionConfig, model: str, share: Share = ANYONE
    ) -> list[Candidate]:
        """Healthy candidates with a free slot once the tenant may take one, waiting for it in the tenant's line;
        [] when none is healthy."""
        cap = config.max_in_flight_per_replica
        available = self.pool.candidates(exclude)
        if not available or not (cap or share.cap):
            return available
        room = [c for c in available if c.in_flight < cap] if cap else available
        if room:
            woke = bool(self.lines) and self.lines.wake()  # room appeared without a release: the next in turn first
            if not woke and self.lines.may_hold(share):
                return room
        elif borrowed := self.borrowable(available, config, share):
            return borrowed
        if self.lines.line_length(share) >= config.max_queue:
            message = (
                f"every replica for model {model!r} is at capacity and the queue is full"
                if self.lines.may_hold(share)
                else f"tenant {share.tenant!r} holds its {share.cap} slots of model {model!r} and its queue is full"
            )
            raise RateLimitError(message, retry_after_s=config.retry_after_s)
        loop = asyncio.get_running_loop()
        started = loop.time()
        waiter = self.lines.join(share)
        served = False
        try:
            async with asyncio.timeout_at(started + config.queue_timeout_s):
                while True:
                    await waiter
                    available = self.pool.candidates(exclude)  # fresh state, at dequeue time
                    room = [c for c in available if c.in_flight < cap] if cap else available
                    if not available or (room and self.lines.may_hold(share, woken=True)):
                        served = bool(room)
                        return room
                    waiter = self.lines.rejoin(share)  # the slot went elsewhere, or is over the tenant's cap: stay
                    if room:  # first in line; a free slot is the next tenant's to take
                        self.lines.wake()
        except TimeoutError:
            raise RateLimitError(
                f"waited {config.queue_timeout_s:g}s for a free replica for model {model!r}",
                retry_after_s=config.retry_after_s,
            ) from None
        finally:
            self._on_wait(loop.time() - started)
            self.lines.leave(share, waiter, served)

    def borrowable(self, available: list[Candidate], config: AdmissionConfig, share: Share) -> list[Candidate]:
        """The replicas of a full pool (every one of `available` at its cap) the tenant may borrow a slot of:
        those under `max_in_flight_per_replica × borrow_factor`, when `FairQueue.may_borrow` says it may;
        else []. The slots shared out are those of the replicas this request may use."""
        cap = config.max_in_flight_per_replica
        limit = int(cap * config.borrow_factor)
        if limit <= cap or any(c.in_flight < cap for c in available):
            return []
        if not self.lines.may_borrow(share, cap * len(available)):
            return []
        return [c for c in available if c.in_flight < limit]

    def holding(self, replica: Replica, share: Share = ANYONE) -> Holding:
        """Hold a slot of `replica` (`pool.track`) for the request's whole life there (`with queue.holding(...)`),
        counted to its tenant; its release wakes the next in turn."""
        return Holding(self.lines, self.pool.track(replica), share)


class Admission:
    """Queues per pool (kept across reloads, like the pools) and the capped choice of a replica."""

    def __init__(
        self, queue_wait: Callable[[str, float], None], borrowed: Callable[[str, str], None] = lambda m, t: None
    ) -> None:
        self._queues: dict[str, PoolQueue] = {}
        self._queue_wait = queue_wait
        self._borrowed = borrowed  # (model, tenant) of each slot borrowed → metrics

    def queue(self, route: ModelRoute) -> PoolQueue:
        queue = self._queues.get(route.model)
        if queue is None or queue.pool is not route.pool:
            queue = self._queues[route.model] = PoolQueue(route.pool, lambda s: self._queue_wait(route.model, s))
        return queue

    def waiting(self) -> dict[str, int]:
        return {model: len(queue) for model, queue in self._queues.items()}

    def tenants_waiting(self) -> dict[tuple[str, str], int]:
        """Waiters by (model, tenant), for `affinity_gateway_tenant_queue_waiting`."""
        return {(model, t): n for model, queue in self._queues.items() for t, n in queue.lines.waiting().items()}

    async def choose(
        self,
        route: ModelRoute,
        view: RequestView,
        exclude: Collection[str],
        config: AdmissionConfig,
        trace: RequestTrace = NO_TRACE,
        share: Share = ANYONE,
    ) -> tuple[Replica, Decision] | None:
        """Decide among replicas with a free slot; None when no replica is healthy. The decision is not
        committed: the caller commits it (`router.dispatched`) once it holds the slot (`PoolQueue.holding`),
        with no await between this return and that."""
        queue = self.queue(route)
        while True:
            waiting = queue.candidates(exclude, config, route.model, share)
            candidates = await trace.admission(waiting)
            if not candidates:
                return None
            deciding = route.router.decide(view, candidates)
            decision = await trace.routing(deciding, route.routing.policy)
            replica = route.pool.get(decision.replica_id)
            if replica is None:
                raise RuntimeError(f"policy {route.routing.policy} chose unknown replica {decision.replica_id!r}")
            cap = config.max_in_flight_per_replica
            if (not cap or replica.in_flight < cap) and queue.lines.may_hold(share):  # no await from here to
                return replica, decision  # pool.track: the slot is ours
            if cap and replica.in_flight >= cap:  # chosen among borrowable ones, or the pool filled meanwhile
                borrowable = queue.borrowable(route.pool.candidates(exclude), config, share)
                if any(c.replica_id == replica.replica_id for c in borrowable):
                    self._borrowed(route.model, share.tenant or "")
                    return replica, decision


def share_of(key: ApiKeyConfig | None, config: AdmissionConfig) -> Share:
    """The caller's tenant, its cap (the key's `max_in_flight`, else `max_in_flight_per_tenant`) and weight."""
    if key is None:
        return ANYONE
    cap = config.max_in_flight_per_tenant if key.max_in_flight is None else key.max_in_flight
    return Share(key.tenant, cap, key.weight)
