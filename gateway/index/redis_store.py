"""Warm-prefix tables in Redis, shared by any number of gateway processes.

Layout: one sorted set per replica, `<key_prefix>blocks:<replica_id>`, member = block hash,
score = last use (wall-clock seconds, comparable across gateways; a request's head blocks
score newest so trimming evicts tails first, as the replica does). Each table is trimmed to
the replica's capacity (ZREMRANGEBYRANK) and expires `ttl_s` after its last write, so a
removed replica's table disappears.

Lookup: one EVALSHA per request binary-searches every candidate's chain (a miss on the first
block ends it at once). Writes never wait on Redis: `record` updates a local `MemoryIndex` and
queues the write; a background task flushes the queue in pipelines (transaction=False).
If Redis is unreachable or slow, lookups answer from the local table (this gateway's own
writes), the queue keeps (a bounded number of) writes, and a reconnect loop with backoff
flushes them once Redis is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections import deque
from collections.abc import Iterable, Sequence

import structlog
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.index.base import IndexParams
from gateway.index.memory import MemoryIndex

log = structlog.get_logger("gateway.index")

# Hashes travel as one packed string (8 bytes each, little-endian): encoding hundreds of
# separate integer arguments costs the client more than the whole lookup costs Redis.

# KEYS: the candidates' tables; ARGV[1]: packed hashes in chain order. Returns, per key, how
# many leading hashes the table holds, by binary search: a table holds a chain's blocks as a
# prefix (see `_RECORD_LUA`), so presence is monotone along the chain. ~log2(n) ZSCOREs per key.
_MATCH_LUA = """
local blob = ARGV[1]
local n = #blob / 8
local out = {}
for k = 1, #KEYS do
  local key = KEYS[k]
  local function has(i) return redis.call('ZSCORE', key, string.sub(blob, i * 8 - 7, i * 8)) end
  local lo, hi = 0, n
  if n > 0 and has(1) then
    lo = 1
    while lo < hi do
      local mid = math.floor((lo + hi + 1) / 2)
      if has(mid) then lo = mid else hi = mid - 1 end
    end
  end
  out[k] = lo
