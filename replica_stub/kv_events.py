"""vLLM's KV events over ZMQ, so a router can track exactly which prefixes this replica caches.

The BlockPool reports every store, eviction and reset through `on_event`; that only appends to
a list. The engine loop calls `flush()` once per step, after the step and before its tokens are
handed to clients, so when a client sees a response's first bytes the BlockStored events for
its prompt are already on the wire. A flush sends one multipart message, as vLLM does:

    (topic, seq as 8 big-endian bytes, msgpack [ts, events, data_parallel_rank=None])

`seq` counts from 0 per process. Events are encoded as vLLM's array-like tagged structs
(`encoding="array"`, ~v0.9-v0.11: `["BlockStored", hashes, parent, token_ids, block_size,
lora_id, medium]`) or as tagged maps (`encoding="map"`, newer: `{"type": "BlockStored", ...}`,
which also carry `lora_name`). `lora_id` (and `lora_name`) name the adapter whose blocks they
are (None for the base model).
Block hashes are the stub's xxh3_64 chain hashes, already unsigned 64-bit ints (what vLLM sends
with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES); a prompt's first block has parent None.

The PUB socket always binds (`tcp://127.0.0.1:PORT`, `tcp://*:PORT`, `ipc://...` all work) and
never blocks the event loop: at the high-water mark a batch is dropped and counted, and a
subscriber that sees a gap in `seq` recovers it by replay. The last `buffer_steps` batches are
kept; the ROUTER on `replay_endpoint` answers a start seq (8 big-endian bytes, sent by REQ or by
DEALER without the empty delimiter) with `[identity, (b"" if REQ), seq, payload]` for every
buffered seq >= start, then `[identity, (b""), -1 as 8 signed bytes, b""]`.

Not in vLLM: `subscribers` counts the connections to the PUB socket now (a ZMQ socket monitor's
accepted minus disconnected) and `replays` the replay requests served, shown by `/debug/kv_cache`, so
that tests can see how many subscriptions a fleet of gateways costs a replica.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator
from itertools import count
from typing import Any, Literal

import msgpack
import structlog
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from replica_stub.block_pool import BlockRemoved, BlockStored, KVEvent

log = structlog.get_logger("replica_stub.kv_events")

Encoding = Literal["array", "map"]
ENCODINGS: tuple[Encoding, ...] = ("array", "map")
ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")
MEDIUM = "GPU"
SNDHWM = 100_000  # vLLM's KVEventsConfig.hwm
END_MARKER = (-1).to_bytes(8, "big", signed=True)
_MONITORS = count()  # one inproc name per publisher's socket monitor


def encode_event(event: KVEvent, encoding: Encoding) -> list[Any] | dict[str, Any]:
    """One event in vLLM's wire shape, in its struct's field order."""
    if isinstance(event, BlockStored):
        fields: dict[str, Any] = {
            "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash,
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": event.lora_id,
            "medium": MEDIUM,
        }
        if encoding == "map":  # vLLM added it after its events became maps
            fields["lora_name"] = event.lora_name
    elif isinstance(event, BlockRemoved):
        fields = {"block_hashes": list(event.block_hashes), "medium": MEDIUM}
    else:  # AllBlocksCleared
        fields = {}
    name = type(event).__name__
    return [name, *fields.values()] if encoding == "array" else {"type": name, **fields}


def merge_removals(events: list[KVEvent]) -> Iterator[KVEvent]:
    """Consecutive BlockRemoved events become one (an eviction burst is one event, not hundreds)."""
    removed: list[int] = []
    for event in events:
        if isinstance(event, BlockRemoved):
            removed.extend(event.block_hashes)
            continue
        if removed:
            yield BlockRemoved(tuple(removed))
            removed = []
        yield event
    if removed:
        yield BlockRemoved(tuple(removed))


class KVEventPublisher:
    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        encoding: Encoding = "array",
    ) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
        self.topic, self.encoding = topic.encode(), encoding
        self.published = self.dropped = 0
        self.subscribers = 0  # connections to the PUB socket now
        self.replays = 0  # replay requests served
        self._seq = 0
        self._pending: list[KVEvent] = []
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, SNDHWM)
        self._pub.bind(endpoint)
        async_ctx = zmq.asyncio.Context.shadow(self._ctx.underlying)
        monitor = f"inproc://kv-events-monitor-{next(_MONITORS)}"
        self._pub.monitor(monitor, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._monitor = async_ctx.socket(zmq.PAIR)
        self._monitor.connect(monitor)
        self._replay: zmq.asyncio.Socket | None = None
        if replay_endpoint:
            self._replay = async_ctx.socket(zmq.ROUTER)
            self._replay.bind(replay_endpoint)
        self._tasks: list[asyncio.Task[None]] = []

    def on_event(self, event: KVEvent) -> None:
        """The BlockPool hook: just queue it (no I/O inside the scheduler)."""
        self._pending.append(event)

    def flush(self) -> None:
        """Send the events queued since the last flush as one batch; nothing if there are none."""
        if not self._pending:
            return
        events = [encode_event(e, self.encoding) for e in merge_removals(self._pending)]
        self._pending = []
        payload = msgpack.packb([time.time(), events, None], use_bin_type=True)
        seq, self._seq = self._seq, self._seq + 1
        self._buffer.append((seq, payload))
        try:
            self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK)
            self.published += 1
        except zmq.Again:
            self.dropped += 1

    def start(self) -> None:
        """Serve replay requests and count subscribers (needs the running event loop)."""
        if self._tasks:
            return
        self._tasks.append(asyncio.create_task(self._count_subscribers(), name="kv-events-monitor"))
        if self._replay is not None:
            self._tasks.append(asyncio.create_task(self._serve_replay(self._replay), name="kv-events-replay"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._pub.disable_monitor()
        self._monitor.close(linger=0)
        self._pub.close(linger=0)
        self._ctx.term()

    async def _count_subscribers(self) -> None:
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())["event"]
            self.subscribers += 1 if event == zmq.EVENT_ACCEPTED else -1

    async def _serve_replay(self, router: zmq.asyncio.Socket) -> None:
        while True:
            frames = await router.recv_multipart()
            if (len(frames) == 3 and frames[1] == b"") or len(frames) == 2:  # REQ or DEALER framing
                identity, start, envelope = frames[0], frames[-1], frames[1:-1]
                if len(start) == 8:
                    await self._replay_from(router, identity, envelope, int.from_bytes(start, "big"))
                    continue
            log.warning("kv_events_bad_replay_request", frames=len(frames), sizes=[len(f) for f in frames])

    async def _replay_from(
        self, router: zmq.asyncio.Socket, identity: bytes, envelope: list[bytes], start: int
    ) -> None:
        self.replays += 1
        batches = [(seq, payload) for seq, payload in self._buffer if seq >= start]
        try:
            for seq, payload in batches:
                await router.send_multipart([identity, *envelope, seq.to_bytes(8, "big"), payload])
            await router.send_multipart([identity, *envelope, END_MARKER, b""])
        except zmq.ZMQError as exc:  # one client's failure must not end the replay service
            log.warning("kv_events_replay_failed", start=start, error=repr(exc))
