"""KV events: decoding every encoding vLLM has used, and the subscriber's certainty rules over real ZMQ sockets."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio

from gateway.config.pools import KVEventsConfig
from gateway.config.schema import build
from gateway.errors import ConfigError
from gateway.index.kv_events.decode import Cleared, DecodeError, EngineHash, Removed, Stored, decode_batch
from gateway.index.kv_events.subscriber import KVEventSubscriber
from lab.cluster import free_port

pytestmark = pytest.mark.timeout(30)

_END = (-1).to_bytes(8, "big", signed=True)
H1, H2 = 0xFFFF_FFFF_FFFF_FFF0, 7  # uint64 hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)
D1, D2 = b"\x01" * 32, b"\x02" * 32  # raw digests


def stored(*hashes: EngineHash, parent: EngineHash | None = None, medium: str | None = "GPU") -> list[Any]:
    return ["BlockStored", list(hashes), parent, list(range(4 * len(hashes))), 4, None, medium]


def removed(*hashes: EngineHash) -> list[Any]:
    return ["BlockRemoved", list(hashes), "GPU"]


# --- decoding -------------------------------------------------------------------------------


def test_array_batch_with_array_events_and_int_hashes() -> None:
    payload = msgpack.packb([1.5, [stored(H1, H2, parent=3), removed(H2), ["AllBlocksCleared"]], None])
    assert decode_batch(payload) == [
        Stored((H1, H2), 3, tuple(range(8)), 4),
        Removed((H2,)),
        Cleared(),
    ]


def test_map_batch_with_map_events_bytes_hashes_and_extra_fields() -> None:
    events = [
        {
            "type": "BlockStored",
            "block_hashes": [D1],
            "parent_block_hash": None,
            "token_ids": [1, 2],
            "block_size": 2,
            "lora_name": None,
            "group_idx": 0,
            "some_future_field": {"x": 1},
        },
        {"type": "BlockRemoved", "block_hashes": [D1, D2], "medium": None},
        {"type": "AllBlocksCleared"},
    ]
    payload = msgpack.packb({"ts": 1.0, "events": events, "data_parallel_rank": 0})
    assert decode_batch(payload) == [Stored((D1,), None, (1, 2), 2), Removed((D1, D2)), Cleared()]


def test_array_batch_with_map_events_and_short_legacy_arrays() -> None:
    legacy = ["BlockStored", [H1], None, [1, 2, 3, 4], 4, None]  # ~v0.9: no medium field at all
    payload = msgpack.packb([1.0, [legacy, {"type": "BlockRemoved", "block_hashes": [H1]}, ["BlockRemoved", [H2]]]])
    assert decode_batch(payload) == [Stored((H1,), None, (1, 2, 3, 4), 4), Removed((H1,)), Removed((H2,))]


def test_unknown_types_and_offload_tiers_are_ignored() -> None:
    events = [
        ["BlockTransferred", [H1], "CPU", "GPU"],
        {"type": "SomethingNew", "x": 1},
        stored(H1, medium="CPU"),
        ["BlockRemoved", [H1], "CPU"],
        {"type": "AllBlocksCleared", "medium": "DISK"},
        stored(H2),
    ]
    assert decode_batch(msgpack.packb([1.0, events, None])) == [Stored((H2,), None, (0, 1, 2, 3), 4)]


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1garbage",
        b"",
        msgpack.packb("just a string"),
        msgpack.packb([1.0, "not a list"]),
        msgpack.packb([1.0, [["BlockStored", "not hashes", None, [], 4]]]),
        msgpack.packb([1.0, [["BlockStored", [1.5], None, [], 4]]]),
        msgpack.packb([1.0, [["BlockStored", [1], None, ["a"], 4]]]),
        msgpack.packb([1.0, [["BlockStored", [1], None, [1], 0]]]),
        msgpack.packb([1.0, [[3, [1]]]]),
        msgpack.packb([1.0, [42]]),
    ],
)
def test_malformed_batches_raise_decode_error(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_batch(payload)


def test_config_validation() -> None:
    config = build(
        KVEventsConfig,
        {"endpoint": "tcp://10.0.0.5:5557", "replay_endpoint": "tcp://10.0.0.5:5558", "topic": "kv-events"},
        "pools.m.replicas[0].kv_events",
    )
    assert config.topic == "kv-events"
    with pytest.raises(ConfigError) as err:
        build(KVEventsConfig, {"endpoint": "http://10.0.0.5:5557"}, "r.kv_events")
    assert err.value.key == "r.kv_events.endpoint"
    with pytest.raises(ConfigError) as err:
        build(KVEventsConfig, {"endpoint": "ipc:///tmp/kv", "replay_endpoint": "tcp://*:5558"}, "r.kv_events")
    assert err.value.key == "r.kv_events.replay_endpoint"


# --- over ZMQ -------------------------------------------------------------------------------


class FakePublisher:
    """vLLM's ZmqEventPublisher in miniature: PUB with seqs, a ring buffer, and the ROUTER replay protocol."""

    def __init__(self, ctx: zmq.asyncio.Context, *, topic: bytes = b"kv-events", buffer: int = 100) -> None:
        self.topic, self.seq, self.buffer = topic, 0, deque[tuple[int, bytes]](maxlen=buffer)
        self.replay_delay_s = 0.0  # a slow replay lets live batches queue up meanwhile
        self.endpoint, self.replay_endpoint = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        self.pub, self.router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
        self.pub.bind(self.endpoint)
        self.router.bind(self.replay_endpoint)
        self.task = asyncio.create_task(self._serve_replay())

    async def publish(self, *events: Any, send: bool = True, raw: bytes | None = None) -> int:
        """Buffer one batch; `send=False` loses it on the wire (it stays replayable)."""
        seq, self.seq = self.seq, self.seq + 1
        payload = raw if raw is not None else msgpack.packb([time.time(), list(events), None])
        self.buffer.append((seq, payload))
        if send:
            await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def restart(self) -> None:
        """A new engine process on the same endpoints: seqs from 0, empty buffer."""
        self.seq = 0
        self.buffer.clear()

    async def _serve_replay(self) -> None:
        while True:
            client, _, start = await self.router.recv_multipart()
            await asyncio.sleep(self.replay_delay_s)
            for seq, payload in list(self.buffer):
                if seq >= int.from_bytes(start, "big"):
                    await self.router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            await self.router.send_multipart([client, b"", _END, b""])

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.pub.close(linger=0)
        self.router.close(linger=0)


