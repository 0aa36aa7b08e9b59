"""One rate-limit quota per API key for the whole fleet, when the index is Redis.

Each gateway draws leases from a counter per key, kind and minute window in Redis (a Lua script
grants min(wanted, limit − used)) and spends them locally, so a request costs no round trip until
its gateway's lease runs out. A lease is a twentieth of the minute's quota: N gateways hold back at
most N/20 of it unspent (a key is turned away a little early, never late). Token charges that
only become known later (completion tokens, a prompt larger than the lease) are added to the
counter as owed, past the limit if need be; the key's next requests then wait for the next window.
Windows are wall-clock minutes: keep the gateways' clocks in sync (NTP).

Redis unreachable: `admit` answers None and the caller enforces its local buckets instead (each
gateway the key's full quota), `degraded` is set for `/ready`, and Redis is tried again after
RETRY_S.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
from redis.exceptions import RedisError

if TYPE_CHECKING:
    from gateway.config.loader import Config

LEASE_SHARE = 0.05  # of the minute's quota, per lease
TIMEOUT_S = 0.25  # a Redis that takes longer than this is treated as down for RETRY_S
RETRY_S = 1.0
_ERRORS = (RedisError, OSError, asyncio.TimeoutError)
_GRANT = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local grant = math.min(tonumber(ARGV[2]), tonumber(ARGV[1]) - used)
if grant <= 0 then return 0 end
redis.call('INCRBY', KEYS[1], grant)
redis.call('EXPIRE', KEYS[1], 120)
return grant
"""


@dataclass(slots=True)
class _Lease:
    window: int
    left: int = 0  # granted by Redis, not spent yet


class SharedQuota:
    def __init__(self, url: str, key_prefix: str) -> None:
        self._redis = aioredis.from_url(  # one for the app's life, named in CLIENT LIST
            url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S, client_name="affinity-gateway-quota")
        self._grant = self._redis.register_script(_GRANT)
        self._prefix = f"{key_prefix}ratelimit:"
        self._leases: dict[tuple[str, str], _Lease] = {}
        self._retry_at = 0.0
        self._owed: set[asyncio.Task[None]] = set()
        self.degraded = False

    @classmethod
    def for_config(cls, config: Config) -> SharedQuota | None:
        """Rate limits are the fleet's where the gateways share a Redis (`redis`; a change needs a restart)."""
        redis = config.redis
        return cls(redis.resolved_url, redis.key_prefix) if redis is not None and config.auth.enabled else None

    async def admit(self, digest: str, kind: str, per_minute: float, amount: int, *, whole: bool) -> bool | None:
        """Charge `amount` to the key's quota of `kind` this minute. `whole`: all of it must fit (requests);
        else any room admits and the rest is owed (tokens). None: Redis is unreachable."""
        window = int(time.time() // 60)
        lease = self._lease(digest, kind, window)
        need = amount if whole else 1
        if lease.left < need:
            granted = await self._draw(digest, kind, window, per_minute, need - lease.left)
            if granted is None:
                return None
            lease.left += granted
            if lease.left < need:
                return False
        self.charge(digest, kind, amount)
        return True

    def charge(self, digest: str, kind: str, amount: int) -> None:
        """Spend from the lease; what it does not cover is added to the counter in the background."""
        window = int(time.time() // 60)
        lease = self._lease(digest, kind, window)
        lease.left -= amount
        if lease.left < 0 and time.monotonic() >= self._retry_at:
            owed, lease.left = -lease.left, 0
            task = asyncio.get_running_loop().create_task(self._add(f"{self._prefix}{digest}:{kind}:{window}", owed))
            self._owed.add(task)
            task.add_done_callback(self._owed.discard)

    async def close(self) -> None:
        for task in list(self._owed):
            task.cancel()
        await self._redis.aclose()

    def _lease(self, digest: str, kind: str, window: int) -> _Lease:
        lease = self._leases.get((digest, kind))
        if lease is None or lease.window != window:  # a new minute: last minute's lease is void
            lease = self._leases[(digest, kind)] = _Lease(window)
        return lease

    async def _draw(self, digest: str, kind: str, window: int, per_minute: float, short: int) -> int | None:
        if time.monotonic() < self._retry_at:
            return None
        want = max(short, math.ceil(per_minute * LEASE_SHARE))
        try:
            granted = await self._grant(keys=[f"{self._prefix}{digest}:{kind}:{window}"],
                                        args=[math.floor(per_minute), want])
        except _ERRORS:
            self._retry_at, self.degraded = time.monotonic() + RETRY_S, True
            return None
        self.degraded = False
        return int(granted)

    async def _add(self, key: str, amount: int) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.incrby(key, amount)
                pipe.expire(key, 120)
                await pipe.execute()
        except _ERRORS:
            self._retry_at, self.degraded = time.monotonic() + RETRY_S, True
