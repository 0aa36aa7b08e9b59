"""Warm-prefix tables in Redis, shared by any number of gateway processes.

Layout: one sorted set per replica, `<key_prefix><model>:blocks:<replica_id>`, member = block hash,
score = last use (wall-clock seconds, comparable across gateways; a request's head blocks
score newest so trimming evicts tails first, as the replica does). Each table is trimmed to
the replica's capacity (ZREMRANGEBYRANK) and expires `ttl_s` after its last write, so a
removed replica's table disappears.

Lookups need no round trip: every gateway keeps a mirror of all the tables in memory
(`MemoryIndex`). Each write batch is also published on `<key_prefix><model>:ops`; a follower task
applies other gateways' batches to the mirror as they arrive. On (re)subscribing it loads a
snapshot of the sorted sets, replays this gateway's writes made meanwhile, and counts the
mirror as in sync once a marker it publishes comes back (everything published before the
marker is then applied). A route therefore costs what it costs with the memory store, and
Redis does work per write, not per lookup and candidate.

While the mirror is not in sync (starting, or resubscribing after Redis went away), or with
`mirror: false` (tables too large to hold in every gateway), one EVALSHA per request
binary-searches every candidate's chain in Redis (a miss on the first block ends it at once),
probing likely answers first: the local table's (this gateway's writes) and the answers
shared by earlier candidates, so most candidates cost one ZMSCORE. Key names and hints travel
as two packed strings and the reply is one string (at 64 candidates, argument encoding and
reply parsing in redis-py cost more than the script does in Redis). Standalone Redis only
(a pool's tables hash to different cluster slots).
Writes never wait on Redis: `record` updates the local tables and queues the write; a
background task flushes the queue in pipelines (transaction=False) of EVALSHAs plus one PUBLISH.
If Redis is unreachable or slow, lookups answer from the local tables, the queue keeps (a
bounded number of) writes, and a reconnect loop with backoff flushes them once Redis is back;
a broken subscription resubscribes and reloads. A Redis restarted empty empties the mirrors too
(every gateway then sees the same, and traffic refills it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import struct
import time
from collections import deque
from collections.abc import Iterable, Sequence

import structlog
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError

from gateway.config.env import mask_url_password
from gateway.config.features import IndexStore
from gateway.index import redis_wire as wire
from gateway.index.memory import MemoryIndex
from gateway.support.backoff import Backoff
from gateway.support.cancel import cancel_until_done

log = structlog.get_logger("gateway.index")

_BATCH_BLOCKS = 50_000  # block hashes per flush pipeline, keeps Redis's reply buffer small
_SNAPSHOT_PAGE = 10_000  # members per ZRANGE while loading a snapshot: the event loop parses each page
_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


class RedisIndex:
    def __init__(self, store: IndexStore) -> None:
        assert store.url is not None, "a Redis index needs the shared Redis's URL"
        self.store = store
        params = self.params = store.params
        url, self.key_prefix = store.url, store.key_prefix
        self._where = mask_url_password(url)  # for logs: the URL may carry a password
        self.local = MemoryIndex(params.capacity_blocks)  # every table (mirror), else own writes
        no_retry = Retry(NoBackoff(), 0)  # a dead Redis must cost one timeout, not three
        self._sender = os.urandom(8)
        # Named per index and role, so Redis's CLIENT LIST tells which index owns a connection.
        name = re.sub(r"[^!-~]", "_", f"{self.key_prefix}{self._sender.hex()}:")
        self._reader = Redis.from_url(
            url,
            socket_timeout=params.timeout_s,
            client_name=f"{name}read",
            socket_connect_timeout=params.timeout_s,
            retry=no_retry,
        )
        write_timeout = max(1.0, 20 * params.timeout_s)
        self._writer = Redis.from_url(
            url,
            socket_timeout=write_timeout,
            client_name=f"{name}write",
            socket_connect_timeout=params.timeout_s,
            retry=no_retry,
        )
        # The subscription waits for messages as long as there are none; a dead Redis breaks it.
        self._subscriber = Redis.from_url(
            url,
            socket_timeout=None,
            client_name=f"{name}follow",
            socket_connect_timeout=params.timeout_s,
            retry=no_retry,
        )
        self._match = self._reader.register_script(wire.MATCH_LUA)
        self._record = self._writer.register_script(wire.RECORD_LUA)
        self._channel = f"{self.key_prefix}ops"
        self._closed = False  # for good: nothing may start a task or a connection after close()
        self._pending: deque[wire.Op] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()  # one pipeline at a time keeps writes in order
        self._follower: asyncio.Task[None] | None = None
        self._mirrored = False  # the mirror holds every write published before its last marker
        self._since_snapshot: list[wire.Op] | None = None  # own writes while a snapshot loads
        self._sending: list[wire.Op] = []  # the batch on its way to Redis
        self._markers: dict[bytes, asyncio.Future[None]] = {}
        self._degraded = False
        self.errors = 0  # failed Redis calls
        self.dropped_writes = 0  # records lost because the queue overflowed during an outage
        self.mirror_errors = 0  # subscriptions lost or bad messages (each costs a resync)

    @property
    def degraded(self) -> bool:
        return self._degraded

    @property
    def mirrored(self) -> bool:
        """Lookups answer from the in-memory mirror (no Redis round trip)."""
        return self._mirrored and not self._degraded

    def key(self, replica_id: str) -> str:
        return f"{self.key_prefix}blocks:{replica_id}"

    async def match(self, hashes: Sequence[int], replica_ids: Iterable[str]) -> dict[str, int]:
        self._start_follower()
        ids = list(replica_ids)
        local = self.local.match_now(hashes, ids)
        if self._closed or self.mirrored or self._degraded or not hashes or not ids:
            return local
        names = [r.encode() for r in ids]
        meta = struct.pack(
            "<" + "II" * len(ids),
            *itertools.chain.from_iterable((min(local[r], wire.MAX_HINT), len(name)) for r, name in zip(ids, names)),
        )
        try:
            reply = await self._match(args=[wire.pack(hashes), meta, b"".join(names), self.key("")])
        except _ERRORS as exc:
            self._fail(exc)
            return local
        # This gateway's newest writes may still be queued: take the longer of the two.
        return {r: max(int(n), local[r]) for r, n in zip(ids, reply.split())}

    def record(self, replica_id: str, hashes: Sequence[int]) -> int:
        if not hashes:
            return 0
        self._enqueue((replica_id, wire.pack(hashes), time.time()))
        return self.local.record(replica_id, hashes)

    def fill(self, replica_id: str) -> float:
        return self.local.fill(replica_id)

    def unrecord(self, replica_id: str, hashes: Sequence[int]) -> None:
        """This gateway's own table forgets them; a write already queued or sent stays in Redis
        until the table's LRU trim or TTL ages it out (a request that never reached a replica is rare)."""
        self.local.unrecord(replica_id, hashes)

    async def forget(self, replica_id: str) -> None:
        await self.local.forget(replica_id)
        self._enqueue((replica_id, None, time.time()))

    def set_capacity(self, replica_id: str, blocks: int) -> None:
        self.local.set_capacity(replica_id, blocks)

    async def flush(self) -> None:
        """Send queued writes (on failure they go back to the front of the queue); then, while
        the mirror follows the others, wait until it holds everything published so far."""
        if self._closed:
            return
        await self._flush_all()
        if self.mirrored:
            await self._catch_up()

    async def close(self) -> None:
        """Flush what Redis takes within a second, then let go: never hangs on a sick Redis
        (a connection left mid-command by a timeout can block redis-py's aclose). Final: a
        redis-py client reconnects on its next command, so after this none is sent."""
        self._closed = True
        if self._task is not None:
            if self._pending and not self._degraded:
                with contextlib.suppress(*_ERRORS):
                    await asyncio.wait_for(self._flush_all(), timeout=1.0)
            await cancel_until_done(self._task)
            self._task = None
        if self._follower is not None:
            await cancel_until_done(self._follower)
            self._follower = None
        for client in (self._reader, self._writer, self._subscriber):
            with contextlib.suppress(*_ERRORS):
                await asyncio.wait_for(client.aclose(), timeout=1.0)

    def _enqueue(self, op: wire.Op) -> None:
        if self._since_snapshot is not None:
            self._since_snapshot.append(op)
        if len(self._pending) >= self.params.max_pending_writes:
            self._pending.popleft()
            self.dropped_writes += 1
        self._pending.append(op)
        self._wake_flusher()
        self._start_follower()

    def _wake_flusher(self) -> None:
        if self._closed:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flush_loop(), name="redis-index-flush")
        self._wake.set()

    def _fail(self, exc: BaseException) -> None:
        self.errors += 1
        if not self._degraded:
            self._degraded = True
            log.warning("index_redis_unreachable", store=self._where, error=repr(exc))
        self._wake_flusher()

    async def _flush_loop(self) -> None:
        """Flush queued writes as they come; while degraded, probe Redis with backoff."""
        backoff = Backoff(0.05, self.params.reconnect_max_s)
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending or self._degraded:
                try:
                    if self._degraded:
                        # A restarted Redis has lost the scripts: load them now, so the first
                        # lookup after recovery is one round trip, not a NOSCRIPT retry.
                        await self._writer.script_load(wire.MATCH_LUA)
                        await self._writer.script_load(wire.RECORD_LUA)
                        self._degraded = False
                        log.info("index_redis_recovered", store=self._where, queued=len(self._pending))
                    await self._flush_all()
                    backoff.reset()
                except _ERRORS as exc:
                    self._fail(exc)
                    await asyncio.sleep(backoff.next_s())

    async def _flush_all(self) -> None:
        async with self._flushing:
            await self._flush_locked()

    async def _flush_locked(self) -> None:
        while self._pending:
            batch: list[wire.Op] = []
            blocks = 0
            while self._pending and blocks < _BATCH_BLOCKS:
                op = self._pending.popleft()
                batch.append(op)
                blocks += len(op[1] or b"") // 8
            self._sending = batch
            try:
                await self._send(batch)
            except BaseException:
                self._pending.extendleft(reversed(batch))
                while len(self._pending) > self.params.max_pending_writes:
                    self._pending.popleft()  # the oldest writes matter least
                    self.dropped_writes += 1
                raise
            finally:
                self._sending = []

    async def _send(self, batch: list[wire.Op]) -> None:
        # EVALSHA straight into the pipeline: a pipeline holding a Script object first checks
        # SCRIPT EXISTS, one more round trip per flush. A Redis that lost the script (restarted
        # between two flushes) answers NOSCRIPT: load it and send the batch again (replaying a
        # record or a delete in order leaves the same tables; a mirror applies it twice, alike).
        ttl = max(1, int(self.params.ttl_s))
        message = wire.encode_ops(self._sender, batch)
        for attempt in range(2):
            pipe = self._writer.pipeline(transaction=False)
            for replica_id, packed, ts in batch:
                key = self.key(replica_id)
                if packed is None:
                    pipe.delete(key)
                else:
                    pipe.evalsha(self._record.sha, 1, key, packed, ts, self.local.capacity(replica_id), ttl)
            pipe.publish(self._channel, message)
            try:
                await pipe.execute()
                return
            except NoScriptError:
                if attempt:
                    raise
                await self._writer.script_load(wire.RECORD_LUA)

    # --- the mirror ---------------------------------------------------------------------------

    def _start_follower(self) -> None:
        if self.params.mirror and not self._closed and (self._follower is None or self._follower.done()):
            self._follower = asyncio.get_running_loop().create_task(self._follow(), name="redis-index-follow")

    async def _follow(self) -> None:
        """Subscribe, load a snapshot, then apply the others' writes; resync after any break.
        A reader task drains the subscription into a queue all along, so Redis never holds
        our messages (its pub/sub output limit would cut a subscriber that stops reading)."""
        backoff = Backoff(0.05, self.params.reconnect_max_s)
        while True:
            self._mirrored = False  # a new subscription: in sync once its marker comes back
            pubsub = self._subscriber.pubsub()
            queue: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
            reader: asyncio.Task[None] | None = None
            try:
                await pubsub.subscribe(self._channel)  # from here on every write reaches us
                reader = asyncio.get_running_loop().create_task(
                    wire.read_messages(pubsub, queue, _ERRORS), name="redis-index-read"
                )
                marker = await self._load_snapshot()
                while True:
                    data = await queue.get()
                    if isinstance(data, BaseException):
                        raise data
                    if self._apply(data, marker):
                        backoff.reset()
            except (*_ERRORS, ValueError, struct.error) as exc:
                self.mirror_errors += 1
                if self._mirrored:
                    log.warning("index_mirror_lost", store=self._where, error=repr(exc))
                self._mirrored = False
                for future in self._markers.values():  # release flush(): lookups now ask Redis
                    if not future.done():
                        future.set_result(None)
                self._markers.clear()
                await asyncio.sleep(backoff.next_s())
            finally:
                if reader is not None:
                    reader.cancel()  # its reads have no asyncio.wait_for (socket_timeout=None): once is enough
                with contextlib.suppress(*_ERRORS):
                    await asyncio.wait_for(pubsub.aclose(), timeout=1.0)

    async def _load_snapshot(self) -> bytes:
        """Replace the mirror with Redis's tables, keeping this gateway's writes made meanwhile
        (and those still queued); publish a marker whose return means the mirror is in sync."""
        start = time.perf_counter()
        self._since_snapshot = [*self._sending, *self._pending]
        try:
            tables = await wire.read_tables(self._writer, self.key(""), _SNAPSHOT_PAGE)
            self.local.load(tables)
            self._mirror_ops((replica_id, packed) for replica_id, packed, _ in self._since_snapshot)
        finally:
            self._since_snapshot = None
        marker = os.urandom(8)
        await self._publish_marker(marker)
        log.info(
            "index_mirror_loaded",
            store=self._where,
            tables=len(tables),
            blocks=sum(map(len, tables.values())),
            seconds=round(time.perf_counter() - start, 3),
        )
        return marker

    def _apply(self, data: bytes, sync_marker: bytes) -> bool:
        """Apply one message; True when it was this gateway's sync marker (the mirror is in sync)."""
        sender, kind = data[:8], data[8:9]
        if kind == wire.MARKER:
            if sender != self._sender:
                return False
            nonce = data[9:17]
            future = self._markers.pop(nonce, None)
            if future is not None and not future.done():
                future.set_result(None)
            if nonce == sync_marker:
                self._mirrored = True
                return True
            return False
        if kind != wire.WRITES or sender == self._sender:
            return False  # own writes are in the mirror already; a newer gateway's kinds are not ours
        self._mirror_ops(wire.decode_ops(data, 9))
        return False

    def _mirror_ops(self, ops: Iterable[tuple[str, bytes | None]]) -> None:
        """Apply writes (packed hashes, or None = forget) to the local tables."""
        for replica_id, packed in ops:
            if packed is None:
                self.local.drop(replica_id)
            else:
                self.local.record(replica_id, wire.unpack(packed))

    async def _publish_marker(self, nonce: bytes) -> None:
        """A marker of this gateway's: the follower sees it after everything published before."""
        await self._writer.publish(self._channel, self._sender + wire.MARKER + nonce)

    async def _catch_up(self) -> None:
        """Wait until the follower has applied everything published before now."""
        nonce = os.urandom(8)
        future = self._markers[nonce] = asyncio.get_running_loop().create_future()  # before it can come back
        try:
            await self._publish_marker(nonce)
            await asyncio.wait_for(future, timeout=max(1.0, 20 * self.params.timeout_s))
        finally:
            self._markers.pop(nonce, None)
