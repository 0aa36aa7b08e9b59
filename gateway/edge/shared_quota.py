"""One rate-limit quota per API key for the whole fleet, when the gateways share a Redis (`redis:`).

The rule is `gateway.edge.sliding_window`'s: no window of `auth.rate_limit_window_s` (a minute), aligned
or not, admits more than the key's limit, whichever gateways the requests came through. Each gateway
draws leases from the key's bucketed counts in Redis (a Lua script grants min(wanted, limit − used over
the window), counted in the bucket of the grant) and spends them locally, so a request costs no round
trip until its gateway's lease runs out. A lease is a twentieth of the quota and lives one bucket (1 s
of a minute): a unit spent later than that could fall outside the window Redis counted it in, so it is
void, and the window Redis counts is one bucket longer to cover a lease's life. What a lease leaves
unspent is given back (subtracted from its bucket, in the background) when the gateway next sees the
key; until then N gateways hold back at most N/20 of the quota (a key is turned away a little early,
never late).
Token charges that only become known later (completion tokens, a prompt larger than the lease) are
added to the current bucket as owed, past the limit if need be; the key's next requests then wait until
enough of its window has aged out. Buckets are numbered by the gateways' wall clocks: keep them in sync
(NTP).

Redis unreachable: `admit` answers None and the caller enforces its local windows instead (the same
rule, each gateway the key's full quota), `degraded` is set for `/ready`, and Redis is tried again
after RETRY_S.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.edge.sliding_window import BUCKETS, SCRIPT, SPAN, seconds_until

if TYPE_CHECKING:
    from gateway.config.loader import Config

LEASE_SHARE = 0.05  # of the window's quota, per lease
TIMEOUT_S = 0.25  # a Redis that takes longer than this is treated as down for RETRY_S
RETRY_S = 1.0
_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


@dataclass(slots=True)
class _Lease:
    until: float = 0.0  # time.monotonic() past which what is left is void (and given back)
    left: int = 0  # granted by Redis, not spent yet
    bucket: int = 0  # the bucket Redis counted the grant in


class SharedQuota:
    def __init__(self, url: str, key_prefix: str, window_s: float = 60.0) -> None:
        self._redis = aioredis.from_url(  # one for the app's life, named in CLIENT LIST
            url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S, client_name="affinity-gateway-quota"
        )
        self._grant = self._redis.register_script(SCRIPT)
        self._prefix = f"{key_prefix}ratelimit:"
        self._width = window_s / BUCKETS
        self._expire_s = math.ceil(SPAN * self._width) + 1
        self._leases: dict[tuple[str, str], _Lease] = {}
        self._retry_at = 0.0
        self._owed: set[asyncio.Task[None]] = set()
        self.degraded = False

    @classmethod
    def for_config(cls, config: Config) -> SharedQuota | None:
        """Rate limits are the fleet's where the gateways share a Redis (`redis`; a change needs a restart)."""
        redis = config.redis
        return (
            cls(redis.resolved_url, redis.key_prefix, config.auth.rate_limit_window_s)
            if redis is not None and config.auth.enabled
            else None
        )

    async def admit(self, digest: str, kind: str, limit: float, amount: int, *, whole: bool) -> float | None:
        """Charge `amount` to the key's quota of `kind`. `whole`: all of it must fit (requests); else any room
        admits and the rest is owed (tokens). 0.0: admitted; > 0: refused, the seconds until it would fit;
        None: Redis is unreachable."""
        lease = self._lease(digest, kind)
        need = amount if whole else 1
        if lease.left < need:
            now = time.time()
            granted = await self._draw(digest, kind, now, limit, need)
            if granted is None:
                return None
            if granted[0] < need:
                return max(seconds_until(granted[1], self._width, now), 0.001)
            lease.left, lease.until, lease.bucket = granted[0], time.monotonic() + self._width, granted[2]
        self.charge(digest, kind, amount)
        return 0.0

    def charge(self, digest: str, kind: str, amount: int) -> None:
        """Spend from the lease; what it does not cover is added to the current bucket in the background."""
        lease = self._lease(digest, kind)
        lease.left -= amount
        if lease.left < 0 and time.monotonic() >= self._retry_at:
            owed, lease.left = -lease.left, 0
            self._later(self._add(self._key(digest, kind), owed, math.floor(time.time() / self._width)))

    async def close(self) -> None:
        for task in list(self._owed):
            task.cancel()
        await self._redis.aclose()

    def _key(self, digest: str, kind: str) -> str:
        return f"{self._prefix}{digest}:{kind}"

    def _lease(self, digest: str, kind: str) -> _Lease:
        lease = self._leases.get((digest, kind))
        if lease is None:
            lease = self._leases[(digest, kind)] = _Lease()
        elif lease.left > 0 and time.monotonic() >= lease.until:  # outlived its bucket: void, given back
            self._later(self._add(self._key(digest, kind), -lease.left, lease.bucket))
            lease.left = 0
        return lease

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._owed.add(task)
        task.add_done_callback(self._owed.discard)

    async def _draw(self, digest: str, kind: str, now: float, limit: float, need: int) -> tuple[int, int, int] | None:
        """(granted, the bucket from which `need` fits when it did not, the bucket counted) from Redis; None
        when unreachable."""
        if time.monotonic() < self._retry_at:
            return None
        want = max(need, math.ceil(limit * LEASE_SHARE))
        bucket = math.floor(now / self._width)
        try:
            granted, fits_from = await self._grant(
                keys=[self._key(digest, kind)], args=[bucket, SPAN, math.floor(limit), want, need, self._expire_s]
            )
        except _ERRORS:
            self._retry_at, self.degraded = time.monotonic() + RETRY_S, True
            return None
        self.degraded = False
        return int(granted), int(fits_from), bucket

    async def _add(self, key: str, amount: int, bucket: int) -> None:
        """Owed units (> 0) into the current bucket, or a lease's unspent ones (< 0) out of its own."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hincrby(key, str(bucket), amount)
                pipe.expire(key, self._expire_s)
                await pipe.execute()
        except _ERRORS:
            self._retry_at, self.degraded = time.monotonic() + RETRY_S, True