class RecordingSink:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.certain = False

    def stored(
        self,
        replica_id: str,
        block_hashes: Sequence[EngineHash],
        parent: EngineHash | None,
        token_ids: Sequence[int],
        block_size: int,
        lora_id: int | None = None,
        lora_name: str | None = None,
    ) -> None:
        self.calls.append(("stored", replica_id, tuple(block_hashes), parent))

    def removed(self, replica_id: str, block_hashes: Sequence[EngineHash]) -> None:
        self.calls.append(("removed", replica_id, tuple(block_hashes)))

    def cleared(self, replica_id: str) -> None:
        self.calls.append(("cleared", replica_id))

    def set_certain(self, replica_id: str, certain: bool) -> None:
        self.certain = certain


async def until(check: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.fixture
async def publisher() -> Any:
    ctx = zmq.asyncio.Context()
    pub = FakePublisher(ctx)
    yield pub
    await pub.close()
    ctx.destroy(linger=0)


async def subscribe(
    pub: FakePublisher, *, replay: bool = True, topic: str = "kv"
) -> tuple[KVEventSubscriber, RecordingSink]:
    """A started subscriber past its start-up sync and (slow joiner) connected for live batches."""
    sink = RecordingSink()
    config = KVEventsConfig(endpoint=pub.endpoint, replay_endpoint=pub.replay_endpoint if replay else None, topic=topic)
    sub = KVEventSubscriber("r1", config, sink, replay_timeout_s=0.5)
    sub.start()
    await until(lambda: bool(sink.calls))  # the start-up `cleared`, after which the replay (if any) is applied
    await asyncio.sleep(0.3)
    return sub, sink


async def test_initial_replay_from_zero_makes_the_table_certain_then_live_batches_follow(
    publisher: FakePublisher,
) -> None:
    await publisher.publish(stored(H1, H2))
    await publisher.publish(removed(H2), stored(D1, parent=H1))
    sub, sink = await subscribe(publisher)
    try:
        assert sink.certain and sub.last_seq == 1 and sub.replays == 1
        await publisher.publish(["AllBlocksCleared"], stored(H2))
        await until(lambda: sub.last_seq == 2)
        assert sink.calls == [
            ("cleared", "r1"),
            ("stored", "r1", (H1, H2), None),
            ("removed", "r1", (H2,)),
            ("stored", "r1", (D1,), H1),
            ("cleared", "r1"),
            ("stored", "r1", (H2,), None),
        ]
        assert sink.certain and sub.describe() | {"endpoint": "-", "replay_endpoint": "-"} == {
            "endpoint": "-",
            "replay_endpoint": "-",
            "certain": True,
            "last_seq": 2,
            "batches": 3,
            "gaps": 0,
            "replays": 1,
            "replay_failures": 0,
            "resets": 0,
            "duplicates": 0,
            "decode_errors": 0,
            "paced_s": 0.0,
        }
    finally:
        await sub.close()


async def test_a_skipped_seq_is_recovered_from_the_replay_buffer_in_order(publisher: FakePublisher) -> None:
    sub, sink = await subscribe(publisher)
    try:
        for i in range(3):
            await publisher.publish(stored(i))
        await publisher.publish(removed(1), send=False)  # seq 3 never arrives live
        await publisher.publish(stored(4))
        await until(lambda: sub.last_seq == 4)
        assert [c[0] for c in sink.calls] == ["cleared", "stored", "stored", "stored", "removed", "stored"]
        assert sink.calls[4] == ("removed", "r1", (1,))
        assert sink.certain and sub.gaps == 1 and sub.replays == 2 and sub.resets == 0
    finally:
        await sub.close()


async def test_live_batches_that_queue_up_during_a_replay_are_applied_once(publisher: FakePublisher) -> None:
    sub, sink = await subscribe(publisher)
    try:
        await publisher.publish(stored(0))
        await publisher.publish(stored(1), send=False)
        publisher.replay_delay_s = 0.3
        await publisher.publish(stored(2))  # the gap: a replay starts and takes a while
        await asyncio.sleep(0.1)
        await publisher.publish(stored(3))  # live while the replay runs, and in the replay too
        await publisher.publish(stored(4))
        await until(lambda: sub.last_seq == 4)
        await asyncio.sleep(0.1)
        assert sink.calls == [("cleared", "r1")] + [("stored", "r1", (i,), None) for i in range(5)]
        assert sink.certain and sub.gaps == 1 and sub.resets == 0 and sub.duplicates == 3  # seqs 2, 3, 4
    finally:
        await sub.close()


async def test_a_gap_the_buffer_no_longer_holds_starts_over_uncertain() -> None:
    ctx = zmq.asyncio.Context()
    pub = FakePublisher(ctx, buffer=2)
    try:
        sub, sink = await subscribe(pub)
        await pub.publish(stored(0))
        await until(lambda: sub.last_seq == 0)
        assert sink.certain
        for i in (1, 2, 3):
            await pub.publish(stored(i), send=False)
        await pub.publish(stored(4))  # the buffer now holds seqs 3 and 4 only
        await until(lambda: sub.last_seq == 4)
        assert sink.calls == [
            ("cleared", "r1"),
            ("stored", "r1", (0,), None),
            ("cleared", "r1"),
            ("stored", "r1", (3,), None),
            ("stored", "r1", (4,), None),
        ]
        assert not sink.certain and sub.gaps == 1
        await sub.close()
    finally:
        await pub.close()
        ctx.destroy(linger=0)


async def test_a_publisher_restart_clears_the_table_and_the_new_history_is_certain(publisher: FakePublisher) -> None:
    sub, sink = await subscribe(publisher)
    try:
        await publisher.publish(stored(1))
        await publisher.publish(stored(2))
        await until(lambda: sub.last_seq == 1)
        publisher.restart()
        await publisher.publish(stored(9))
        await until(lambda: sub.resets == 1 and sub.last_seq == 0)
        assert sink.calls[-2:] == [("cleared", "r1"), ("stored", "r1", (9,), None)]
        assert sink.certain
        await publisher.publish(removed(9))
        await until(lambda: sub.last_seq == 1)
        assert sink.calls[-1] == ("removed", "r1", (9,)) and sink.certain
    finally:
        await sub.close()


async def test_without_replay_only_a_first_batch_at_seq_zero_is_certain(publisher: FakePublisher) -> None:
    sub, sink = await subscribe(publisher, replay=False)
    try:
        assert not sink.certain
        await publisher.publish(stored(1))
        await until(lambda: sub.last_seq == 0)
        assert sink.certain
        await publisher.publish(stored(2), send=False)
        await publisher.publish(stored(3))  # a gap nothing can fill: start over, uncertain
        await until(lambda: sub.last_seq == 2)
        assert sink.calls[-2:] == [("cleared", "r1"), ("stored", "r1", (3,), None)]
        assert not sink.certain and sub.replays == 0
    finally:
        await sub.close()


async def test_garbage_is_counted_not_raised_and_leaves_the_table_uncertain(publisher: FakePublisher) -> None:
    sub, sink = await subscribe(publisher)
    try:
        await publisher.publish(raw=b"\xc1 not msgpack")
        await publisher.publish(stored(5))
        await until(lambda: sub.last_seq == 1)
        assert sub.decode_errors == 1 and not sink.certain
        assert sink.calls[-1] == ("stored", "r1", (5,), None)
        assert not sub._task.done()  # type: ignore[union-attr]
    finally:
        await sub.close()


async def test_other_topics_are_filtered_out(publisher: FakePublisher) -> None:
    sub, sink = await subscribe(publisher, topic="kv-events-other")
    try:
        await publisher.publish(stored(1))
        await asyncio.sleep(0.2)
        assert sink.calls == [("cleared", "r1")] and sub.last_seq == -1  # synced on an empty buffer, nothing since
    finally:
        await sub.close()


async def test_close_returns_promptly_even_while_a_replay_waits() -> None:
    dead = f"tcp://127.0.0.1:{free_port()}"  # nothing listens: the replay request can only time out
    sub = KVEventSubscriber(
        "r1", KVEventsConfig(endpoint=dead, replay_endpoint=dead), RecordingSink(), replay_timeout_s=10.0
    )
    sub.start()
    await asyncio.sleep(0.1)
    began = time.monotonic()
    await sub.close()
    assert time.monotonic() - began < 0.5
