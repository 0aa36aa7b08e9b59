"""Warm-prefix tables in Redis, shared by any number of gateway processes.

Layout: one sorted set per replica, `<key_prefix>blocks:<replica_id>`, member = block hash,
score = last use (wall-clock seconds, comparable across gateways; a request's head blocks
score newest so trimming evicts tails first, as the replica does). Each table is trimmed to
the replica's capacity (ZREMRANGEBYRANK) and expires `ttl_s` after its last write, so a
removed replica's table disappears.

Lookup: one EVALSHA per request binary-searches every candidate's chain (a miss on the first
block ends it at once), probing likely answers first: the local table's (exact when this gateway
is the only writer) and the answers shared by earlier candidates, so most candidates cost one
ZMSCORE. Key names and hints travel as two packed strings and the reply is one string: at 64
candidates, argument encoding and reply parsing in redis-py cost more than the script does in
Redis. Standalone Redis only, as before (a pool's tables hash to different cluster slots).
Writes never wait on Redis: `record` updates a local `MemoryIndex` and queues the write; a
background task flushes the queue in pipelines (transaction=False) of EVALSHAs.
If Redis is unreachable or slow, lookups answer from the local table (this gateway's own
writes), the queue keeps (a bounded number of) writes, and a reconnect loop with backoff
flushes them once Redis is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
import time
from collections import deque
from collections.abc import Iterable, Sequence

import structlog
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError

from gateway.index.base import IndexParams
from gateway.index.memory import MemoryIndex

log = structlog.get_logger("gateway.index")

# Hashes travel as one packed string (8 bytes each, little-endian): encoding hundreds of
# separate integer arguments costs the client more than the whole lookup costs Redis.

# No KEYS (64 key arguments cost the client ~0.15 ms to encode, more than the whole script costs
# Redis; standalone Redis lets a script build its key names). ARGV[1]: packed hashes in chain
# order; ARGV[2]: per candidate, its hint (uint32, the local table's answer) and the byte length
# of its replica id (uint32), little-endian; ARGV[3]: the replica ids, concatenated; ARGV[4]: the
# tables' key prefix. Returns, per candidate, how many leading hashes its table holds, as one
# space-separated string (cheaper for the client to parse than a 64-element array).
# A table holds a chain's blocks as a prefix (see `_RECORD_LUA`), so presence is monotone along
# the chain and a binary search finds the answer. Its first pivots are guesses, each checked with
# one ZMSCORE of blocks g and g+1 (right if g is held and g+1 is not): the hint, then the commonest
# answer among earlier candidates, then the previous candidate's (candidates mostly share a few
# answers: a system prompt many hold, a conversation's home). A table that misses the first block
# costs one ZSCORE; a wrong guess still narrows the range; plain bisection (ZSCORE) finishes.
# (Probing all guesses in one ZMSCORE per candidate makes fewer calls but builds more Lua tables:
# slower, measured.)
_MATCH_LUA = """
local blob, meta, names, prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local n = #blob / 8
local sub, counts, out = {}, {}, {}
local best, prev, at = 0, 0, 1
local key, lo, hi
local function h(i)
  local s = sub[i]
  if not s then
    s = string.sub(blob, i * 8 - 7, i * 8)
    sub[i] = s
  end
  return s
end
local function probe(i)
  if redis.call('ZSCORE', key, h(i)) then lo = i else hi = i - 1 end
end
local function try(g)
  if lo < g and g < hi then
    local s = redis.call('ZMSCORE', key, h(g), h(g + 1))
    if not s[1] then hi = g - 1 elseif s[2] then lo = g + 1 else lo, hi = g, g end
  elseif lo < g and g == hi then
    probe(g)
  elseif lo == g and g < hi then
    probe(g + 1)
  end
end
for k = 1, #meta / 8 do
  local hint, len = struct.unpack('<I4I4', meta, k * 8 - 7)
  key = prefix .. string.sub(names, at, at + len - 1)
  at = at + len
  lo, hi = 0, n
  try(hint)
  try(best)
  try(prev)
  while lo < hi do probe(math.floor((lo + hi + 1) / 2)) end
  out[k] = lo
  counts[lo] = (counts[lo] or 0) + 1
  if counts[lo] > (counts[best] or 0) then best = lo end
  prev = lo
end
return table.concat(out, ' ')
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
_MAX_HINT = 2**32 - 1
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
        names = [r.encode() for r in ids]
        meta = struct.pack("<" + "II" * len(ids), *itertools.chain.from_iterable(
            (min(local[r], _MAX_HINT), len(name)) for r, name in zip(ids, names)))
        try:
            reply = await self._match(args=[pack(hashes), meta, b"".join(names), self.key("")])
        except _ERRORS as exc:
            self._fail(exc)
            return local
        # This gateway's newest writes may still be queued: take the longer of the two.
        return {r: max(int(n), local[r]) for r, n in zip(ids, reply.split())}

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
        # EVALSHA straight into the pipeline: a pipeline holding a Script object first checks
        # SCRIPT EXISTS, one more round trip per flush. A Redis that lost the script (restarted
        # between two flushes) answers NOSCRIPT: load it and send the batch again (replaying a
        # record or a delete in order leaves the same tables).
        ttl = max(1, int(self.params.ttl_s))
        for attempt in range(2):
            pipe = self._writer.pipeline(transaction=False)
            for replica_id, packed, ts in batch:
                key = self.key(replica_id)
                if packed is None:
                    pipe.delete(key)
                else:
                    pipe.evalsha(self._record.sha, 1, key, packed, ts, self.local.capacity(replica_id), ttl)
            try:
                await pipe.execute()
                return
            except NoScriptError:
                if attempt:
                    raise
                await self._writer.script_load(_RECORD_LUA)
