"""Response homes in the Redis the gateways share (the top-level `redis:`), so that a Responses API
follow-up reaches the replica that stored its response through whichever gateway it comes.

One string per response, `<key_prefix>response:<id>` = `["pool","replica"]` (JSON: any pool or replica
name round-trips), expiring `redis.response_ttl_s` after it was written. vLLM keeps a stored response in
its memory until it restarts, so the TTL only bounds what Redis holds; a home that outlived its replica's
memory leads to vLLM's own 404, as it would without the gateway.

Writes never wait on Redis: `put` queues the home and wakes a background task that sends everything
queued in pipelines of SET .. PX, so writes made while a flush is in flight go out together with the
next. A follow-up reads its home with one GET (after the gateway's own table, which has every home it
made). Redis unreachable: reads answer None at once for RETRY_S (the caller asks the replicas instead),
writes stay queued (the oldest dropped past MAX_PENDING) and are retried every RETRY_S, and `degraded`
says so for `/ready`.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import suppress

import orjson
import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from gateway.support.bounded import put_newest

TIMEOUT_S = 0.25  # a Redis slower than this is treated as down for RETRY_S: a follow-up asks the replicas
RETRY_S = 1.0
MAX_BATCH = 500  # homes per pipeline: a backlog goes out in several, each well within TIMEOUT_S
MAX_PENDING = 10_000  # homes queued while Redis is down; the oldest are dropped (their follow-ups ask the replicas)
_ERRORS = (RedisError, OSError, asyncio.TimeoutError)

log = structlog.get_logger("gateway.relay.shared_homes")

Home = tuple[str, str]  # (pool, replica id)


class SharedHomes:
    def __init__(self, url: str, key_prefix: str, ttl_s: float) -> None:
        self._redis = aioredis.from_url(  # one for the app's life, named in CLIENT LIST
            url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S, client_name="affinity-gateway-homes"
        )
        self._prefix = f"{key_prefix}response:"
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._pending: dict[str, Home] = {}
        self._wake = asyncio.Event()
        self._retry_at = 0.0
        self.degraded = False

    def put(self, response_id: str, home: Home) -> None:
        """Queue the home for the background writer; the caller never waits."""
        put_newest(self._pending, response_id, home, MAX_PENDING)
        self._wake.set()

    async def get(self, response_id: str) -> Home | None:
        """The home another gateway (or this one) wrote; None when there is none or Redis is unreachable."""
        if time.monotonic() < self._retry_at:
            return None
        try:
            raw = await self._redis.get(f"{self._prefix}{response_id}")
        except _ERRORS:
            self._down()
            return None
        self._up()
        if raw is None:
            return None
        try:
            pool, replica = orjson.loads(raw)
        except (ValueError, TypeError):  # not written by a gateway (or another version's): as if absent
            return None
        return str(pool), str(replica)

    async def flush(self) -> bool:
        """Write every queued home, MAX_BATCH to a pipeline (True: none left); on failure keep them for the next
        try."""
        while self._pending:
            if not await self._flush_batch():
                return False
        return True

    async def _flush_batch(self) -> bool:
        if len(self._pending) <= MAX_BATCH:
            batch, self._pending = self._pending, {}
        else:
            ids = list(self._pending)[:MAX_BATCH]
            batch = {response_id: self._pending.pop(response_id) for response_id in ids}
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for response_id, home in batch.items():
                    pipe.set(f"{self._prefix}{response_id}", orjson.dumps(home), px=self._ttl_ms)
                await pipe.execute()
        except _ERRORS:
            self._pending = {**batch, **self._pending}  # older than anything queued since: in front of it
            while len(self._pending) > MAX_PENDING:
                del self._pending[next(iter(self._pending))]
            self._down()
            return False
        self._up()
        return True

    async def run(self) -> None:
        """The writer: flushes as soon as something is queued; while Redis is down, pings it every RETRY_S
        and flushes what waited once it answers (which also clears `degraded` for `/ready`)."""
        while True:
            if self.degraded:
                await asyncio.sleep(max(0.0, self._retry_at - time.monotonic()))
                if await self._ping():
                    await self.flush()
                continue
            await self._wake.wait()
            self._wake.clear()
            await self.flush()

    async def close(self) -> None:
        with suppress(*_ERRORS):
            await asyncio.wait_for(self.flush(), TIMEOUT_S * 2)  # homes made just before a drain
        await self._redis.aclose()

    async def _ping(self) -> bool:
        try:
            await self._redis.ping()
        except _ERRORS:
            self._down()
            return False
        self._up()
        return True

    def _down(self) -> None:
        if not self.degraded:
            log.warning("response_homes_redis_unreachable", detail="follow-ups ask the replicas in turn")
        self._retry_at, self.degraded = time.monotonic() + RETRY_S, True

    def _up(self) -> None:
        if self.degraded:
            log.info("response_homes_redis_back", queued=len(self._pending))
        self.degraded = False
