from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio

from replica_stub.block_pool import AllBlocksCleared, BlockPool, BlockRemoved, BlockStored, KVEvent
from replica_stub.config import load_config
from replica_stub.kv_events import END_MARKER, Encoding, KVEventPublisher, encode_event
from tests.helpers import free_port

pytestmark = pytest.mark.timeout(10)

STORED = BlockStored((11, 2**64 - 1), None, tuple(range(8)), 4)


@dataclass
class Wire:
    """A publisher on loopback TCP with a subscriber that is known to be connected."""

    publisher: KVEventPublisher
    sub: zmq.asyncio.Socket
    replay_endpoint: str
    publisher_endpoint: str
    ctx: zmq.asyncio.Context

    async def recv(self, timeout: float = 2.0) -> tuple[bytes, int, Any]:
        topic, seq, payload = await asyncio.wait_for(self.sub.recv_multipart(), timeout)
        return topic, int.from_bytes(seq, "big"), msgpack.unpackb(payload, raw=False)

    def publish(self, *events: KVEvent) -> None:
        for event in events:
            self.publisher.on_event(event)
        self.publisher.flush()

    async def close(self) -> None:
        self.sub.close(linger=0)
        self.ctx.term()
        await self.publisher.close()


async def _wire(encoding: Encoding = "array", buffer_steps: int = 10_000) -> Wire:
    replay = f"tcp://127.0.0.1:{free_port()}"
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    publisher = KVEventPublisher(endpoint, replay, topic="kv", buffer_steps=buffer_steps, encoding=encoding)
    publisher.start()
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    wire = Wire(publisher, sub, replay, endpoint, ctx)
    while not await sub.poll(20):  # slow joiner: probe until the subscription is in place
        wire.publish(AllBlocksCleared())
    while await sub.poll(50):
        await sub.recv_multipart()
    return wire


@pytest.fixture
async def wire() -> AsyncIterator[Wire]:
    wire = await _wire(buffer_steps=3)
    yield wire
    await wire.close()


def test_array_encoding_is_vllms_tagged_array_shape() -> None:
    assert encode_event(STORED, "array") == ["BlockStored", [11, 2**64 - 1], None, list(range(8)), 4, None, "GPU"]
    assert encode_event(BlockStored((12,), 11, (1, 2, 3, 4), 4), "array")[2] == 11
    assert encode_event(BlockRemoved((11,)), "array") == ["BlockRemoved", [11], "GPU"]
    assert encode_event(AllBlocksCleared(), "array") == ["AllBlocksCleared"]


def test_stored_blocks_name_their_lora_adapter() -> None:
    stored = BlockStored((11,), None, (1, 2, 3, 4), 4, lora_id=2, lora_name="sql")
    assert encode_event(stored, "array")[5] == 2  # vLLM <= 0.11 arrays: lora_id only
    assert encode_event(stored, "map") == {
        "type": "BlockStored",
        "block_hashes": [11],
        "parent_block_hash": None,
        "token_ids": [1, 2, 3, 4],
        "block_size": 4,
        "lora_id": 2,
        "medium": "GPU",
        "lora_name": "sql",
    }


