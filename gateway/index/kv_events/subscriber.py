"""Subscriber to a replica's vLLM KV events: the exact rung of the warm-prefix ladder.

A vLLM replica started with `--kv-events-config` publishes every block its prefix cache stores
or evicts. Mirroring those events gives a table of what the replica really holds, instead of
what the gateway guesses from the requests it routed. A mirror is only worth trusting when no
event was lost, so the subscriber also tells its sink whether the table is *certain*.

Wire decoding: `gateway.index.kv_events.decode`.

Certainty rules:
- Start-up, and every start-over, empties the table (`cleared`) and marks it uncertain. With a
  replay endpoint, the subscriber asks for everything from seq 0: a replay that starts at 0, or
  an empty one (nothing published yet), is the complete history, so after applying it the
  table is certain. A replay that starts later (the publisher's buffer rolled over) is applied
  but leaves the table uncertain. Without a replay endpoint (or when the replay times out) the
  table becomes certain only if the first live batch is seq 0.
- Live batches that arrive while a replay runs wait in the SUB socket. Right after a replay,
  the batches already waiting are drained first and any seq already applied is skipped
  (delivery is at-least-once across the two sockets).
- Gap (seq > last + 1): replay from last + 1. If the replay covers the gap, the batches are
  applied in order and certainty is kept; otherwise (buffer rolled over, no replay endpoint,
  timeout) the subscriber starts over as above.
- Outside that drain, a seq that is not new means a new publisher process (PUB never repeats a
  batch): seq 0 is a restart seen from its start; any other old seq is a restart whose first
  batches were lost while ZMQ reconnected. Either way the subscriber starts over, and seq 0 (or
  a replay from 0) makes the new process's table certain.
- A seq outside vLLM's range (an int64 counter from 0: at least 2**63 read unsigned) is a lying or
  broken publisher: the frame is counted as a decode error and dropped, like frames without a seq.
  Taken as it came it became `_next` = 2**64, which the next log call could not render (orjson
  writes 64-bit integers only) and the feed session crashed.
- A batch that does not decode is counted and skipped from its first bad part on (it is decoded and
  applied in slices, the event loop free between them, working at most a sixth of the time: see
  `_apply`); its effects are unknown, so the table becomes uncertain until the next start-over.
- ZMQ reconnects a dropped connection by itself, but a SUB socket cannot tell a silent
  publisher from a lost one. The next batch after an outage shows a gap or a restart and is
  handled as above; meanwhile what the feed cannot see is watched from outside: a replica that
  goes down, or whose engine counters go backwards (a restart), gets `restart()` (its table
  dropped at once, a new session); a table that should have heard of a finished request's new
  blocks and did not turns itself uncertain (`gateway.index.exact`).

Under `serve --workers N` one worker subscribes to the replica and forwards what it receives, the others
subscribe to it (`relay`: `gateway.index.kv_events.relay`); the rules above are the same for both.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import structlog
import zmq
import zmq.asyncio

from gateway.config.pools import KVEventsConfig
from gateway.index.kv_events.decode import DecodeError, EngineHash, Event, Removed, Stored, decode_slices
from gateway.index.kv_events.relay import FeedRelay, Forwarder
from gateway.support.backoff import Backoff
from gateway.support.pacing import Pacer

log = structlog.get_logger("gateway.index.kv_events.subscriber")

_END_SEQ = -1
_SLICE_EVENTS = 128  # events decoded and applied between two yields to the event loop
_SLICE_BLOCKS = 256  # blocks applied between two yields (~0.5 ms of chain hashing at 16 tokens a block)
_SEQ_LIMIT = 1 << 63  # vLLM's seq is an int64 counted from 0: a live or replayed seq is below this


class EventSink(Protocol):
    """The in-memory table the events go to; every call is synchronous."""

    def stored(
        self,
        replica_id: str,
        block_hashes: Sequence[EngineHash],
        parent: EngineHash | None,
        token_ids: Sequence[int],
        block_size: int,
        lora_id: int | None = None,
        lora_name: str | None = None,
    ) -> None: ...

    def removed(self, replica_id: str, block_hashes: Sequence[EngineHash]) -> None: ...

    def cleared(self, replica_id: str) -> None:
        """AllBlocksCleared, or the subscriber starts over: empty the replica's table."""

    def set_certain(self, replica_id: str, certain: bool) -> None:
        """Whether the table is known to mirror the replica's cache exactly."""