end
return out
"""

# KEYS[1]: one replica's table; ARGV: packed hashes, wall time, capacity, ttl seconds.
# Block i scores time - i µs and scores only grow (GT): every block then scores above its
# descendants, so the capacity trim drops tails first and a table holds each chain as a prefix.
_RECORD_LUA = """
local blob, now = ARGV[1], tonumber(ARGV[2])
local n = #blob / 8
local i = 0
while i < n do
  local args = {}
  for m = i, math.min(i + 1000, n) - 1 do
    args[#args + 1] = now - m * 0.000001
    args[#args + 1] = string.sub(blob, m * 8 + 1, m * 8 + 8)
  end
  redis.call('ZADD', KEYS[1], 'GT', unpack(args))
  i = i + 1000
end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[3]) + 1))
redis.call('EXPIRE', KEYS[1], ARGV[4])
return n
"""
_BATCH_BLOCKS = 50_000  # block hashes per flush pipeline, keeps Redis's reply buffer small
_ERRORS = (RedisError, OSError, asyncio.TimeoutError)

_Op = tuple[str, bytes | None, float]  # (replica_id, packed hashes or None = forget, wall time)


def pack(hashes: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(hashes)}Q", *hashes)


class RedisIndex:
    def __init__(self, params: IndexParams) -> None:
        self.params = params
        self.local = MemoryIndex(params.capacity_blocks)
        no_retry = Retry(NoBackoff(), 0)  # a dead Redis must cost one timeout, not three
        self._reader = Redis.from_url(params.store, socket_timeout=params.timeout_s,
                                      socket_connect_timeout=params.timeout_s, retry=no_retry)
        write_timeout = max(1.0, 20 * params.timeout_s)
        self._writer = Redis.from_url(params.store, socket_timeout=write_timeout,
                                      socket_connect_timeout=params.timeout_s, retry=no_retry)
        self._match = self._reader.register_script(_MATCH_LUA)
        self._record = self._writer.register_script(_RECORD_LUA)
        self._pending: deque[_Op] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()  # one pipeline at a time keeps writes in order
        self._degraded = False
        self.errors = 0  # failed Redis calls
        self.dropped_writes = 0  # records lost because the queue overflowed during an outage

    @property
    def degraded(self) -> bool:
        return self._degraded

    def key(self, replica_id: str) -> str:
        return f"{self.params.key_prefix}blocks:{replica_id}"

    async def match(self, hashes: Sequence[int], replica_ids: Iterable[str]) -> dict[str, int]:
        ids = list(replica_ids)
        local = self.local.match_now(hashes, ids)
        if self._degraded or not hashes or not ids:
            return local
        try:
            counts = await self._match(keys=[self.key(r) for r in ids], args=[pack(hashes)])
        except _ERRORS as exc:
            self._fail(exc)
            return local
        # This gateway's newest writes may still be queued: take the longer of the two.
        return {r: max(int(n), local[r]) for r, n in zip(ids, counts)}

    def record(self, replica_id: str, hashes: Sequence[int]) -> None:
        if hashes:
            self.local.record(replica_id, hashes)
            self._enqueue((replica_id, pack(hashes), time.time()))

    async def forget(self, replica_id: str) -> None:
        await self.local.forget(replica_id)
        self._enqueue((replica_id, None, time.time()))

    def set_capacity(self, replica_id: str, blocks: int) -> None:
        self.local.set_capacity(replica_id, blocks)

    async def close(self) -> None:
        """Flush what Redis takes within a second, then let go: never hangs on a sick Redis
        (a connection left mid-command by a timeout can block redis-py's aclose)."""
        if self._task is not None:
            if self._pending and not self._degraded:
                with contextlib.suppress(*_ERRORS):
                    await asyncio.wait_for(self.flush(), timeout=1.0)
            self._task.cancel()
            await asyncio.wait([self._task], timeout=1.0)
            self._task = None
        for client in (self._reader, self._writer):
            with contextlib.suppress(*_ERRORS):
                await asyncio.wait_for(client.aclose(), timeout=1.0)

    def _enqueue(self, op: _Op) -> None:
        if len(self._pending) >= self.params.max_pending_writes:
            self._pending.popleft()
            self.dropped_writes += 1
        self._pending.append(op)
        self._wake_flusher()

    def _wake_flusher(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flush_loop(), name="redis-index-flush")
        self._wake.set()

    def _fail(self, exc: BaseException) -> None:
        self.errors += 1
        if not self._degraded:
            self._degraded = True
            log.warning("index_redis_unreachable", store=self.params.store, error=repr(exc))
        self._wake_flusher()

    async def _flush_loop(self) -> None:
        """Flush queued writes as they come; while degraded, probe Redis with backoff."""
        backoff = 0.05
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending or self._degraded:
                try:
                    if self._degraded:
                        # A restarted Redis has lost the scripts: load them now, so the first
                        # lookup after recovery is one round trip, not a NOSCRIPT retry.
                        await self._writer.script_load(_MATCH_LUA)
                        await self._writer.script_load(_RECORD_LUA)
                        self._degraded = False
                        log.info("index_redis_recovered", store=self.params.store, queued=len(self._pending))
                    await self.flush()
                    backoff = 0.05
                except _ERRORS as exc:
                    self._fail(exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self.params.reconnect_max_s)

    async def flush(self) -> None:
        """Send queued writes in pipelines; on failure they go back to the front of the queue."""
        async with self._flushing:
            await self._flush_locked()

    async def _flush_locked(self) -> None:
        while self._pending:
            batch: list[_Op] = []
            blocks = 0
            while self._pending and blocks < _BATCH_BLOCKS:
                op = self._pending.popleft()
                batch.append(op)
                blocks += len(op[1] or b"") // 8
            try:
                await self._send(batch)
            except BaseException:
                self._pending.extendleft(reversed(batch))
                while len(self._pending) > self.params.max_pending_writes:
                    self._pending.popleft()  # the oldest writes matter least
                    self.dropped_writes += 1
                raise

    async def _send(self, batch: list[_Op]) -> None:
        pipe = self._writer.pipeline(transaction=False)
        ttl = max(1, int(self.params.ttl_s))
        for replica_id, packed, ts in batch:
            key = self.key(replica_id)
            if packed is None:
                pipe.delete(key)
            else:
                args = [packed, ts, self.local.capacity(replica_id), ttl]
                await self._record(keys=[key], args=args, client=pipe)
        await pipe.execute()