def test_map_encoding_is_tagged_maps() -> None:
    assert encode_event(STORED, "map") == {
        "type": "BlockStored",
        "block_hashes": [11, 2**64 - 1],
        "parent_block_hash": None,
        "token_ids": list(range(8)),
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    assert encode_event(BlockRemoved((11,)), "map") == {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU"}
    assert encode_event(AllBlocksCleared(), "map") == {"type": "AllBlocksCleared"}


async def test_one_message_per_flush_with_increasing_seq_and_merged_removals(wire: Wire) -> None:
    wire.publish(STORED, BlockRemoved((1,)), BlockRemoved((2, 3)), AllBlocksCleared(), BlockRemoved((4,)))
    topic, seq, (ts, events, rank) = await wire.recv()
    assert topic == b"kv" and isinstance(ts, float) and rank is None
    assert events == [
        encode_event(STORED, "array"),
        ["BlockRemoved", [1, 2, 3], "GPU"],
        ["AllBlocksCleared"],
        ["BlockRemoved", [4], "GPU"],
    ]
    wire.publish(BlockRemoved((5,)))
    assert (await wire.recv())[1] == seq + 1
    wire.publisher.flush()  # nothing pending: nothing sent
    assert not await wire.sub.poll(100)


async def test_map_encoding_on_the_wire() -> None:
    wire = await _wire("map")
    try:
        wire.publish(STORED)
        _, _, (_, events, _) = await wire.recv()
        assert events == [encode_event(STORED, "map")]
    finally:
        await wire.close()


async def _replay(wire: Wire, start: int, *, req_framing: bool) -> list[tuple[int, bytes]]:
    """Ask for a replay from `start`; returns (seq, payload) up to and including the end marker."""
    dealer = wire.ctx.socket(zmq.DEALER)
    dealer.connect(wire.replay_endpoint)
    envelope = [b""] if req_framing else []
    try:
        await dealer.send_multipart([*envelope, start.to_bytes(8, "big")])
        replies = []
        while True:
            frames = await asyncio.wait_for(dealer.recv_multipart(), 2.0)
            assert frames[: len(envelope)] == envelope and len(frames) == len(envelope) + 2
            seq_bytes, payload = frames[len(envelope) :]
            replies.append((int.from_bytes(seq_bytes, "big", signed=True), payload))
            if seq_bytes == END_MARKER:
                return replies
    finally:
        dealer.close(linger=0)


@pytest.mark.parametrize("req_framing", [True, False])
async def test_replay_returns_buffered_batches_then_the_end_marker(wire: Wire, req_framing: bool) -> None:
    for n in range(5):
        wire.publish(BlockRemoved((n,)))
    seqs = [(await wire.recv())[1] for _ in range(5)]
    replies = await _replay(wire, seqs[3], req_framing=req_framing)
    assert [seq for seq, _ in replies] == [seqs[3], seqs[4], -1] and replies[-1][1] == b""
    assert msgpack.unpackb(replies[0][1], raw=False)[1] == [["BlockRemoved", [3], "GPU"]]
    everything = await _replay(wire, 0, req_framing=req_framing)
    assert [seq for seq, _ in everything] == [*seqs[2:], -1]  # the ring keeps the last 3 batches


async def test_malformed_replay_requests_are_ignored(wire: Wire) -> None:
    dealer = wire.ctx.socket(zmq.DEALER)
    dealer.connect(wire.replay_endpoint)
    await dealer.send_multipart([b"short"])
    await dealer.send_multipart([b"x", b"y", b"z"])
    dealer.close(linger=0)
    wire.publish(BlockRemoved((9,)))
    seq = (await wire.recv())[1]
    assert [s for s, _ in await _replay(wire, seq, req_framing=False)] == [seq, -1]


async def test_subscribers_and_replays_are_counted(wire: Wire) -> None:
    async def counted(subscribers: int) -> bool:
        for _ in range(100):
            if wire.publisher.subscribers == subscribers:
                return True
            await asyncio.sleep(0.02)
        return False

    assert await counted(1)  # the wire's own SUB
    second = wire.ctx.socket(zmq.SUB)
    second.connect(wire.publisher_endpoint)
    assert await counted(2)
    second.close(linger=0)
    assert await counted(1)
    await _replay(wire, 0, req_framing=False)
    assert wire.publisher.replays == 1


def test_reset_prefix_cache_only_when_no_block_is_in_use() -> None:
    events: list[KVEvent] = []
    pool = BlockPool(2, block_size=2, on_event=events.append)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [21, 22], None, [1, 2, 3, 4])
    assert not pool.reset_prefix_cache() and pool.get_cached_block(21) is not None
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache()
    assert pool.cached == {} and all(b.block_hash is None for b in pool.blocks)
    assert events[-1] == AllBlocksCleared()
    pool.get_new_blocks(2)  # reusing a cleared block evicts nothing
    assert events[-1] == AllBlocksCleared()


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"kv_events_endpoint": "localhost:5557"}, "kv_events_endpoint must start with"),
        ({"kv_events_replay_endpoint": "tcp://*:5558"}, "needs kv_events_endpoint"),
        ({"kv_events_endpoint": "tcp://*:5557", "kv_events_encoding": "json"}, "kv_events_encoding"),
        ({"kv_events_endpoint": "tcp://*:5557", "kv_events_buffer_steps": 0}, "kv_events_buffer_steps"),
    ],
)
def test_kv_event_settings_are_checked(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_config(None, overrides)