class KVEventSubscriber:
    """Follows one replica's KV events into `sink`; `start()` once, `await close()` at the end."""

    def __init__(
        self,
        replica_id: str,
        config: KVEventsConfig,
        sink: EventSink,
        *,
        replay_timeout_s: float = 1.0,
        reconnect_max_s: float = 5.0,
        relay: FeedRelay | None = None,
    ) -> None:
        self.replica_id, self.config, self.sink, self.relay = replica_id, config, sink, relay
        self.replay_timeout_s, self.reconnect_max_s = replay_timeout_s, reconnect_max_s
        self.certain = False
        self.batches = 0  # batches applied (live or replayed)
        self.gaps = 0  # live seqs that skipped ahead
        self.replays = 0  # replay requests sent
        self.replay_failures = 0  # replays that timed out or answered garbage
        self.resets = 0  # publisher restarts seen (seq went back)
        self.duplicates = 0  # batches skipped as already applied
        self.decode_errors = 0  # batches or frames that did not decode
        self._next: int | None = None  # the seq expected next; None: no history yet
        self._draining = False  # reading batches that queued up during a replay
        self._ctx: zmq.asyncio.Context | None = None
        self._owns_ctx = True
        self._task: asyncio.Task[None] | None = None
        self._forwarder: Forwarder | None = None  # the owner's, under `serve --workers N`
        self._pacer = Pacer()  # a flood of events takes about a sixth of the CPU at most

    @property
    def paced_seconds(self) -> float:
        """Time rested mid-batch so that a flood of events leaves the CPU to requests (`Pacer`)."""
        return self._pacer.rested_s

    @property
    def last_seq(self) -> int | None:
        return None if self._next is None else self._next - 1

    def start(self, ctx: zmq.asyncio.Context | None = None) -> None:
        """`ctx`: a context shared by many subscribers (one ZMQ I/O thread for all; the caller
        destroys it); without one the subscriber owns a context of its own."""
        self._owns_ctx = ctx is None
        self._ctx = zmq.asyncio.Context() if ctx is None else ctx
        if self.relay is not None and self.relay.forwards:
            self._forwarder = Forwarder(self._ctx, self.relay.endpoint)
        self._spawn()

    def _spawn(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"kv-events-{self.replica_id}")

    def restart(self, reason: str) -> None:
        """The replica went down or its engine restarted (seen outside the feed): drop its table now,
        before it can mislead a decision, and start a new session, which replays the new history."""
        self.resets += 1
        log.warning("kv_events_table_dropped", replica=self.replica_id, reason=reason)
        self.sink.cleared(self.replica_id)
        self._set_certain(False)
        self._next = None
        if self._task is not None:
            self._task.cancel()
            self._spawn()

    async def close(self, timeout_s: float = 1.0) -> None:
        """Stop the task and close its sockets; bounded by `timeout_s` even if the task is stuck."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=timeout_s)
        if self._forwarder is not None:
            self._forwarder.close()
            self._forwarder = None
        if self._ctx is not None and self._owns_ctx:
            self._ctx.destroy(linger=0)
        self._ctx = None

    def describe(self) -> dict[str, Any]:
        """State and counters for the admin API."""
        relay: dict[str, Any] = {} if self.relay is None else self.relay.describe()
        if self._forwarder is not None:
            relay |= self._forwarder.describe()
        return {
            **({"relay": relay} if relay else {}),
            "endpoint": self.config.endpoint,
            "replay_endpoint": self.config.replay_endpoint,
            "certain": self.certain,
            "last_seq": self.last_seq,
            "batches": self.batches,
            "gaps": self.gaps,
            "replays": self.replays,
            "replay_failures": self.replay_failures,
            "resets": self.resets,
            "duplicates": self.duplicates,
            "decode_errors": self.decode_errors,
            "paced_s": round(self.paced_seconds, 3),
        }

    async def _run(self) -> None:
        """Sessions until cancelled; an unexpected error starts a new one after a backoff."""
        backoff = Backoff(0.05, self.reconnect_max_s)
        while True:
            try:
                await self._session()
            except Exception:  # noqa: BLE001 - a bad replica or sink bug must not end the subscription
                log.exception("kv_events_error", replica=self.replica_id, endpoint=self.config.endpoint)
                await asyncio.sleep(backoff.next_s())

    async def _session(self) -> None:
        assert self._ctx is not None
        sub = self._ctx.socket(zmq.SUB)
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, self.config.topic.encode())
            sub.connect(self.config.endpoint if self.relay is None or self.relay.forwards else self.relay.endpoint)
            await self._start_over()
            while True:
                if self._draining and not await sub.poll(0):
                    self._draining = False
                frames = await sub.recv_multipart()
                if self._forwarder is not None:  # as received, before this worker spends time applying it
                    self._forwarder.send(frames)
                seq = int.from_bytes(frames[-2], "big") if len(frames) >= 2 and len(frames[-2]) == 8 else _SEQ_LIMIT
                if seq >= _SEQ_LIMIT:
                    # No seq to account for: if a batch was lost, the next one shows the gap.
                    self.decode_errors += 1
                    log.warning("kv_events_bad_frames", replica=self.replica_id, frames=len(frames))
                    continue
                await self._on_live(seq, frames[-1], held=self._draining)
        finally:
            sub.close(linger=0)

    async def _on_live(self, seq: int, payload: bytes, *, held: bool) -> None:
        """One batch from the SUB socket; `held` if it queued up during a replay."""
        if self._next is not None and seq < self._next:
            if held:
                self.duplicates += 1
                return
            self.resets += 1
            log.warning("kv_events_publisher_restarted", replica=self.replica_id, seq=seq, expected=self._next)
            await self._start_over()
        elif self._next is not None and seq > self._next:
            self.gaps += 1
            log.info("kv_events_gap", replica=self.replica_id, seq=seq, expected=self._next)
            if not await self._fill_gap(seq):
                await self._start_over()
        if self._next is None:  # no history: this batch is the first the table sees
            self._set_certain(await self._apply(seq, payload) and seq == 0)
        elif seq == self._next:
            await self._apply(seq, payload)
        elif seq < self._next:  # the replay just applied it
            self.duplicates += 1
        else:  # a replay from 0 ended before this seq: the table misses the batches in between
            self._set_certain(False)
            await self._apply(seq, payload)

    async def _start_over(self) -> None:
        """Empty the table and rebuild it from the replay buffer where there is one."""
        self.sink.cleared(self.replica_id)
        self._set_certain(False)
        self._next = None
        replayed = await self._replay(0)
        if replayed is None:
            return
        self._next = replayed[0][0] if replayed else 0
        complete = self._next == 0  # the buffer still holds seq 0: the publisher's whole history
        self._set_certain(await self._apply_replayed(replayed) and complete)
        log.info("kv_events_synced", replica=self.replica_id, batches=len(replayed), certain=self.certain)

    async def _fill_gap(self, seq: int) -> bool:
        """Replay the batches missing before `seq`; False if the replay does not cover them."""
        assert self._next is not None
        replayed = await self._replay(self._next)
        if not replayed or replayed[0][0] != self._next:
            return False
        await self._apply_replayed(replayed)
        return self._next >= seq

    async def _apply_replayed(self, replayed: list[tuple[int, bytes]]) -> bool:
        """Apply replayed batches from `_next` on while consecutive, then drain the SUB queue; False on a bad batch."""
        clean = True
        for seq, payload in replayed:
            if seq != self._next:
                break
            clean = await self._apply(seq, payload) and clean
        self._draining = True
        return clean

    async def _replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """Buffered batches from `start` on, in order; None without a replay endpoint or on failure."""
        if self.config.replay_endpoint is None or self._ctx is None:
            return None
        self.replays += 1
        sock = self._ctx.socket(zmq.DEALER)  # a fresh socket: no late answer to an earlier request
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.config.replay_endpoint)
            async with asyncio.timeout(self.replay_timeout_s):
                await sock.send_multipart([b"", start.to_bytes(8, "big")])  # REQ framing, as vLLM expects
                batches: list[tuple[int, bytes]] = []
                while True:
                    frames = await sock.recv_multipart()
                    if len(frames) < 2 or len(frames[-2]) != 8:
                        raise DecodeError("bad replay frames")
                    seq = int.from_bytes(frames[-2], "big", signed=True)
                    if seq == _END_SEQ:
                        return batches
                    if seq < start:  # out of vLLM's range (negative signed), or before what was asked
                        raise DecodeError(f"replayed seq {seq} before the start asked, {start}")
                    batches.append((seq, frames[-1]))
        except (TimeoutError, DecodeError, zmq.ZMQError) as exc:
            self.replay_failures += 1
            log.warning("kv_events_replay_failed", replica=self.replica_id, start=start, error=repr(exc))
            return None
        finally:
            sock.close(linger=0)

    async def _apply(self, seq: int, payload: bytes) -> bool:
        """Hand one batch's events to the sink; False (and uncertain) if it did not decode. The batch is
        decoded and applied a slice of events at a time, with the event loop free between slices (one
        30 MB batch decoded in one go held it for 0.3-0.4 s; a long event is read a window of its token
        ids at a time); holding a whole decoded batch instead would also cost a full garbage collection
        over its objects. The slices are paced (`Pacer`): a flood of events, even sliced, kept the
        process busy and raised innocent p99 up to 2.4x by CPU contention alone. A batch found bad part-way keeps
        the events applied before the bad one: the table is uncertain either way."""
        self._next = seq + 1
        self._pacer.start()
        try:
            for part in decode_slices(payload, _SLICE_EVENTS):
                await self._hand_over(part)
                await self._pacer.pause()
        except DecodeError as exc:
            self.decode_errors += 1
            log.warning("kv_events_bad_batch", replica=self.replica_id, seq=seq, reason=str(exc))
            self._set_certain(False)
            return False
        self.batches += 1
        return True

    async def _hand_over(self, events: list[Event]) -> None:
        """The events to the sink, yielding to the loop after every `_SLICE_BLOCKS` blocks: one event may
        name thousands (each a chain hash of its tokens), so a long one is handed over in pieces."""
        blocks = 0
        for event in _pieces(events):
            if blocks >= _SLICE_BLOCKS:
                blocks = 0
                await self._pacer.pause()
            blocks += len(event.block_hashes) if isinstance(event, Stored | Removed) else 1
            if isinstance(event, Stored):
                self.sink.stored(
                    self.replica_id,
                    event.block_hashes,
                    event.parent,
                    event.token_ids,
                    event.block_size,
                    event.lora_id,
                    event.lora_name,
                )
            elif isinstance(event, Removed):
                self.sink.removed(self.replica_id, event.block_hashes)
            else:
                self.sink.cleared(self.replica_id)

    def _set_certain(self, certain: bool) -> None:
        if certain != self.certain:
            self.certain = certain
            log.info("kv_events_certainty", replica=self.replica_id, certain=certain)
        self.sink.set_certain(self.replica_id, certain)


def _pieces(events: list[Event]) -> Iterator[Event]:
    """`events`, a BlockStored naming more than `_SLICE_BLOCKS` blocks cut into consecutive pieces (each
    continuing the chain at the last block of the one before; its tokens exactly its blocks' own), so that
    the loop may run between them. One whose token ids do not match its blocks goes whole."""
    for event in events:
        if not isinstance(event, Stored) or len(event.block_hashes) <= _SLICE_BLOCKS:
            yield event
            continue
        size = event.block_size
        if len(event.token_ids) != len(event.block_hashes) * size:
            yield event
            continue
        parent = event.parent
        for start in range(0, len(event.block_hashes), _SLICE_BLOCKS):
            hashes = event.block_hashes[start : start + _SLICE_BLOCKS]
            tokens = event.token_ids[start * size : (start + len(hashes)) * size]
            yield dataclasses.replace(event, block_hashes=hashes, parent=parent, token_ids=tokens)
            parent = hashes[-1]
