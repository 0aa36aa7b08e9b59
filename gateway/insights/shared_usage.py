"""The fleet's token and cost counters in Redis, when the gateways share one (the top-level `redis:`).

One hash per wall-clock minute, `<key_prefix>usage:<minute>`, field `["tenant","model","kind"]` (JSON:
any tenant or model name round-trips), expiring a day and an hour after its minute. Each gateway adds
its deltas in one MULTI/EXEC pipeline of HINCRBY / HINCRBYFLOAT, once a second (`gateway.insights.token_costs`
batches them; no request waits on Redis), so a batch is in Redis whole or not at all. A batch whose
EXEC reply is lost is sent again: counted twice, the one case that over-counts. A batch Redis
refuses is kept and sent with the next; counts never reach Redis only if the gateway dies within a
second of the request, or exits while Redis is down. Reading a window is one
pipeline of HGETALL, one per minute. Gateways' clocks should agree to the minute (NTP).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

TIMEOUT_S = 0.5  # a Redis that takes longer is down for this flush or this read
_ERRORS = (RedisError, OSError, asyncio.TimeoutError)
_FLOATS = ("cost", "saved")  # HINCRBYFLOAT; every other kind is an integer count

Batch = dict[tuple[int, str, str], dict[str, float]]  # (minute, tenant, model) -> kind -> amount


class SharedUsage:
    def __init__(self, url: str, key_prefix: str, expire_s: int) -> None:
        self._redis = aioredis.from_url(  # one for the app's life, named in CLIENT LIST
            url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S, client_name="affinity-gateway-usage"
        )
        self._prefix = f"{key_prefix}usage:"
        self._expire_s = expire_s
        self.degraded = False

    async def add(self, batch: Batch) -> bool:
        """Add every count of `batch` atomically; False (and `degraded`) when Redis is unreachable."""
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                keys = set()
                for (minute, tenant, model), counts in batch.items():
                    key = f"{self._prefix}{minute}"
                    keys.add(key)
                    for kind, amount in counts.items():
                        if not amount:
                            continue
                        field = orjson.dumps([tenant, model, kind])
                        if kind in _FLOATS:
                            pipe.hincrbyfloat(key, field, amount)
                        else:
                            pipe.hincrby(key, field, int(amount))
                for key in keys:
                    pipe.expire(key, self._expire_s)
                await pipe.execute()
        except _ERRORS:
            self.degraded = True
            return False
        self.degraded = False
        return True

    async def read(self, minutes: Iterable[int], tenant: str | None) -> dict[tuple[str, str], dict[str, float]] | None:
        """The fleet's counts per (tenant, model) over these minutes; None when Redis is unreachable."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for minute in minutes:
                    pipe.hgetall(f"{self._prefix}{minute}")
                answers = await pipe.execute()
        except _ERRORS:
            self.degraded = True
            return None
        self.degraded = False
        found: dict[tuple[str, str], dict[str, float]] = {}
        for answer in answers:
            for field, value in answer.items():
                row_tenant, model, kind = orjson.loads(field)
                if tenant is not None and row_tenant != tenant:
                    continue
                counts = found.setdefault((row_tenant, model), {})
                counts[kind] = counts.get(kind, 0) + (float(value) if kind in _FLOATS else int(value))
        return found

    async def close(self) -> None:
        await self._redis.aclose()
