"""Fair admission between tenants: one waiting line per tenant, served in turn, and a cap on the slots one
tenant holds in a pool.

Why: with one FIFO per pool, a tenant that opens many long requests within its rate quota takes every slot
and fills the queue, and every other tenant gets 429s (rate limits count requests and tokens, not
concurrency). As llm-d's flow control and nginx's `limit_conn` do, a tenant here holds at most its cap of a
pool's slots (`admission.max_in_flight_per_tenant`, `auth.keys[].max_in_flight`); past it, its requests
wait in its own line, bounded by `admission.max_queue`, and no other tenant waits behind them. A freed slot
goes to the next tenant in turn that has a waiter and is under its cap: weighted round robin, a tenant of
`weight` w served up to w times per turn.

A cap is the operator's choice; on the defaults there is none, and a tenant alone may take every slot (nothing
reserved, nothing idle). So that a tenant holding every slot with long streams cannot make the others wait for
one of them to end, a tenant under its fair share of a full pool (the pool's slots divided among the tenants
holding or waiting there, by weight) may borrow a slot past `max_in_flight_per_replica` while another tenant
holds more than its own share (`may_borrow`; `gateway.serving.admission` bounds it per replica). vLLM batches
continuously, so the replica takes it: the slot cap is the gateway's own.

Callers without a key (auth off) are one tenant, `None`, never capped and never borrowing: then there is one
line, served in order, exactly the pool's FIFO, and nothing is counted per request.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from gateway.support.records import record


@record
class Share:
    """What one tenant may hold of a pool (`cap` slots, 0 = no cap) and how often it is served (`weight`)."""

    tenant: str | None
    cap: int = 0
    weight: int = 1


ANYONE = Share(None)


@dataclass(slots=True)
class _Tenant:
    """One tenant's standing in a pool: its line, the slots it holds, the waiters woken but not yet back."""

    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)
    held: int = 0
    woken: int = 0
    cap: int = 0  # as the tenant's latest request gave it (a reload applies with its next request)
    weight: int = 1
    credit: int = 1  # turns left before the next tenant's

    @property
    def idle(self) -> bool:
        return not (self.waiters or self.held or self.woken)


class FairQueue:
    """The waiting lines of one pool, by tenant, and the slots each tenant holds there."""

    def __init__(self) -> None:
        self._tenants: dict[str | None, _Tenant] = {}
        self._turns: deque[str | None] = deque()  # tenants with a waiter, in serving order
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def waiting(self) -> dict[str, int]:
        """Waiters by tenant ("" for callers without a key), for the per-tenant gauge."""
        return {name or "": len(t.waiters) for name, t in self._tenants.items() if t.waiters}

    def may_hold(self, share: Share, woken: bool = False) -> bool:
        """Whether the tenant is under its cap. Its woken waiters count (they are on their way to a slot), but
        not the caller itself when it is one of them (`woken`)."""
        if not share.cap:
            return True
        tenant = self._tenants.get(share.tenant)
        return tenant is None or tenant.held + tenant.woken - woken < share.cap

    def may_borrow(self, share: Share, slots: int) -> bool:
        """Whether the tenant may take a slot past the pool's `slots`, every one held: it has no waiter of its own
        (none is passed), is under its cap and under its fair share (`slots` × its weight over the weights of
        the tenants holding or waiting, itself included), while another tenant holds more than its own share."""
        if share.tenant is None:
            return False
        tenant = self._tenants.get(share.tenant)
        held = 0 if tenant is None else tenant.held + tenant.woken
        if tenant is not None and tenant.waiters or share.cap and held >= share.cap:
            return False
        others = [t for name, t in self._tenants.items() if name != share.tenant]
        weights = share.weight + sum(t.weight for t in others)
        if held * weights >= slots * share.weight:  # at its share or over it (alone: every slot is its share)
            return False
        return any((t.held + t.woken) * weights > slots * t.weight for t in others)

    def line_length(self, share: Share) -> int:
        tenant = self._tenants.get(share.tenant)
        return len(tenant.waiters) if tenant is not None else 0

    def hold(self, share: Share) -> None:
        if share.tenant is not None:
            self._tenant(share).held += 1

    def release(self, share: Share) -> None:
        if share.tenant is not None:
            tenant = self._tenants[share.tenant]
            tenant.held -= 1
            self._forget_if_idle(share.tenant, tenant)

    def join(self, share: Share) -> asyncio.Future[None]:
        """A new waiter at the end of the tenant's line."""
        tenant = self._tenant(share)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        tenant.waiters.append(waiter)
        self._size += 1
        if len(tenant.waiters) == 1:
            tenant.credit = tenant.weight
            self._turns.append(share.tenant)
        return waiter

    def rejoin(self, share: Share) -> asyncio.Future[None]:
        """A woken waiter that found no slot it may take: first in its line again, its tenant's turn first."""
        tenant = self._tenants[share.tenant]
        tenant.woken -= 1
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        tenant.waiters.appendleft(waiter)
        self._size += 1
        if len(tenant.waiters) > 1:
            self._turns.remove(share.tenant)
        tenant.credit = min(tenant.credit + 1, tenant.weight)
        self._turns.appendleft(share.tenant)
        return waiter

    def leave(self, share: Share, waiter: asyncio.Future[None], served: bool) -> None:
        """The waiter's request is done waiting: admitted (`served`), timed out or cancelled. A wake-up it got
        but cannot use goes to the next in turn, so a slot never stays free while someone waits."""
        tenant = self._tenants.get(share.tenant)
        if tenant is None:  # a cancelled waiter `wake` dropped, its tenant gone idle since
            return
        if waiter.cancelled() or not waiter.done():  # never woken: out of the line
            if waiter in tenant.waiters:  # (a wake-up may have dropped it already: see `wake`)
                self._drop(share.tenant, tenant, waiter)
        else:
            tenant.woken -= 1
            if not served:
                self.wake()
        self._forget_if_idle(share.tenant, tenant)

    def wake(self) -> bool:
        """Wake the first waiter of the next tenant in turn that is under its cap; False when none is."""
        i = 0
        while i < len(self._turns):
            name = self._turns[i]
            tenant = self._tenants[name]
            if tenant.cap and tenant.held + tenant.woken >= tenant.cap:
                i += 1
                continue
            waiter = tenant.waiters.popleft()
            self._size -= 1
            if waiter.done():  # cancelled, its task not yet run to `leave`: the next one in this line
                if not tenant.waiters:
                    del self._turns[i]
                continue
            waiter.set_result(None)
            tenant.woken += 1
            tenant.credit -= 1
            if not tenant.waiters or tenant.credit <= 0:
                del self._turns[i]
                if tenant.waiters:
                    tenant.credit = tenant.weight
                    self._turns.append(name)
            return True
        return False

    def _tenant(self, share: Share) -> _Tenant:
        tenant = self._tenants.get(share.tenant)
        if tenant is None:
            tenant = self._tenants[share.tenant] = _Tenant()
        tenant.cap, tenant.weight = share.cap, share.weight
        return tenant

    def _drop(self, name: str | None, tenant: _Tenant, waiter: asyncio.Future[None]) -> None:
        tenant.waiters.remove(waiter)
        self._size -= 1
        if not tenant.waiters:
            self._turns.remove(name)

    def _forget_if_idle(self, name: str | None, tenant: _Tenant) -> None:
        if tenant.idle:
            del self._tenants[name]
